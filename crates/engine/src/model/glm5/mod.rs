//! GLM-5 (`GlmMoeDsaForCausalLM`, `model_type: glm_moe_dsa`) on the CPU: multi-head latent
//! attention (MLA, DeepSeek-V2 §2.1), DeepSeek sparse attention (DSA: a "lightning indexer"
//! scores every cached token for each query and attention reads only the top-k; DeepSeek-V3.2
//! tech report §2), and a Mixture-of-Experts MLP with sigmoid routing, a correction bias,
//! group-limited top-k and shared experts (DeepSeek-V3 §2.1.2).
//!
//! Semantics follow HF transformers `models/glm_moe_dsa` (built on `deepseek_v32` and
//! `deepseek_v3`); `scripts/goldens/reference_glm5.py` runs that implementation on our checkpoints to
//! produce the goldens of `sparrow-convert`'s `tests/it/glm5_golden.rs`. The layout follows candle's `deepseek2.rs`:
//!
//! - `config`: [`Glm5Config`], `config.json` with HF's defaults;
//! - `mla`: the absorbed MLA attention over the latent cache ([`AttnImpl`], defined in
//!   [`crate::config`]);
//! - `indexer`: the DSA indexer and its top-k;
//! - `moe`: the routing rule ([`route`]) and the dense-or-MoE feed-forward over the shared
//!   [`Moe`] and [`Mlp`] of [`crate::model::moe`] ([`MoeChoice`]; [`MoeImpl`] is defined in
//!   [`crate::config`]);
//! - `load`: building the model from a [`Checkpoint`](crate::checkpoint::hf::Checkpoint);
//! - here: the model, its decoder layer and the [`Model`] impl.
//!
//! One step: embed → for each layer { RMSNorm → MLA attention over the indexer's selection →
//! residual → RMSNorm → dense MLP or MoE → residual } → final RMSNorm and the LM head for the
//! `logits_rows` only.
//!
//! Each choice point has two implementations, selected like SGLang's flags and giving
//! bit-identical outputs: sparse or dense attention (`--nsa-prefill-backend`,
//! `--nsa-decode-backend`) and token- or expert-major MoE (`--moe-runner-backend`).

mod config;
pub mod deepseek;
mod indexer;
mod load;
mod mla;
mod moe;

use sparrow_cpu::format::ggml::QActs;
use sparrow_cpu::{kernels, Isa, ThreadPool, Weight};

pub use self::config::Glm5Config;
use self::indexer::Selection;
pub use self::load::GGUF_ARCH;
use self::mla::Mla;
pub use self::moe::route;
use self::moe::Ffn;
use super::common::{OutputHead, RopeLayout, RopeTable, Scratch};
use super::{AttentionNeeds, Instruments, Model, ModelInfo, PartTimes};
use crate::batch::ForwardBatch;
pub use crate::config::{AttnImpl, MoeImpl};
use crate::kv::{KvComponent, KvDtype, KvLayout, KvStore};
use crate::model::linear::Fwd;
pub use crate::model::moe::{Mlp, Moe, MoeBench, MoeChoice};
use crate::EngineError;

/// ε of `q_a_layernorm`, `kv_a_layernorm` and the indexer's `k_norm` (HF builds them without
/// passing `rms_norm_eps`).
const LORA_NORM_EPS: f32 = 1e-6;

/// RoPE on adjacent pairs: HF's GLM-5 hard-codes the interleaved form for MLA and the indexer
/// alike (`rope_interleave` / `indexer_rope_interleave` in config.json are ignored there too).
const ROPE_LAYOUT: RopeLayout = RopeLayout::Interleaved;

/// Run-time options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glm5Options {
    /// Attention for EXTEND rows.
    pub prefill_attn: AttnImpl,
    /// Attention for DECODE rows.
    pub decode_attn: AttnImpl,
    /// MoE implementation by batch size.
    pub moe: MoeChoice,
}

impl Default for Glm5Options {
    fn default() -> Self {
        Glm5Options {
            prefill_attn: AttnImpl::Sparse,
            decode_attn: AttnImpl::Sparse,
            moe: MoeChoice::Fixed(MoeImpl::ExpertMajor),
        }
    }
}

/// Counters of the attention work done (for the sparse-vs-dense comparison).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttnStats {
    /// (query, head, key) score products computed by attention.
    pub attn_keys: u64,
    /// (query, key) pairs scored by the indexer.
    pub indexer_keys: u64,
    /// Queries whose context was within top-k (indexer skipped).
    pub queries_dense: u64,
    /// Queries that took a top-k selection.
    pub queries_sparse: u64,
}

