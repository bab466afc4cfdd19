//! Llama-family decoder (Touvron et al. 2023) loaded from GGUF or a Hugging Face directory
//! (BF16/F32 or ModelOpt NVFP4), run on the CPU over the paged KV cache; every other decoder
//! family on this layer (Qwen2/2.5, Qwen3, SmolLM3, Phi-3, Gemma 3, Granite, Mistral 3 and the
//! MoE families) is data: a [`Family`](crate::model::family::Family) in its row of [`crate::model::arch`], turned with
//! the file's hyper-parameters into the model's [`Variant`] ([`LlamaConfig::from_hparams`]).
//!
//! Tensor names and metadata keys follow llama.cpp's `llama` architecture (`src/llama-model.cpp`):
//! `token_embd`, `blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate,
//! ffn_up, ffn_down}`, `output_norm`, `output` (absent when tied to `token_embd`), and
//! `llama.{block_count, embedding_length, feed_forward_length, attention.head_count,
//! attention.head_count_kv, rope.freq_base, attention.layer_norm_rms_epsilon, context_length}`.
//! A `llama` GGUF stores Q and K permuted so that RoPE rotates adjacent pairs
//! `(x[2i], x[2i+1])` (llama.cpp's `LLAMA_ROPE_TYPE_NORM`); Qwen files and HF checkpoints keep
//! halves (`NEOX`, `rotate_half`); we rotate each as it is stored.
//!
//! One step: embed → for each layer { RMSNorm → fused QKV → RoPE → write K,V to their slots →
//! causal attention over each sequence's slot list (`kernels::flash_attend`: tasks of one KV
//! group × a query block of up to 32 tokens, longest first) → output projection + residual → RMSNorm →
//! fused gate/up → SwiGLU → down + residual } → final RMSNorm and the output head for the
//! `logits_rows` only. Loading is in `load.rs`. The hybrid families swap a layer's attention for
//! a recurrent mixer over the request's state (`delta.rs`: Gated DeltaNet; `mamba.rs`: Mamba-2),
//! and Nemotron-H's layers have a mixer or a feed-forward, not both (`Layer`).

use super::common::{OutputHead, RopeLayout, RopeScaling, RopeTable, Scratch};
use super::hparams::{AttnTemperature, LinearAttnParams};
use super::moe::{Glu, Mlp, Moe, MoeBench, MoeChoice, MoeConfig};
use super::{AttentionNeeds, Instruments, Model, ModelInfo, PartTimes};
use crate::batch::ForwardBatch;
use crate::config::MoeImpl;
use crate::kv::{KvDtype, KvLayout, KvStore};
use crate::model::linear::Fwd;
use crate::EngineError;
use sparrow_cpu::format::ggml::QActs;
use sparrow_cpu::kernels;
use sparrow_cpu::Isa;
use sparrow_cpu::ThreadPool;
use sparrow_cpu::Weight;

mod attention;
mod config;
mod conv;
mod delta;
pub mod load;
mod mamba;

pub(crate) use attention::Attention;
use attention::{attention_tasks, AttnTask};
pub(crate) use delta::DeltaNet;
pub(crate) use mamba::Mamba2;

/// What a family changes in the Llama decoder, per model (built from the family's row and the
/// file's hyper-parameters by [`LlamaConfig::from_hparams`]); [`Variant::llama`] is plain Llama.
#[derive(Debug, Clone)]
pub struct Variant {
    /// The dense MLP's activation.
    pub act: Glu,
    /// Factor on the embedding rows (Gemma: √hidden, rounded to f32).
    pub embed_scale: f32,
    /// Attention score scale.
    pub attn_scale: f32,
    /// Which values of a head RoPE rotates together (Llama GGUF: adjacent pairs; Gemma:
    /// halves, llama.cpp's NEOX).
    pub rope_layout: RopeLayout,
    /// Per layer: the sliding window (keys a query sees, itself included) or `None` for
    /// global attention.
    pub windows: Vec<Option<usize>>,
    /// RoPE base of the sliding-window layers.
    pub rope_local_base: f32,
    /// Per-head RMSNorm of Q and K before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// Llama 3's RoPE scaling as llama.cpp applies it: pair `i`'s angle is divided by factor
    /// `i` (the `rope_freqs` tensor, `head_dim / 2` values, computed by the converter from
    /// `rope_scaling = {rope_type: llama3, factor, low_freq_factor, high_freq_factor,
    /// original_max_position_embeddings}`).
    pub rope_freq_factors: Option<Vec<f32>>,
    /// RMSNorm of the attention and MLP outputs before the residual add
    /// (`post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// Per layer: whether it skips RoPE (SmolLM3's NoPE layers); Q and K go into attention
    /// unrotated there.
    pub no_rope: Vec<bool>,
    /// Values of each head RoPE rotates, the first ones (`head_dim` unless partial: Phi-4-mini
    /// 96 of 128, `rope.dimension_count`).
    pub rope_dims: usize,
    /// Factor on RoPE's cosines and sines (LongRoPE's attention factor, 1 otherwise).
    pub rope_attn_factor: f32,
    /// YaRN or linear RoPE scaling (`rope.scaling.type`), on every layer.
    pub rope_scaling: Option<RopeScaling>,
    /// Factor on each block's output before its residual add (Granite's `residual_scale`).
    pub residual_scale: f32,
    /// Divisor of the logits (Granite's `logit_scale`).
    pub logit_scale: f32,
    /// Llama 4's attention temperature on the queries (Mistral 3).
    pub attn_temperature: Option<AttnTemperature>,
    /// Qwen3-Next's output-gated attention ([`crate::model::family::Family::attn_gate`]).
    pub attn_gate: bool,
    /// Added to every RMSNorm weight as it is read (1 for a zero-centred HF checkpoint,
    /// [`crate::model::family::Family::hf_norm_plus_one`]; 0 otherwise).
    pub norm_offset: f32,
}

impl Default for Variant {
    /// Plain Llama with no layers: SwiGLU, unit scales, adjacent-pair RoPE (the per-layer
    /// lists and the widths are filled by whoever sizes the model).
    fn default() -> Variant {
        Variant {
            act: Glu::Silu,
            embed_scale: 1.0,
            attn_scale: 1.0,
            rope_layout: RopeLayout::Interleaved,
            windows: Vec::new(),
            rope_local_base: 10_000.0,
            qk_norm: false,
            rope_freq_factors: None,
            post_norms: false,
            no_rope: Vec::new(),
            rope_dims: 0,
            rope_attn_factor: 1.0,
            rope_scaling: None,
            residual_scale: 1.0,
            logit_scale: 1.0,
            attn_temperature: None,
            attn_gate: false,
            norm_offset: 0.0,
        }
    }
}

impl Variant {
    /// Llama: SwiGLU, `1/√head_dim`, adjacent-pair RoPE, global attention everywhere.
    pub fn llama(layers: usize, head_dim: usize, rope_base: f32) -> Variant {
        Variant {
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            windows: vec![None; layers],
            rope_local_base: rope_base,
            no_rope: vec![false; layers],
            rope_dims: head_dim,
            ..Variant::default()
        }
    }
}

/// Hyper-parameters read from GGUF metadata.
#[derive(Debug, Clone)]
pub struct LlamaConfig {
    /// Decoder layers.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// MLP inner size.
    pub ffn: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (GQA).
    pub kv_heads: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// RoPE base θ.
    pub rope_base: f32,
    /// RMSNorm ε.
    pub rms_eps: f32,
    /// Vocabulary size.
    pub vocab: usize,
    /// Trained context length.
    pub context_length: usize,
    /// The family's changes to Llama.
    pub variant: Variant,
    /// The Mixture-of-Experts feed-forward of a MoE family (`qwen3moe`, `glm4moe`); `None` for
    /// a dense model.
    pub moe: Option<MoeConfig>,
    /// The recurrent layers of a hybrid family (`qwen35`, `nemotron_h`): which layers are
    /// recurrent (and, for Nemotron-H, which are MLP blocks) and their widths; `None` when every
    /// layer attends.
    pub linear_attn: Option<LinearAttnParams>,
    /// What the family's recurrent layers are and how its GGUF files lay them out.
    pub recurrent: Option<crate::model::family::RecurrentMixer>,
}