/// `y = rms_norm(x) · g` for every row of `x` (rows of `g.len()`), on the pool by rows.
fn par_norm(pool: &ThreadPool, x: &[f32], g: &[f32], eps: f32, y: &mut [f32]) {
    let w = g.len();
    pool.par_row_chunks(y, w, |r0, ys| kernels::rms_norm(&x[r0 * w..r0 * w + ys.len()], g, eps, ys));
}

/// `0..n` cut into runs of consecutive items, at most `max` each, a run ending where
/// `joins(first_of_run, i)` is false: the tasks of the indexer's and of MLA's scoring, which
/// share key blocks (or buffers) within a run.
fn runs(n: usize, max: usize, joins: impl Fn(usize, usize) -> bool) -> Vec<std::ops::Range<usize>> {
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    for i in 0..n {
        match out.last_mut() {
            Some(r) if r.len() < max && joins(r.start, i) => r.end = i + 1,
            _ => out.push(i..i + 1),
        }
    }
    out
}

/// One decoder layer (`model.layers.L`).
struct DecoderLayer {
    input_ln: Vec<f32>,
    attn: Mla,
    post_ln: Vec<f32>,
    ffn: Ffn,
}

impl DecoderLayer {
    /// Layer `l` on the step's hidden states `x` (`[tokens × hidden]`), in place; `sel` is the
    /// selection of the last `full` indexer layer, replaced when this layer runs its own.
    fn forward(&self, s: &Step<'_>, l: usize, x: &mut [f32], kv: &mut KvStore, sel: &mut Selection, w: &mut Work<'_>) {
        let (eps, hd) = (s.cfg.rms_eps, s.cfg.hidden);
        // Written whole by the norms.
        let mut h = w.bufs.take(x.len());
        // Row by row on the pool: each row's arithmetic is the same on any thread.
        par_norm(s.pool, x, &self.input_ln, eps, &mut h);
        let attn = self.attn.forward(s, l, &h, kv, sel, w);
        s.pool.par_row_chunks(x, hd, |r0, xs| xs.iter_mut().zip(&attn[r0 * hd..]).for_each(|(x, p)| *x += p));
        par_norm(s.pool, x, &self.post_ln, eps, &mut h);
        let ffn = self.ffn.forward(s, &h, w);
        s.pool.par_row_chunks(x, hd, |r0, xs| xs.iter_mut().zip(&ffn[r0 * hd..]).for_each(|(x, p)| *x += p));
        for b in [h, attn, ffn] {
            w.bufs.give(b);
        }
    }
}

/// What every part of one forward reads: the batch, facts about its rows, the model's
/// settings.
struct Step<'a> {
    cfg: &'a Glm5Config,
    opts: &'a Glm5Options,
    batch: &'a ForwardBatch,
    pool: &'a ThreadPool,
    isa: Isa,
    rope: &'a RopeTable,
    /// Per row: its sequence's index in the batch.
    row_seq: Vec<u32>,
    /// Per row: whether it is a DECODE row (one new token after a cached prefix).
    row_decode: Vec<bool>,
}

impl Step<'_> {
    /// The attention implementation of row `t`.
    fn attn_impl(&self, t: usize) -> AttnImpl {
        if self.row_decode[t] {
            self.opts.decode_attn
        } else {
            self.opts.prefill_attn
        }
    }
}

/// What one forward carries besides the activations and the cache: the model layer's forward
/// context and GLM-5's own scratch and counters.
struct Work<'a> {
    /// Pool, ISA, the matmuls' scratch, observer, part times.
    cx: Fwd<'a>,
    /// Activation buffers kept across forwards.
    bufs: Scratch,
    stats: AttnStats,
}

/// A loaded GLM-5 model.
pub struct Glm5Model {
    cfg: Glm5Config,
    info: ModelInfo,
    opts: Glm5Options,
    embed: Weight,
    lm_head: Option<Weight>,
    norm: Vec<f32>,
    layers: Vec<DecoderLayer>,
    /// RoPE angles of the rotary width for every position.
    rope: RopeTable,
    pool: ThreadPool,
    isa: Isa,
    xq: QActs,
    bufs: Scratch,
    stats: AttnStats,
    /// Calibration observer and profile: every [`Linear`](crate::model::linear::Linear), the
    /// router and the LM head count as `gemm`, the indexer's scoring and top-k as `indexer`, MLA's scores
    /// and latent sums (with `W_UV`) as `attention`; norms, RoPE, SwiGLU, routing and the
    /// MoE combine are the rest.
    inst: Instruments,
}