impl LlamaConfig {
    /// Width of all query heads together (`hidden` for Llama; Gemma 3 270M: 4 × 256 ≠ 640,
    /// Qwen3-4B: 32 × 128 ≠ 2560).
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Rejects inconsistent head counts (from either file format).
    pub(crate) fn check(&self) -> Result<(), EngineError> {
        let (h, kv) = (self.heads, self.kv_heads);
        if h == 0
            || kv == 0
            || h % kv != 0
            || !self.head_dim.is_multiple_of(2)
            || self.variant.windows.len() != self.layers
            || self.variant.no_rope.len() != self.layers
            || self.variant.rope_dims > self.head_dim
            || !self.variant.rope_dims.is_multiple_of(2)
            || self.variant.rope_freq_factors.as_ref().is_some_and(|f| f.len() != self.variant.rope_dims / 2)
        {
            return Err(EngineError::model(format!(
                "inconsistent heads: {h} heads of {}, {kv} KV heads, hidden {}",
                self.head_dim, self.hidden
            )));
        }
        if let Some(m) = &self.moe {
            m.check()?;
        }
        Ok(())
    }
}

/// One decoder layer: `x += mixer(norm(x))`, then `x += ffn(ffn_norm(x))`; a Nemotron-H block
/// has only one of the two, under `attn_norm`.
pub(crate) struct Layer {
    /// The norm of the layer's first block's input.
    pub(crate) attn_norm: Vec<f32>,
    /// What mixes the tokens: self-attention, or a hybrid model's recurrent layer; `None` for
    /// an MLP-only block.
    pub(crate) mixer: Option<Mixer>,
    /// The feed-forward's input norm (empty without a mixer: `attn_norm` is the block's).
    pub(crate) ffn_norm: Vec<f32>,
    /// `None` for a block that only mixes tokens.
    pub(crate) ffn: Option<FeedForward>,
    /// Norms of the attention and MLP outputs, with [`Variant::post_norms`].
    pub(crate) post_norms: Option<(Vec<f32>, Vec<f32>)>,
}

/// A layer's token mixer.
// One per layer, built once: the attention variant stays inline.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Mixer {
    /// Self-attention over the paged KV cache.
    Attention(Attention),
    /// A Gated DeltaNet layer over the request's recurrent state ([`DeltaNet`]).
    DeltaNet(Box<DeltaNet>),
    /// A Mamba-2 layer over the request's recurrent state ([`Mamba2`]).
    Mamba2(Box<Mamba2>),
}

impl Mixer {
    /// The recurrent state of one request in this layer, `(window, matrix state)` in f32
    /// values; `None` for attention.
    fn state_lens(&self) -> Option<(usize, usize)> {
        match self {
            Mixer::Attention(_) => None,
            Mixer::DeltaNet(d) => Some((d.conv_state_len(), d.ssm_state_len())),
            Mixer::Mamba2(m) => Some((m.conv_state_len(), m.ssm_state_len())),
        }
    }
}

/// A layer's feed-forward.
// One per layer, built once and never moved on a hot path: the dense variant stays inline.
#[allow(clippy::large_enum_variant)]
pub(crate) enum FeedForward {
    /// The gated MLP ([`Mlp`]: gate and up stacked, then down).
    Dense(Mlp),
    /// Routed (and shared) experts ([`crate::model::moe`]).
    Moe(Box<Moe>),
}

#[derive(Default)]
struct LayerBuffers {
    x: Vec<f32>,
    h: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gu: Vec<f32>,
    act: Vec<f32>,
    /// The matmuls' activation scratch, parked here between forwards (a forward's [`Fwd`]
    /// holds it).
    xq: QActs,
    /// A normalized block output (post-norm families).
    post: Vec<f32>,
    row_seq: Vec<u32>,
    /// Attention output in task order (see `attention_tasks`), before it is scattered to `attn`.
    attn_t: Vec<f32>,
    /// The MoE layers' activation buffers.
    moe: Scratch,
    /// The recurrent layers' buffers.
    delta: delta::Scratch,
}

/// A loaded Llama model.
pub struct LlamaModel {
    cfg: LlamaConfig,
    info: ModelInfo,
    embed: Weight,
    output: Option<Weight>,
    output_norm: Vec<f32>,
    layers: Vec<Layer>,
    /// RoPE angles for `pos < context_length`.
    rope: RopeTable,
    /// The sliding-window layers' table, when their base differs.
    rope_local: Option<RopeTable>,
    pool: ThreadPool,
    isa: Isa,
    s: LayerBuffers,
    /// Calibration observer and profile.
    inst: Instruments,
    /// Element type of the KV cache (f16 unless [`Model::set_kv_dtype`] chose another).
    kv_dtype: KvDtype,
    /// Which MoE implementation runs a batch of a given size (MoE families).
    moe: MoeChoice,
    /// Forward returns the final-normed hidden state of `logits_rows` instead of logits
    /// ([`Model::set_embedding`]).
    embedding: bool,
}

impl std::fmt::Debug for LlamaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaModel").field("cfg", &self.cfg).field("isa", &self.isa).finish()
    }
}

/// On the pool by token rows of the residual stream `x` (`[tokens, h]`): `x += scale · proj`
/// (when given; Granite's residual multiplier, 1 elsewhere), then `y = rms_norm(x) · g` (when
/// given). Each row's arithmetic is the same on whichever thread runs it.
#[allow(clippy::too_many_arguments)]
fn add_norm(
    pool: &ThreadPool,
    h: usize,
    x: &mut [f32],
    proj: Option<&[f32]>,
    scale: f32,
    g: Option<&[f32]>,
    eps: f32,
    y: &mut [f32],
) {
    pool.par_row_chunks2(x, h, y, h, |r0, x, y| {
        match (proj, scale == 1.0) {
            (Some(p), true) => x.iter_mut().zip(&p[r0 * h..]).for_each(|(x, p)| *x += p),
            (Some(p), false) => x.iter_mut().zip(&p[r0 * h..]).for_each(|(x, p)| *x += scale * p),
            (None, _) => {}
        }
        if let Some(g) = g {
            kernels::rms_norm(x, g, eps, y);
        }
    });
}

impl LlamaModel {
    /// The matrices a decode step multiplies, in order, named `blk.{l}.{qkv,wo,gate_up,down}`
    /// then `lm_head`: for kernel benchmarks and the roofline.
    pub fn decode_matrices(&self) -> Vec<(String, &Weight)> {
        let mut v = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            let mixer = match &l.mixer {
                Some(Mixer::Attention(a)) => vec![("qkv", &a.qkv), ("wo", &a.wo)],
                Some(Mixer::DeltaNet(d)) => vec![("in_proj", &d.in_proj), ("out_proj", &d.out_proj)],
                Some(Mixer::Mamba2(m)) => vec![("in_proj", &m.in_proj), ("out_proj", &m.out_proj)],
                None => Vec::new(),
            };
            for (n, w) in mixer {
                v.push((format!("blk.{i}.{n}"), &w.weight));
            }
            match &l.ffn {
                Some(FeedForward::Dense(m)) => {
                    v.push((format!("blk.{i}.gate_up"), &m.gate_up.weight));
                    v.push((format!("blk.{i}.down"), &m.down.weight));
                }
                Some(FeedForward::Moe(m)) => {
                    for (e, x) in m.experts.iter().enumerate() {
                        v.push((format!("blk.{i}.exp{e}.gate_up"), &x.gate_up.weight));
                        v.push((format!("blk.{i}.exp{e}.down"), &x.down.weight));
                    }
                }
                None => {}
            }
        }
        v.push(("lm_head".into(), self.output.as_ref().unwrap_or(&self.embed)));
        v
    }

    /// The model's compute pool and instruction set.
    pub fn pool_isa(&self) -> (&ThreadPool, Isa) {
        (&self.pool, self.isa)
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// The instruction set in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Forces an instruction set (tests compare the SIMD path against the scalar one).
    pub fn set_isa(&mut self, isa: Isa) {
        self.isa = isa;
    }
}