impl std::fmt::Debug for Glm5Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Glm5Model").field("cfg", &self.cfg).field("opts", &self.opts).finish()
    }
}

impl Glm5Model {
    /// The hyper-parameters.
    pub fn config(&self) -> &Glm5Config {
        &self.cfg
    }

    /// The instruction set in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Current options.
    pub fn options(&self) -> &Glm5Options {
        &self.opts
    }

    /// Replaces the options (backends, MoE choice).
    pub fn set_options(&mut self, opts: Glm5Options) {
        self.opts = opts;
    }

    /// Attention work counters since load.
    pub fn attn_stats(&self) -> AttnStats {
        self.stats
    }

    /// The thread pool.
    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }
}

impl Model for Glm5Model {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn instruments(&self) -> Option<&Instruments> {
        Some(&self.inst)
    }

    fn instruments_mut(&mut self) -> Option<&mut Instruments> {
        Some(&mut self.inst)
    }

    fn first_moe(&self) -> Option<MoeBench<'_>> {
        let moe = self.layers.iter().find_map(|l| match &l.ffn {
            Ffn::Moe(m) => Some(m),
            Ffn::Dense(_) => None,
        })?;
        Some(MoeBench { moe, pool: &self.pool, isa: self.isa })
    }

    fn set_moe(&mut self, choice: MoeChoice) {
        self.opts.moe = choice;
    }

    fn attention_needs(&self) -> AttentionNeeds {
        let c = &self.cfg;
        AttentionNeeds {
            kind: if c.has_indexer() { "mla+dsa" } else { "mla" },
            kv_layout: KvLayout {
                layers: c.layers,
                components: if c.has_indexer() {
                    vec![
                        KvComponent { name: "latent", width: c.kv_lora_rank + c.qk_rope },
                        KvComponent { name: "index_k", width: c.idx_dim },
                    ]
                } else {
                    vec![KvComponent { name: "latent", width: c.kv_lora_rank + c.qk_rope }]
                },
                dtype: KvDtype::F32,
            },
            sliding_window: false,
        }
    }

    fn forward(&mut self, batch: &ForwardBatch, kv: &mut KvStore) -> Result<Vec<f32>, EngineError> {
        let c = &self.cfg;
        let t_n = batch.num_tokens();
        let h = c.hidden;
        if let Some(&p) = batch.positions.iter().max() {
            if p as usize >= c.max_positions {
                return Err(EngineError::model(format!("position {p} beyond the context length {}", c.max_positions)));
            }
        }
        let mut row_seq = Vec::with_capacity(t_n);
        let mut row_decode = Vec::with_capacity(t_n);
        for (i, sq) in batch.seqs.iter().enumerate() {
            row_seq.extend(std::iter::repeat_n(i as u32, sq.extend_len as usize));
            let dec = sq.extend_len == 1 && sq.prefix_len > 0;
            row_decode.extend(std::iter::repeat_n(dec, sq.extend_len as usize));
        }
        let mut x = vec![0f32; t_n * h];
        for (t, &id) in batch.input_ids.iter().enumerate() {
            if id as usize >= c.vocab {
                return Err(EngineError::model(format!("token id {id} outside the vocabulary ({})", c.vocab)));
            }
            self.embed.row_f32(id as usize, &mut x[t * h..(t + 1) * h]);
        }
        let s = Step {
            cfg: c,
            opts: &self.opts,
            batch,
            pool: &self.pool,
            isa: self.isa,
            rope: &self.rope,
            row_seq,
            row_decode,
        };
        let clock = self.inst.clock();
        let mut pt = PartTimes::default();
        let cx = Fwd {
            pool: &self.pool,
            isa: self.isa,
            xq: std::mem::take(&mut self.xq),
            observer: &mut self.inst.observer,
            parts: clock.is_some().then_some(&mut pt),
        };
        let mut w = Work { cx, bufs: std::mem::take(&mut self.bufs), stats: self.stats };
        let mut sel: Selection = vec![None; t_n];
        for (l, layer) in self.layers.iter().enumerate() {
            layer.forward(&s, l, &mut x, kv, &mut sel, &mut w);
        }
        let head =
            OutputHead { norm: &self.norm, eps: c.rms_eps, weight: self.lm_head.as_ref().unwrap_or(&self.embed) };
        let logits = head.logits(&mut w.cx, &x, &batch.logits_rows);
        self.stats = w.stats;
        self.xq = w.cx.xq;
        self.bufs = w.bufs;
        self.inst.record(clock, pt);
        Ok(logits)
    }
}