impl Model for LlamaModel {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn instruments(&self) -> Option<&Instruments> {
        Some(&self.inst)
    }

    fn instruments_mut(&mut self) -> Option<&mut Instruments> {
        Some(&mut self.inst)
    }

    fn attention_needs(&self) -> AttentionNeeds {
        // f16 K/V by default, as llama.cpp keeps them: half the memory and attention bandwidth;
        // `set_kv_dtype` chooses another.
        let kv_layers = self.layers.iter().filter(|l| matches!(l.mixer, Some(Mixer::Attention(_)))).count();
        AttentionNeeds {
            kind: "gqa",
            kv_layout: KvLayout::gqa(kv_layers, self.cfg.kv_heads, self.cfg.head_dim).with_dtype(self.kv_dtype),
            sliding_window: self.cfg.variant.windows.iter().any(Option::is_some),
        }
    }

    fn state_layout(&self) -> Option<crate::kv::StateLayout> {
        let mut lens = self.layers.iter().filter_map(|l| l.mixer.as_ref()?.state_lens());
        let (conv, ssm) = lens.next()?;
        Some(crate::kv::StateLayout { layers: 1 + lens.count(), conv, ssm })
    }

    fn set_embedding(&mut self) -> Result<super::EmbeddingSpec, EngineError> {
        // A causal decoder's last token is the only one that has seen the whole input
        // (Qwen3-Embedding, E5-Mistral, GTE-Qwen: last-token pooling of the final norm's output).
        self.embedding = true;
        Ok(super::EmbeddingSpec { dim: self.cfg.hidden, pooling: super::Pooling::Last, labels: false })
    }

    fn first_moe(&self) -> Option<MoeBench<'_>> {
        let moe = self.layers.iter().find_map(|l| match &l.ffn {
            Some(FeedForward::Moe(m)) => Some(&**m),
            _ => None,
        })?;
        Some(MoeBench { moe, pool: &self.pool, isa: self.isa })
    }

    fn set_moe(&mut self, choice: MoeChoice) {
        self.moe = choice;
    }

    fn set_kv_dtype(&mut self, dtype: KvDtype) -> Result<(), EngineError> {
        // The element types the attention kernels read (`kernels::KvElem`) and the forward
        // writes; f32 only for a model built that way.
        if dtype == KvDtype::F32 {
            return Err(EngineError::Incompatible("the Llama forward keeps no f32 KV cache".into()));
        }
        self.kv_dtype = dtype;
        Ok(())
    }

    fn forward(&mut self, batch: &ForwardBatch, kv: &mut KvStore) -> Result<Vec<f32>, EngineError> {
        let c = &self.cfg;
        let h = c.hidden;
        if let Some(&p) = batch.positions.iter().max() {
            if p as usize >= c.context_length {
                return Err(EngineError::model(format!("position {p} beyond the context length {}", c.context_length)));
            }
        }
        if let Some(&id) = batch.input_ids.iter().find(|&&id| id as usize >= c.vocab) {
            return Err(EngineError::model(format!("token id {id} outside the vocabulary ({})", c.vocab)));
        }
        let kv_dtype = kv.layout().dtype;
        if kv_dtype != self.kv_dtype {
            return Err(EngineError::model(format!(
                "KV cache holds {} but the model was set up for {}",
                kv_dtype.name(),
                self.kv_dtype.name()
            )));
        }
        let mut step = Step::new(c, batch, &self.rope, self.rope_local.as_ref(), kv_dtype);
        step.moe = self.moe.pick(batch.num_tokens());
        let clock = self.inst.clock();
        let mut pt = PartTimes::default();
        let mut cx = Fwd {
            pool: &self.pool,
            isa: self.isa,
            xq: std::mem::take(&mut self.s.xq),
            observer: &mut self.inst.observer,
            parts: clock.is_some().then_some(&mut pt),
        };
        let s = &mut self.s;
        s.resize(&step);
        for (t, &id) in batch.input_ids.iter().enumerate() {
            let row = &mut s.x[t * h..(t + 1) * h];
            self.embed.row_f32(id as usize, row);
            if c.variant.embed_scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= c.variant.embed_scale);
            }
        }
        // Element-wise work runs on the pool by token rows (each row's arithmetic is the same
        // whichever thread does it): at a 64-row decode step these serial loops were a tenth
        // of the step with the second core idle. Each residual add is fused with the norm of
        // the block that reads it.
        let (pool, rs) = (&self.pool, c.variant.residual_scale);
        if let Some(first) = self.layers.first() {
            add_norm(pool, h, &mut s.x, None, 1.0, Some(&first.attn_norm), c.rms_eps, &mut s.h);
        }
        for (l, layer) in self.layers.iter().enumerate() {
            let next = self.layers.get(l + 1).map(|n| n.attn_norm.as_slice());
            if let Some(mixer) = &layer.mixer {
                match mixer {
                    Mixer::Attention(a) => a.forward(&mut cx, &step, l, s, kv),
                    Mixer::DeltaNet(d) => d.forward(&mut cx, &step, s, kv)?,
                    Mixer::Mamba2(m) => m.forward(&mut cx, &step, s, kv)?,
                }
                if let Some((pa, _)) = &layer.post_norms {
                    post_norm(cx.pool, c, pa, s);
                }
                let norm = if layer.ffn.is_some() { Some(layer.ffn_norm.as_slice()) } else { next };
                add_norm(pool, h, &mut s.x, Some(&s.proj), rs, norm, c.rms_eps, &mut s.h);
            }
            if layer.ffn.is_some() {
                layer.mlp(&mut cx, &step, s);
                add_norm(pool, h, &mut s.x, Some(&s.proj), rs, next, c.rms_eps, &mut s.h);
            }
        }
        let head =
            OutputHead { norm: &self.output_norm, eps: c.rms_eps, weight: self.output.as_ref().unwrap_or(&self.embed) };
        let logits = match self.embedding {
            true => head.hidden(&s.x, &batch.logits_rows),
            false => {
                let mut l = head.logits(&mut cx, &s.x, &batch.logits_rows);
                if c.variant.logit_scale != 1.0 {
                    // llama.cpp's `ggml_scale(cur, 1 / logit_scale)`.
                    let inv = 1.0 / c.variant.logit_scale;
                    l.iter_mut().for_each(|v| *v *= inv);
                }
                l
            }
        };
        s.xq = cx.xq;
        self.inst.record(clock, pt);
        Ok(logits)
    }
}

/// What every layer of one step reads: the batch, its attention tasks, the RoPE tables and
/// the widths derived from the config.
struct Step<'a> {
    c: &'a LlamaConfig,
    batch: &'a ForwardBatch,
    rope: &'a RopeTable,
    /// The sliding-window layers' table, when their base differs.
    rope_local: Option<&'a RopeTable>,
    kv_dtype: KvDtype,
    /// Attention tasks, longest first.
    tasks: Vec<AttnTask>,
    /// The range of `attn_t` each task writes.
    ranges: Vec<std::ops::Range<usize>>,
    /// Width of all query heads (`heads · head_dim`).
    qd: usize,
    /// Width of all KV heads (`kv_heads · head_dim`).
    kvd: usize,
    /// Width of a fused QKV row (`qd + 2 · kvd`).
    qkv_w: usize,
    /// Width of one KV group's query heads (`group · head_dim`).
    ghd: usize,
    /// Query heads per KV head.
    group: usize,
    /// The MoE implementation for this step's size.
    moe: MoeImpl,
}

impl<'a> Step<'a> {
    fn new(
        c: &'a LlamaConfig,
        batch: &'a ForwardBatch,
        rope: &'a RopeTable,
        rope_local: Option<&'a RopeTable>,
        kv_dtype: KvDtype,
    ) -> Step<'a> {
        let (qd, kvd) = (c.q_dim(), c.kv_heads * c.head_dim);
        let group = c.heads / c.kv_heads;
        let ghd = group * c.head_dim;
        let (tasks, ranges) = attention_tasks(batch, c.kv_heads, ghd);
        let moe = MoeImpl::ExpertMajor;
        let qkv_w = if c.variant.attn_gate { 2 * qd } else { qd } + 2 * kvd;
        Step { c, batch, rope, rope_local, kv_dtype, tasks, ranges, qd, kvd, qkv_w, ghd, group, moe }
    }
}

impl LayerBuffers {
    /// Sizes every buffer for the step's tokens and maps each token row to its sequence.
    fn resize(&mut self, st: &Step) {
        let (c, batch) = (st.c, st.batch);
        let (h, qd, t_n) = (c.hidden, st.qd, batch.num_tokens());
        self.x.resize(t_n * h, 0.0);
        self.attn_t.resize(t_n * qd, 0.0);
        self.h.resize(t_n * h, 0.0);
        self.qkv.resize(t_n * st.qkv_w, 0.0);
        self.attn.resize(t_n * qd, 0.0);
        if c.variant.post_norms {
            self.post.resize(t_n * h, 0.0);
        }
        self.proj.resize(t_n * h, 0.0);
        // The dense MLP's buffers, where some layer has one (a MoE layer uses `moe`).
        if c.moe.as_ref().is_none_or(MoeConfig::any_dense) {
            self.gu.resize(t_n * 2 * c.ffn, 0.0);
            self.act.resize(t_n * c.ffn, 0.0);
        }
        self.row_seq.clear();
        for (i, sq) in batch.seqs.iter().enumerate() {
            self.row_seq.extend(std::iter::repeat_n(i as u32, sq.extend_len as usize));
        }
    }
}

impl Layer {
    /// The feed-forward on the normed input `s.h`, in `s.proj` (normed where the family has
    /// post-norms): the gated MLP (Shazeer 2020: SwiGLU, or GeGLU for Gemma: fused gate/up →
    /// `act(gate) · up` → down), or the MoE layer.
    fn mlp(&self, cx: &mut Fwd, st: &Step, s: &mut LayerBuffers) {
        let (c, t_n) = (st.c, st.batch.num_tokens());
        match &self.ffn {
            Some(FeedForward::Dense(m)) => m.forward_with(cx, &s.h, t_n, &mut s.gu, &mut s.act, &mut s.proj),
            Some(FeedForward::Moe(m)) => {
                m.forward(cx, st.moe, &s.h, t_n, &mut s.moe, &mut s.proj);
                return;
            }
            None => return,
        }
        if let Some((_, pf)) = &self.post_norms {
            post_norm(cx.pool, c, pf, s);
        }
    }
}

/// `s.proj = rms_norm(s.proj) · g` by token rows (Gemma 3's post-attention and post-MLP norms).
fn post_norm(pool: &ThreadPool, c: &LlamaConfig, g: &[f32], s: &mut LayerBuffers) {
    let h = c.hidden;
    pool.par_row_chunks2(&mut s.proj, h, &mut s.post, h, |_, p, y| kernels::rms_norm(p, g, c.rms_eps, y));
    std::mem::swap(&mut s.proj, &mut s.post);
}
