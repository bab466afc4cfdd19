//! GLM-5 (`GlmMoeDsaForCausalLM`, `model_type: glm_moe_dsa`) on the CPU: multi-head latent
//! attention (MLA, DeepSeek-V2 §2.1), DeepSeek sparse attention (DSA: a "lightning indexer"
//! scores every cached token for each query and attention reads only the top-k; DeepSeek-V3.2
//! tech report §2), and a Mixture-of-Experts MLP with sigmoid routing, a correction bias,
//! group-limited top-k and shared experts (DeepSeek-V3 §2.1.2).
//!
//! Semantics follow HF transformers `models/glm_moe_dsa` (built on `deepseek_v32` and
//! `deepseek_v3`); `scripts/reference_glm5.py` runs that implementation on our checkpoints to
//! produce the goldens of `tests/glm5_golden.rs`.
//!
//! Per token and layer:
//! - **MLA.** `qr = RMSNorm(q_a_proj(h))`, `q = q_b_proj(qr)` split per head into
//!   `[q_nope (qk_nope_head_dim), q_pe (qk_rope_head_dim)]`; `kv = kv_a_proj_with_mqa(h)` split
//!   into `c = RMSNorm(kv[..kv_lora_rank])` (the latent) and `k_pe = RoPE(kv[kv_lora_rank..])`,
//!   shared by all heads. The cache keeps `[c, k_pe]` per token (component `latent`).
//!   `kv_b_proj` holds, per head, `W_UK [nope, kv_lora]` and `W_UV [v, kv_lora]`; we run the
//!   absorbed form for every row (prefill and decode): `q_abs = W_UKᵀ q_nope`,
//!   `score_j = (q_abs·c_j + q_pe·k_pe_j) · (nope + rope)^-½`, `o = W_UV Σ_j softmax_j · c_j`,
//!   which reads only the latent cache.
//! - **Indexer** (layers whose indexer type is `full`). `q_I = RoPE(wq_b(qr))` per indexer head,
//!   `k_I = RoPE(LayerNorm(wk(h)))` (one head, cached as component `index_k`),
//!   `w = weights_proj(h) · n_heads^-½`; `I(t, j) = Σ_h w_h · ReLU(q_I,h · k_I,j) · d^-½`. The
//!   query attends to the `index_topk` positions with the highest `I` among `0..=pos`; when
//!   `pos + 1 ≤ index_topk` every position is selected and the scores are not computed. A
//!   `shared` layer reuses the selection of the nearest `full` layer before it.
//! - **MoE** (layers `≥ first_k_dense_replace`). `s = sigmoid(gate(h))` (f32); choice scores
//!   `s + e_score_correction_bias`; groups ranked by the sum of their top-2 choice scores, the
//!   best `topk_group` kept; the top `num_experts_per_tok` experts of those by choice score;
//!   weights are `s` (without the bias) of the chosen, divided by their sum when
//!   `norm_topk_prob`, times `routed_scaling_factor` exactly once. Output
//!   `Σ_k w_k · E_k(h) + shared(h)`, every expert a SwiGLU MLP.
//!
//! Two implementations of each choice point, selected like SGLang's flags:
//! - attention (`--nsa-prefill-backend`, `--nsa-decode-backend`): [`AttnImpl::Sparse`] gathers
//!   only the selected slots; [`AttnImpl::Dense`] scores every slot of the context and masks the
//!   unselected ones, as the HF reference does. Both visit slots in position order and give
//!   bit-identical outputs.
//! - MoE (`--moe-runner-backend`): [`MoeImpl::TokenMajor`] runs each (token, expert) pair as
//!   its own GEMV; [`MoeImpl::ExpertMajor`] gathers the tokens routed to each expert and runs one
//!   grouped GEMM per expert. The NVFP4 kernel computes every token with its own accumulators,
//!   so both give bit-identical outputs; which is faster depends on the batch size, hence the
//!   start-up autotune ([`crate::autotune`]).

use std::path::Path;

use serde_json::Value;

use super::{AttentionNeeds, Model, ModelInfo};
use crate::batch::ForwardBatch;
use crate::checkpoint::hf::Checkpoint;
use sparrow_cpu::kernels;
use sparrow_cpu::Isa;
use crate::kv::{KvComponent, KvDtype, KvLayout, KvStore};
use sparrow_cpu::ThreadPool;
use sparrow_cpu::format::ggml::QActs;
use sparrow_cpu::Weight;
use crate::model::observer::{Observer, ObserverSlot};
use crate::EngineError;

/// ε of `q_a_layernorm`, `kv_a_layernorm` and the indexer's `k_norm` (HF builds them without
/// passing `rms_norm_eps`).
const LORA_NORM_EPS: f32 = 1e-6;


/// Hyper-parameters from `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct Glm5Config {
    /// Hidden size.
    pub hidden: usize,
    /// Decoder layers (MTP layers beyond these are ignored).
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// Query LoRA rank (the indexer reads the normalized `qr`, so it is required).
    pub q_lora_rank: usize,
    /// Latent (compressed KV) width.
    pub kv_lora_rank: usize,
    /// Per-head non-rotary query/key width.
    pub qk_nope: usize,
    /// Rotary width (shared `k_pe`).
    pub qk_rope: usize,
    /// Per-head value width.
    pub v_dim: usize,
    /// Routed experts.
    pub n_routed: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Shared experts (their MLP is `n_shared · moe_inter` wide).
    pub n_shared: usize,
    /// Routed expert MLP width.
    pub moe_inter: usize,
    /// Dense MLP width.
    pub inter: usize,
    /// Layers before this one are dense (`first_k_dense_replace`).
    pub first_k_dense: usize,
    /// Per layer: dense MLP (else MoE); from `mlp_layer_types` or `first_k_dense`.
    pub mlp_dense: Vec<bool>,
    /// Multiplies the routed experts' weights (once).
    pub routed_scaling: f32,
    /// Expert groups.
    pub n_group: usize,
    /// Groups kept per token.
    pub topk_group: usize,
    /// Normalize the chosen weights to sum 1.
    pub norm_topk_prob: bool,
    /// Indexer heads.
    pub idx_heads: usize,
    /// Indexer head width.
    pub idx_dim: usize,
    /// Positions each query attends to.
    pub idx_topk: usize,
    /// Per layer: `true` when the layer runs its own indexer, `false` when it reuses the
    /// selection of the previous `full` layer.
    pub indexer_full: Vec<bool>,
    /// RoPE base.
    pub rope_theta: f64,
    /// RMSNorm ε of the layer norms and the final norm (`q_a_layernorm` and
    /// `kv_a_layernorm` use 1e-6, as HF constructs them without ε).
    pub rms_eps: f32,
    /// Vocabulary size.
    pub vocab: usize,
    /// Longest position.
    pub max_positions: usize,
    /// lm_head shares the embedding.
    pub tie_word_embeddings: bool,
}

impl Glm5Config {
    /// Parses a `glm_moe_dsa` `config.json`.
    ///
    /// # Errors
    /// Another architecture, a missing field, or a feature we do not implement (named).
    pub fn from_json(v: &Value) -> Result<Self, EngineError> {
        let mt = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        if mt != "glm_moe_dsa" {
            return Err(EngineError::model(format!("config.json model_type {mt:?}: the GLM-5 loader reads glm_moe_dsa")));
        }
        // A missing key takes `GlmMoeDsaConfig`'s default (transformers 5.24), which are GLM-5's
        // own values, so a config that omits one means what it means to HF.
        let u = |k: &str, d: usize| -> Result<usize, EngineError> {
            match v.get(k) {
                None | Some(Value::Null) => Ok(d),
                Some(x) => x
                    .as_u64()
                    .map(|x| x as usize)
                    .ok_or_else(|| EngineError::model(format!("config.json: {k} is {x}, want an integer"))),
            }
        };
        let uo = |k: &str, d: usize| u(k, d);
        let f = |k: &str, d: f64| v.get(k).and_then(Value::as_f64).unwrap_or(d);
        let layers = u("num_hidden_layers", 78)?;
        let q_lora_rank = v
            .get("q_lora_rank")
            .and_then(Value::as_u64)
            .ok_or_else(|| EngineError::model("config.json: q_lora_rank is null or missing; the DSA indexer needs the q LoRA"))?
            as usize;
        // Rope parameters: `rope_parameters` (transformers ≥ 5) or the older flat fields.
        let rp = v.get("rope_parameters").cloned().unwrap_or(Value::Null);
        let rope_type = rp
            .get("rope_type")
            .or_else(|| v.get("rope_scaling").and_then(|s| s.get("type").or_else(|| s.get("rope_type"))))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if rope_type != "default" {
            return Err(EngineError::model(format!("RoPE scaling {rope_type:?} is not supported (default RoPE is)")));
        }
        // Features the checkpoint could ask for that this implementation does not have.
        if v.get("attention_bias").and_then(Value::as_bool) == Some(true) {
            return Err(EngineError::model("config.json: attention_bias = true is not supported"));
        }
        for (k, want) in [("hidden_act", "silu"), ("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")] {
            if let Some(x) = v.get(k).and_then(Value::as_str) {
                if x != want {
                    return Err(EngineError::model(format!("config.json: {k} {x:?} is not supported ({want:?} is)")));
                }
            }
        }
        let rope_theta = rp.get("rope_theta").and_then(Value::as_f64).unwrap_or_else(|| f("rope_theta", 10000.0));
        let indexer_full = indexer_types(v, layers)?;
        let first_k_dense = uo("first_k_dense_replace", 3)?;
        let mlp_dense = mlp_dense(v, layers, first_k_dense)?;
        let c = Glm5Config {
            hidden: u("hidden_size", 6144)?,
            layers,
            heads: u("num_attention_heads", 64)?,
            q_lora_rank,
            kv_lora_rank: u("kv_lora_rank", 512)?,
            qk_nope: u("qk_nope_head_dim", 192)?,
            qk_rope: u("qk_rope_head_dim", 64)?,
            v_dim: u("v_head_dim", 256)?,
            n_routed: u("n_routed_experts", 256)?,
            top_k: u("num_experts_per_tok", 8)?,
            n_shared: uo("n_shared_experts", 1)?,
            moe_inter: u("moe_intermediate_size", 2048)?,
            inter: u("intermediate_size", 12288)?,
            first_k_dense,
            mlp_dense,
            routed_scaling: f("routed_scaling_factor", 2.5) as f32,
            n_group: uo("n_group", 1)?,
            topk_group: uo("topk_group", 1)?,
            norm_topk_prob: v.get("norm_topk_prob").and_then(Value::as_bool).unwrap_or(true),
            idx_heads: u("index_n_heads", 32)?,
            idx_dim: u("index_head_dim", 128)?,
            idx_topk: u("index_topk", 2048)?,
            indexer_full,
            rope_theta,
            rms_eps: f("rms_norm_eps", 1e-5) as f32,
            vocab: u("vocab_size", 154880)?,
            max_positions: uo("max_position_embeddings", 202752)?,
            tie_word_embeddings: v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false),
        };
        c.check()?;
        Ok(c)
    }

    fn check(&self) -> Result<(), EngineError> {
        let bad = |m: String| Err(EngineError::model(format!("config.json: {m}")));
        if self.n_group == 0 || !self.n_routed.is_multiple_of(self.n_group) || self.topk_group > self.n_group {
            return bad(format!(
                "{} experts in {} groups, top {} groups",
                self.n_routed, self.n_group, self.topk_group
            ));
        }
        if self.top_k == 0 || self.top_k > self.topk_group * (self.n_routed / self.n_group) {
            return bad(format!("num_experts_per_tok {} exceeds the experts of the kept groups", self.top_k));
        }
        if self.n_routed / self.n_group < 2 && self.n_group > 1 {
            return bad("group scores need at least 2 experts per group".into());
        }
        if self.layers == 0 || self.hidden == 0 || self.heads == 0 || self.vocab == 0 || self.max_positions == 0 {
            return bad("num_hidden_layers, hidden_size, num_attention_heads, vocab_size and max_position_embeddings must be positive".into());
        }
        if self.qk_rope == 0 || !self.qk_rope.is_multiple_of(2) || self.qk_rope > self.idx_dim {
            return bad(format!(
                "qk_rope_head_dim {} must be even, positive and at most index_head_dim {}",
                self.qk_rope, self.idx_dim
            ));
        }
        if self.idx_topk == 0 || self.idx_heads == 0 {
            return bad(format!("index_topk {} and index_n_heads {} must be positive", self.idx_topk, self.idx_heads));
        }
        if self.indexer_full.first() == Some(&false) {
            return bad("the first layer's indexer is \"shared\" but no earlier layer computes a selection".into());
        }
        Ok(())
    }
}

/// Per layer: whether the layer's indexer is `full` (HF `GlmMoeDsaConfig.__post_init__`): an
/// explicit `indexer_types` list (`"full"`/`"shared"`) wins; else `index_topk_pattern` (`F`/`S`
/// characters or a list of them); else layer `i` is full iff
/// `max(i − offset + 1, 0) mod freq == 0` with `freq = index_topk_freq` (default 1) and
/// `offset = index_skip_topk_offset` (default 2), so by default every layer is full.
fn indexer_types(v: &Value, layers: usize) -> Result<Vec<bool>, EngineError> {
    let parse_list = |list: &[Value], what: &str| -> Result<Vec<bool>, EngineError> {
        if list.len() < layers {
            return Err(EngineError::model(format!("config.json: {what} has {} entries for {layers} layers", list.len())));
        }
        list[..layers]
            .iter()
            .map(|t| match t.as_str() {
                Some("full") | Some("F") => Ok(true),
                Some("shared") | Some("S") => Ok(false),
                _ => Err(EngineError::model(format!("config.json: {what} entry {t} (want \"full\"/\"F\" or \"shared\"/\"S\")"))),
            })
            .collect()
    };
    if let Some(list) = v.get("indexer_types").and_then(Value::as_array) {
        return parse_list(list, "indexer_types");
    }
    match v.get("index_topk_pattern") {
        Some(Value::Array(list)) => return parse_list(list, "index_topk_pattern"),
        Some(Value::String(s)) => {
            let list: Vec<Value> = s.chars().map(|c| Value::String(c.to_string())).collect();
            return parse_list(&list, "index_topk_pattern");
        }
        Some(Value::Null) | None => {}
        Some(other) => return Err(EngineError::model(format!("config.json: index_topk_pattern {other} is not a string or list"))),
    }
    let freq = v.get("index_topk_freq").and_then(Value::as_u64).unwrap_or(1).max(1) as i64;
    let off = v.get("index_skip_topk_offset").and_then(Value::as_u64).unwrap_or(2) as i64;
    Ok((0..layers as i64).map(|i| (i - off + 1).max(0) % freq == 0).collect())
}

/// Per layer: whether its MLP is dense. `mlp_layer_types` (`"dense"`/`"sparse"`) wins over
/// `first_k_dense_replace`.
fn mlp_dense(v: &Value, layers: usize, first_k_dense: usize) -> Result<Vec<bool>, EngineError> {
    match v.get("mlp_layer_types").and_then(Value::as_array) {
        Some(list) if list.len() >= layers => list[..layers]
            .iter()
            .map(|t| match t.as_str() {
                Some("dense") => Ok(true),
                Some("sparse") => Ok(false),
                _ => Err(EngineError::model(format!("config.json: mlp_layer_types entry {t} (want \"dense\" or \"sparse\")"))),
            })
            .collect(),
        Some(list) => Err(EngineError::model(format!("config.json: mlp_layer_types has {} entries for {layers} layers", list.len()))),
        None => Ok((0..layers).map(|l| l < first_k_dense).collect()),
    }
}

/// Attention implementation for DSA rows (`--nsa-prefill-backend` / `--nsa-decode-backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnImpl {
    /// Reads only the selected slots.
    Sparse,
    /// Scores every slot of the context, then masks the unselected ones.
    Dense,
}

impl AttnImpl {
    /// Parses the value of `flag` (`sparse` or `dense`).
    ///
    /// # Errors
    /// Any other value, with the accepted ones; SGLang's CUDA kernel names get a hint.
    pub fn parse(flag: &str, s: &str) -> Result<Self, EngineError> {
        match s {
            "sparse" => Ok(AttnImpl::Sparse),
            "dense" => Ok(AttnImpl::Dense),
            "flashmla_sparse" | "flashmla_kv" | "flashmla_auto" | "fa3" | "tilelang" | "aiter" | "trtllm" => {
                Err(EngineError::Config(format!(
                    "{flag} {s:?} is one of SGLang's CUDA kernels; this CPU build has sparse (reads the top-k slots) and dense (scores all, masks)"
                )))
            }
            _ => Err(EngineError::Config(format!("{flag} {s:?} is unknown (have: sparse, dense)"))),
        }
    }
}

/// MoE implementation (`--moe-runner-backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MoeImpl {
    /// One GEMV per (token, expert) pair.
    TokenMajor,
    /// One grouped GEMM per expert over the tokens routed to it.
    ExpertMajor,
}

impl MoeImpl {
    /// Flag spelling.
    pub fn name(self) -> &'static str {
        match self {
            MoeImpl::TokenMajor => "token_major",
            MoeImpl::ExpertMajor => "expert_major",
        }
    }
}

/// Which MoE implementation runs a batch of `tokens` tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MoeChoice {
    /// Always this one.
    Fixed(MoeImpl),
    /// Per batch-size bucket: `(largest token count of the bucket, implementation)`, ascending;
    /// counts beyond the last bucket use the last.
    Buckets(Vec<(usize, MoeImpl)>),
}

impl MoeChoice {
    /// The implementation for a batch of `tokens`.
    pub fn pick(&self, tokens: usize) -> MoeImpl {
        match self {
            MoeChoice::Fixed(m) => *m,
            MoeChoice::Buckets(b) => {
                b.iter().find(|(max, _)| tokens <= *max).or(b.last()).map_or(MoeImpl::ExpertMajor, |(_, m)| *m)
            }
        }
    }
}

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

/// Reports `x` (`rows` rows) as the input of `modules` to the observer, if one is set.
fn note(obs: &mut ObserverSlot, pool: &ThreadPool, isa: Isa, modules: &[String], x: &[f32], rows: usize) {
    if let Some(o) = obs.as_mut() {
        o.linear_input(pool, isa, modules, x, rows);
    }
}

/// A SwiGLU MLP: fused `[gate; up]` and `down`.
pub struct Mlp {
    gate_up: Weight,
    down: Weight,
    inter: usize,
}

struct Indexer {
    wq_b: Weight,
    wk: Weight,
    k_norm_w: Vec<f32>,
    k_norm_b: Vec<f32>,
    weights_proj: Weight,
}

/// The routed experts of one MoE layer and its router.
pub struct Moe {
    gate: Weight,
    bias: Vec<f32>,
    experts: Vec<Mlp>,
    shared: Option<Mlp>,
}

enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

struct Layer {
    input_ln: Vec<f32>,
    post_ln: Vec<f32>,
    q_a: Weight,
    q_a_ln: Vec<f32>,
    q_b: Weight,
    kv_a: Weight,
    kv_a_ln: Vec<f32>,
    /// `[heads][nope × kv_lora]`.
    w_uk: Vec<Vec<f32>>,
    /// `[heads][v × kv_lora]`.
    w_uv: Vec<Vec<f32>>,
    o: Weight,
    indexer: Option<Indexer>,
    ffn: Ffn,
}

/// A loaded GLM-5 model.
pub struct Glm5Model {
    cfg: Glm5Config,
    info: ModelInfo,
    opts: Glm5Options,
    embed: Weight,
    lm_head: Option<Weight>,
    norm: Vec<f32>,
    layers: Vec<Layer>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    pool: ThreadPool,
    isa: Isa,
    xq: QActs,
    stats: AttnStats,
    observer: ObserverSlot,
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

impl std::fmt::Debug for Glm5Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Glm5Model").field("cfg", &self.cfg).field("opts", &self.opts).finish()
    }
}

fn load_mlp(ck: &Checkpoint, prefix: &str, hidden: usize, inter: usize) -> Result<Mlp, EngineError> {
    let g = ck.linear(&format!("{prefix}.gate_proj"), inter, hidden)?;
    let u = ck.linear(&format!("{prefix}.up_proj"), inter, hidden)?;
    let gate_up = Weight::concat_or_dense(&[&g, &u]);
    Ok(Mlp { gate_up, down: ck.linear(&format!("{prefix}.down_proj"), hidden, inter)?, inter })
}

impl Glm5Model {
    /// Loads a checkpoint directory (`config.json`, safetensors, NVFP4 config).
    ///
    /// # Errors
    /// Anything [`Checkpoint::open`], [`Glm5Config::from_json`] or a tensor check refuses.
    pub fn load(dir: &Path, threads: usize, opts: Glm5Options) -> Result<Self, EngineError> {
        let ck = Checkpoint::open(dir)?;
        let c = Glm5Config::from_json(&ck.config)?;
        let (h, hq) = (c.hidden, c.qk_nope + c.qk_rope);
        let mut layers = Vec::with_capacity(c.layers);
        for l in 0..c.layers {
            let p = format!("model.layers.{l}");
            let a = format!("{p}.self_attn");
            let kv_b = ck.linear(&format!("{a}.kv_b_proj"), c.heads * (c.qk_nope + c.v_dim), c.kv_lora_rank)?;
            let mut w_uk = Vec::with_capacity(c.heads);
            let mut w_uv = Vec::with_capacity(c.heads);
            let mut row = vec![0f32; c.kv_lora_rank];
            for hd in 0..c.heads {
                let base = hd * (c.qk_nope + c.v_dim);
                let mut uk = Vec::with_capacity(c.qk_nope * c.kv_lora_rank);
                for i in 0..c.qk_nope {
                    kv_b.row_f32(base + i, &mut row);
                    uk.extend_from_slice(&row);
                }
                let mut uv = Vec::with_capacity(c.v_dim * c.kv_lora_rank);
                for j in 0..c.v_dim {
                    kv_b.row_f32(base + c.qk_nope + j, &mut row);
                    uv.extend_from_slice(&row);
                }
                w_uk.push(uk);
                w_uv.push(uv);
            }
            let indexer = if c.indexer_full[l] {
                let ip = format!("{a}.indexer");
                Some(Indexer {
                    wq_b: ck.linear(&format!("{ip}.wq_b"), c.idx_heads * c.idx_dim, c.q_lora_rank)?,
                    wk: ck.linear(&format!("{ip}.wk"), c.idx_dim, h)?,
                    k_norm_w: ck.vector(&format!("{ip}.k_norm.weight"), c.idx_dim)?,
                    k_norm_b: ck.vector(&format!("{ip}.k_norm.bias"), c.idx_dim)?,
                    weights_proj: ck.linear(&format!("{ip}.weights_proj"), c.idx_heads, h)?,
                })
            } else {
                None
            };
            let ffn = if c.mlp_dense[l] {
                Ffn::Dense(load_mlp(&ck, &format!("{p}.mlp"), h, c.inter)?)
            } else {
                let mut experts = Vec::with_capacity(c.n_routed);
                for e in 0..c.n_routed {
                    experts.push(load_mlp(&ck, &format!("{p}.mlp.experts.{e}"), h, c.moe_inter)?);
                }
                let shared = if c.n_shared > 0 {
                    Some(load_mlp(&ck, &format!("{p}.mlp.shared_experts"), h, c.moe_inter * c.n_shared)?)
                } else {
                    None
                };
                let (gs, gate) = ck.f32(&format!("{p}.mlp.gate.weight"))?;
                if gs != [c.n_routed, h] {
                    return Err(EngineError::model(format!("{p}.mlp.gate.weight: shape {gs:?}, want [{}, {h}]", c.n_routed)));
                }
                Ffn::Moe(Moe {
                    gate: Weight::Dense { rows: c.n_routed, cols: h, data: gate },
                    bias: ck.vector(&format!("{p}.mlp.gate.e_score_correction_bias"), c.n_routed)?,
                    experts,
                    shared,
                })
            };
            layers.push(Layer {
                input_ln: ck.vector(&format!("{p}.input_layernorm.weight"), h)?,
                post_ln: ck.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
                q_a: ck.linear(&format!("{a}.q_a_proj"), c.q_lora_rank, h)?,
                q_a_ln: ck.vector(&format!("{a}.q_a_layernorm.weight"), c.q_lora_rank)?,
                q_b: ck.linear(&format!("{a}.q_b_proj"), c.heads * hq, c.q_lora_rank)?,
                kv_a: ck.linear(&format!("{a}.kv_a_proj_with_mqa"), c.kv_lora_rank + c.qk_rope, h)?,
                kv_a_ln: ck.vector(&format!("{a}.kv_a_layernorm.weight"), c.kv_lora_rank)?,
                w_uk,
                w_uv,
                o: ck.linear(&format!("{a}.o_proj"), h, c.heads * c.v_dim)?,
                indexer,
                ffn,
            });
        }
        let (es, embed) = ck.f32("model.embed_tokens.weight")?;
        if es != [c.vocab, h] {
            return Err(EngineError::model(format!("model.embed_tokens.weight: shape {es:?}, want [{}, {h}]", c.vocab)));
        }
        let embed = Weight::Dense { rows: c.vocab, cols: h, data: embed };
        let lm_head = match (c.tie_word_embeddings, ck.has("lm_head.weight")) {
            (true, _) => None,
            (false, true) => Some(ck.linear("lm_head", c.vocab, h)?),
            (false, false) => return Err(EngineError::model("lm_head.weight missing and tie_word_embeddings is false")),
        };
        let norm = ck.vector("model.norm.weight", h)?;
        let half = c.qk_rope / 2;
        let npos = c.max_positions;
        let mut cos = vec![0f32; npos * half];
        let mut sin = vec![0f32; npos * half];
        for pos in 0..npos {
            for i in 0..half {
                // HF: inv_freq = 1 / base^(2i/d) in f32, then pos·inv_freq in f32.
                let inv = (1.0 / c.rope_theta.powf(2.0 * i as f64 / c.qk_rope as f64)) as f32;
                let a = pos as f32 * inv;
                cos[pos * half + i] = a.cos();
                sin[pos * half + i] = a.sin();
            }
        }
        let mut wbytes = embed.bytes() + lm_head.as_ref().map_or(0, Weight::bytes);
        for l in &layers {
            wbytes += l.q_a.bytes() + l.q_b.bytes() + l.kv_a.bytes() + l.o.bytes();
            wbytes += 4 * (l.w_uk.iter().map(Vec::len).sum::<usize>() + l.w_uv.iter().map(Vec::len).sum::<usize>());
            if let Some(ix) = &l.indexer {
                wbytes += ix.wq_b.bytes() + ix.wk.bytes() + ix.weights_proj.bytes();
            }
            match &l.ffn {
                Ffn::Dense(m) => wbytes += m.gate_up.bytes() + m.down.bytes(),
                Ffn::Moe(m) => {
                    wbytes += m.gate.bytes();
                    for e in m.experts.iter().chain(m.shared.iter()) {
                        wbytes += e.gate_up.bytes() + e.down.bytes();
                    }
                }
            }
        }
        let info = ModelInfo {
            architecture: "glm_moe_dsa".into(),
            name: dir.file_name().map_or("glm5".into(), |n| n.to_string_lossy().into_owned()),
            vocab_size: c.vocab,
            context_length: c.max_positions,
            num_layers: c.layers,
            hidden_size: h,
            weight_bytes: wbytes,
        };
        let pool = ThreadPool::new(threads).map_err(|e| EngineError::model(format!("thread pool: {e}")))?;
        Ok(Glm5Model {
            cfg: c,
            info,
            opts,
            embed,
            lm_head,
            norm,
            layers,
            cos,
            sin,
            pool,
            isa: Isa::detect(),
            xq: QActs::default(),
            stats: AttnStats::default(),
            observer: None,
        })
    }

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

    /// Sets (or clears) the calibration observer: while set, every forward reports the input of
    /// each linear layer under its HF module name (see [`Observer`]).
    pub fn set_observer(&mut self, observer: Option<Box<dyn Observer>>) {
        self.observer = observer;
    }

    /// Removes the observer and returns it.
    pub fn take_observer(&mut self) -> Option<Box<dyn Observer>> {
        self.observer.take()
    }

    /// Attention work counters since load.
    pub fn attn_stats(&self) -> AttnStats {
        self.stats
    }

    /// The first MoE layer's experts (what autotune times), if any.
    pub fn first_moe(&self) -> Option<&Moe> {
        self.layers.iter().find_map(|l| match &l.ffn {
            Ffn::Moe(m) => Some(m),
            Ffn::Dense(_) => None,
        })
    }

    /// The thread pool (autotune times on it).
    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    /// RoPE on adjacent pairs: HF's GLM-5 hard-codes the interleaved form for MLA and the
    /// indexer alike (`rope_interleave` / `indexer_rope_interleave` in config.json are ignored
    /// there too).
    fn rope(&self, v: &mut [f32], pos: usize) {
        let half = self.cfg.qk_rope / 2;
        let (c, s) = (&self.cos[pos * half..(pos + 1) * half], &self.sin[pos * half..(pos + 1) * half]);
        rope_apply(v, c, s, true);
    }
}

/// Rotates `v` (`2·half` values) by the angles whose cosines and sines are `c`, `s`:
/// adjacent pairs `(v[2i], v[2i+1])` when `interleave`, else `(v[i], v[i+half])` (HF's
/// `rotate_half`).
fn rope_apply(v: &mut [f32], c: &[f32], s: &[f32], interleave: bool) {
    let half = c.len();
    for i in 0..half {
        let (a, b) = if interleave { (2 * i, 2 * i + 1) } else { (i, i + half) };
        let (x, y) = (v[a], v[b]);
        v[a] = x * c[i] - y * s[i];
        v[b] = y * c[i] + x * s[i];
    }
}

/// LayerNorm with bias (`torch.nn.LayerNorm`): `(x − mean)/sqrt(var + eps) · w + b`.
fn layer_norm(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let n = x.len() as f32;
    let mean = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((v, w), b) in x.iter_mut().zip(w).zip(b) {
        *v = (*v - mean) * inv * w + b;
    }
}

/// Chooses the experts of one token: returns `(expert, weight)` in selection order.
///
/// `logits` are the router's `[n_routed]` outputs; see the module docs for the rule.
pub fn route(c: &Glm5Config, logits: &[f32], bias: &[f32]) -> Vec<(usize, f32)> {
    let scores: Vec<f32> = logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect();
    let choice: Vec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
    let per = c.n_routed / c.n_group;
    let mut allowed = vec![true; c.n_routed];
    if c.n_group > 1 {
        let mut gscore: Vec<(usize, f32)> = (0..c.n_group)
            .map(|g| {
                let mut v: Vec<f32> = choice[g * per..(g + 1) * per].to_vec();
                v.sort_by(|a, b| b.total_cmp(a));
                (g, v[0] + v[1])
            })
            .collect();
        // Highest first; ties to the lower index (torch.topk's order on CPU).
        gscore.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let keep: Vec<usize> = gscore.iter().take(c.topk_group).map(|g| g.0).collect();
        for (e, a) in allowed.iter_mut().enumerate() {
            *a = keep.contains(&(e / per));
        }
    }
    let mut cand: Vec<usize> = (0..c.n_routed).filter(|&e| allowed[e]).collect();
    cand.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]).then(a.cmp(&b)));
    cand.truncate(c.top_k);
    let mut w: Vec<(usize, f32)> = cand.iter().map(|&e| (e, scores[e])).collect();
    if c.norm_topk_prob {
        let sum: f32 = w.iter().map(|x| x.1).sum::<f32>() + 1e-20;
        w.iter_mut().for_each(|x| x.1 /= sum);
    }
    w.iter_mut().for_each(|x| x.1 *= c.routed_scaling);
    w
}

impl Mlp {
    /// `out = down(silu(gate(x)) · up(x))` for `tokens` rows.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        pool: &ThreadPool,
        isa: Isa,
        x: &[f32],
        tokens: usize,
        xq: &mut QActs,
        out: &mut [f32],
        cap: &mut ObserverSlot,
        prefix: &str,
    ) {
        if cap.is_some() {
            note(cap, pool, isa, &[format!("{prefix}.gate_proj"), format!("{prefix}.up_proj")], x, tokens);
        }
        let mut gu = vec![0f32; tokens * 2 * self.inter];
        kernels::matmul(pool, isa, &self.gate_up, x, tokens, xq, &mut gu);
        let mut act = vec![0f32; tokens * self.inter];
        for t in 0..tokens {
            let g = &gu[t * 2 * self.inter..(t + 1) * 2 * self.inter];
            kernels::silu_mul(&g[..self.inter], &g[self.inter..], &mut act[t * self.inter..(t + 1) * self.inter]);
        }
        if cap.is_some() {
            note(cap, pool, isa, &[format!("{prefix}.down_proj")], &act, tokens);
        }
        kernels::matmul(pool, isa, &self.down, &act, tokens, xq, out);
    }
}

impl Moe {
    /// The routed + shared output for `tokens` rows of `x` (`[tokens × hidden]`), with the
    /// routing of each token given; implementation `imp`.
    #[allow(clippy::too_many_arguments)]
    pub fn run_routed(
        &self,
        pool: &ThreadPool,
        isa: Isa,
        imp: MoeImpl,
        routes: &[Vec<(usize, f32)>],
        x: &[f32],
        hidden: usize,
        xq: &mut QActs,
        out: &mut [f32],
    ) {
        self.run_routed_capture(pool, isa, imp, routes, x, hidden, xq, out, &mut None, "");
    }

    /// [`Moe::run_routed`], noting each module's input amax into `cap` under `prefix`
    /// (`model.layers.L.mlp`).
    #[allow(clippy::too_many_arguments)]
    fn run_routed_capture(
        &self,
        pool: &ThreadPool,
        isa: Isa,
        imp: MoeImpl,
        routes: &[Vec<(usize, f32)>],
        x: &[f32],
        hidden: usize,
        xq: &mut QActs,
        out: &mut [f32],
        cap: &mut ObserverSlot,
        prefix: &str,
    ) {
        let tokens = routes.len();
        let k = routes.first().map_or(0, Vec::len);
        // y[t·k + j] is expert routes[t][j]'s output for token t.
        let mut y = vec![0f32; tokens * k * hidden];
        match imp {
            MoeImpl::TokenMajor => {
                for (t, r) in routes.iter().enumerate() {
                    for (j, &(e, _)) in r.iter().enumerate() {
                        let dst = &mut y[(t * k + j) * hidden..(t * k + j + 1) * hidden];
                        let p = if cap.is_some() { format!("{prefix}.experts.{e}") } else { String::new() };
                        self.experts[e].run(pool, isa, &x[t * hidden..(t + 1) * hidden], 1, xq, dst, cap, &p);
                    }
                }
            }
            MoeImpl::ExpertMajor => {
                let mut by_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); self.experts.len()];
                for (t, r) in routes.iter().enumerate() {
                    for (j, &(e, _)) in r.iter().enumerate() {
                        by_expert[e].push((t, j));
                    }
                }
                let mut xs = Vec::new();
                let mut ys = Vec::new();
                for (e, list) in by_expert.iter().enumerate() {
                    if list.is_empty() {
                        continue;
                    }
                    xs.clear();
                    for &(t, _) in list {
                        xs.extend_from_slice(&x[t * hidden..(t + 1) * hidden]);
                    }
                    ys.resize(list.len() * hidden, 0.0);
                    let p = if cap.is_some() { format!("{prefix}.experts.{e}") } else { String::new() };
                    self.experts[e].run(pool, isa, &xs, list.len(), xq, &mut ys, cap, &p);
                    for (i, &(t, j)) in list.iter().enumerate() {
                        y[(t * k + j) * hidden..(t * k + j + 1) * hidden]
                            .copy_from_slice(&ys[i * hidden..(i + 1) * hidden]);
                    }
                }
            }
        }
        out.iter_mut().for_each(|v| *v = 0.0);
        for (t, r) in routes.iter().enumerate() {
            let o = &mut out[t * hidden..(t + 1) * hidden];
            for (j, &(_, w)) in r.iter().enumerate() {
                let yj = &y[(t * k + j) * hidden..(t * k + j + 1) * hidden];
                o.iter_mut().zip(yj).for_each(|(o, y)| *o += w * y);
            }
        }
        if let Some(sh) = &self.shared {
            let mut s = vec![0f32; tokens * hidden];
            let p = if cap.is_some() { format!("{prefix}.shared_experts") } else { String::new() };
            sh.run(pool, isa, x, tokens, xq, &mut s, cap, &p);
            out.iter_mut().zip(&s).for_each(|(o, s)| *o += s);
        }
    }

    /// Routes every token of `x` (`[tokens × hidden]`).
    pub fn routes(
        &self,
        c: &Glm5Config,
        pool: &ThreadPool,
        isa: Isa,
        x: &[f32],
        tokens: usize,
        xq: &mut QActs,
    ) -> Vec<Vec<(usize, f32)>> {
        let mut logits = vec![0f32; tokens * c.n_routed];
        kernels::matmul(pool, isa, &self.gate, x, tokens, xq, &mut logits);
        logits.chunks_exact(c.n_routed).map(|l| route(c, l, &self.bias)).collect()
    }

    /// Routed experts.
    pub fn num_experts(&self) -> usize {
        self.experts.len()
    }

    /// The experts' weight format (`nvfp4`, `dense` or `gguf`), for autotune's cache key.
    pub fn weight_format(&self) -> &'static str {
        match self.experts.first().map(|e| &e.gate_up) {
            Some(Weight::Nvfp4(_)) => "nvfp4",
            Some(Weight::Quant(_)) => "gguf",
            _ => "dense",
        }
    }
}

/// Top-`k` positions of `scores` (highest first, ties to the lower position), returned in
/// ascending position order.
fn top_k_positions(scores: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..scores.len() as u32).collect();
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, |&a, &b| scores[b as usize].total_cmp(&scores[a as usize]).then(a.cmp(&b)));
        idx.truncate(k);
    }
    idx.sort_unstable();
    idx
}

impl Model for Glm5Model {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn attention_needs(&self) -> AttentionNeeds {
        let c = &self.cfg;
        AttentionNeeds {
            kind: "mla+dsa",
            kv_layout: KvLayout {
                layers: c.layers,
                components: vec![
                    KvComponent { name: "latent", width: c.kv_lora_rank + c.qk_rope },
                    KvComponent { name: "index_k", width: c.idx_dim },
                ],
                dtype: KvDtype::F32,
            },
        }
    }

    fn forward(&mut self, batch: &ForwardBatch, kv: &mut KvStore) -> Result<Vec<f32>, EngineError> {
        let c = self.cfg.clone();
        let t_n = batch.num_tokens();
        let h = c.hidden;
        let hq = c.qk_nope + c.qk_rope;
        let lat_w = c.kv_lora_rank + c.qk_rope;
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
        let isa = self.isa;
        let mut xq = std::mem::take(&mut self.xq);
        let mut hn = vec![0f32; t_n * h];
        let mut qa = vec![0f32; t_n * c.q_lora_rank];
        let mut qr = vec![0f32; t_n * c.q_lora_rank];
        let mut q = vec![0f32; t_n * c.heads * hq];
        let mut kva = vec![0f32; t_n * lat_w];
        let mut attn = vec![0f32; t_n * c.heads * c.v_dim];
        let mut proj = vec![0f32; t_n * h];
        // Selection per token (ascending positions), from the last full indexer layer; `None`
        // when the whole context is selected.
        let mut selection: Vec<Option<Vec<u32>>> = vec![None; t_n];
        let softmax_scale = 1.0 / (hq as f32).sqrt();
        let mut st = self.stats;
        let mut cap = self.observer.take();
        for (l, layer) in self.layers.iter().enumerate() {
            // Module names only matter while calibrating; no formatting on the serving path.
            let a = if cap.is_some() { format!("model.layers.{l}.self_attn") } else { String::new() };
            kernels::rms_norm(&x, &layer.input_ln, c.rms_eps, &mut hn);
            if cap.is_some() {
                let mut ms = vec![format!("{a}.q_a_proj"), format!("{a}.kv_a_proj_with_mqa")];
                if layer.indexer.is_some() {
                    ms.extend([format!("{a}.indexer.wk"), format!("{a}.indexer.weights_proj")]);
                }
                note(&mut cap, &self.pool, isa, &ms, &hn, t_n);
            }
            kernels::matmul(&self.pool, isa, &layer.q_a, &hn, t_n, &mut xq, &mut qa);
            kernels::rms_norm(&qa, &layer.q_a_ln, LORA_NORM_EPS, &mut qr);
            if cap.is_some() {
                let mut ms = vec![format!("{a}.q_b_proj")];
                if layer.indexer.is_some() {
                    ms.push(format!("{a}.indexer.wq_b"));
                }
                note(&mut cap, &self.pool, isa, &ms, &qr, t_n);
            }
            kernels::matmul(&self.pool, isa, &layer.q_b, &qr, t_n, &mut xq, &mut q);
            kernels::matmul(&self.pool, isa, &layer.kv_a, &hn, t_n, &mut xq, &mut kva);
            for t in 0..t_n {
                let pos = batch.positions[t] as usize;
                let row = &mut kva[t * lat_w..(t + 1) * lat_w];
                let (lat, kpe) = row.split_at_mut(c.kv_lora_rank);
                let mut normed = vec![0f32; c.kv_lora_rank];
                kernels::rms_norm(lat, &layer.kv_a_ln, LORA_NORM_EPS, &mut normed);
                lat.copy_from_slice(&normed);
                self.rope(kpe, pos);
                for hd in 0..c.heads {
                    let qpe = &mut q[t * c.heads * hq + hd * hq + c.qk_nope..t * c.heads * hq + (hd + 1) * hq];
                    self.rope(qpe, pos);
                }
            }
            {
                let cache = kv.component_mut(l, 0);
                for t in 0..t_n {
                    let s = batch.out_cache_loc[t] as usize;
                    cache[s * lat_w..(s + 1) * lat_w].copy_from_slice(&kva[t * lat_w..(t + 1) * lat_w]);
                }
            }
            if let Some(ix) = &layer.indexer {
                let (di, ni) = (c.idx_dim, c.idx_heads);
                let mut ki = vec![0f32; t_n * di];
                kernels::matmul(&self.pool, isa, &ix.wk, &hn, t_n, &mut xq, &mut ki);
                for t in 0..t_n {
                    let pos = batch.positions[t] as usize;
                    let k = &mut ki[t * di..(t + 1) * di];
                    layer_norm(k, &ix.k_norm_w, &ix.k_norm_b, LORA_NORM_EPS);
                    self.rope(&mut k[..c.qk_rope], pos);
                }
                {
                    let cache = kv.component_mut(l, 1);
                    for t in 0..t_n {
                        let s = batch.out_cache_loc[t] as usize;
                        cache[s * di..(s + 1) * di].copy_from_slice(&ki[t * di..(t + 1) * di]);
                    }
                }
                // Only queries whose context exceeds top-k need scores.
                let need: Vec<usize> = (0..t_n).filter(|&t| batch.positions[t] as usize + 1 > c.idx_topk).collect();
                let mut sel: Vec<Option<Vec<u32>>> = vec![None; t_n];
                if !need.is_empty() {
                    let mut qi = vec![0f32; t_n * ni * di];
                    kernels::matmul(&self.pool, isa, &ix.wq_b, &qr, t_n, &mut xq, &mut qi);
                    let mut wts = vec![0f32; t_n * ni];
                    kernels::matmul(&self.pool, isa, &ix.weights_proj, &hn, t_n, &mut xq, &mut wts);
                    let wscale = 1.0 / (ni as f32).sqrt();
                    let kscale = 1.0 / (di as f32).sqrt();
                    for t in &need {
                        let pos = batch.positions[*t] as usize;
                        for hd in 0..ni {
                            let v = &mut qi[(t * ni + hd) * di..(t * ni + hd + 1) * di];
                            self.rope(&mut v[..c.qk_rope], pos);
                        }
                    }
                    let kc = kv.component(l, 1);
                    let results: Vec<std::sync::Mutex<Option<Vec<u32>>>> =
                        need.iter().map(|_| std::sync::Mutex::new(None)).collect();
                    let (qi, wts) = (&qi, &wts);
                    self.pool.run(need.len(), |n| {
                        let t = need[n];
                        let pos = batch.positions[t] as usize;
                        let slots = &batch.kv_slots(row_seq[t] as usize)[..=pos];
                        let mut scores = vec![0f32; slots.len()];
                        for (j, &s) in slots.iter().enumerate() {
                            let kr = &kc[s as usize * di..(s as usize + 1) * di];
                            let mut acc = 0f32;
                            for hd in 0..ni {
                                let d = kernels::dot(isa, &qi[(t * ni + hd) * di..(t * ni + hd + 1) * di], kr);
                                acc += wts[t * ni + hd] * wscale * d.max(0.0);
                            }
                            scores[j] = acc * kscale;
                        }
                        let top = top_k_positions(&scores, c.idx_topk);
                        if let Ok(mut r) = results[n].lock() {
                            *r = Some(top);
                        }
                    });
                    for (n, r) in results.into_iter().enumerate() {
                        sel[need[n]] = r.into_inner().ok().flatten();
                    }
                    st.indexer_keys += need.iter().map(|&t| batch.positions[t] as u64 + 1).sum::<u64>();
                }
                st.queries_sparse += need.len() as u64;
                st.queries_dense += (t_n - need.len()) as u64;
                selection = sel;
            }
            // Attention, one (token, head) per task.
            let lat_cache = kv.component(l, 0);
            let (q_ref, sel_ref, rs, rd) = (&q, &selection, &row_seq, &row_decode);
            let (pa, da) = (self.opts.prefill_attn, self.opts.decode_attn);
            let vd = c.v_dim;
            let kvl = c.kv_lora_rank;
            self.pool.par_rows(&mut attn, c.heads * vd, |t, out| {
                let pos = batch.positions[t] as usize;
                let slots = &batch.kv_slots(rs[t] as usize)[..=pos];
                let imp = if rd[t] { da } else { pa };
                let mut qabs = vec![0f32; kvl];
                let mut lat = vec![0f32; kvl];
                let mut scores: Vec<f32> = Vec::with_capacity(slots.len());
                for hd in 0..c.heads {
                    let qh = &q_ref[t * c.heads * hq + hd * hq..t * c.heads * hq + (hd + 1) * hq];
                    let (qn, qpe) = qh.split_at(c.qk_nope);
                    qabs.iter_mut().for_each(|v| *v = 0.0);
                    let uk = &layer.w_uk[hd];
                    for (i, &qv) in qn.iter().enumerate() {
                        kernels::axpy(isa, qv, &uk[i * kvl..(i + 1) * kvl], &mut qabs);
                    }
                    let score = |s: u32| {
                        let e = &lat_cache[s as usize * lat_w..(s as usize + 1) * lat_w];
                        (kernels::dot(isa, &qabs, &e[..kvl]) + kernels::dot(isa, qpe, &e[kvl..])) * softmax_scale
                    };
                    scores.clear();
                    let all_pos: Vec<u32>;
                    let chosen: &[u32] = match (&sel_ref[t], imp) {
                        (None, _) => {
                            all_pos = (0..slots.len() as u32).collect();
                            scores.extend(slots.iter().map(|&s| score(s)));
                            &all_pos
                        }
                        (Some(sel), AttnImpl::Sparse) => {
                            scores.extend(sel.iter().map(|&p| score(slots[p as usize])));
                            sel
                        }
                        (Some(sel), AttnImpl::Dense) => {
                            // Score every key, then keep the selected ones: the work of dense
                            // attention with the sparse result (masked keys would add exp(−∞) = 0).
                            let all: Vec<f32> = slots.iter().map(|&s| score(s)).collect();
                            scores.extend(sel.iter().map(|&p| all[p as usize]));
                            sel
                        }
                    };
                    let mx = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut sum = 0f32;
                    for v in scores.iter_mut() {
                        *v = (*v - mx).exp();
                        sum += *v;
                    }
                    lat.iter_mut().for_each(|v| *v = 0.0);
                    let inv = 1.0 / sum;
                    for (n, &p) in chosen.iter().enumerate() {
                        let s = slots[p as usize] as usize;
                        kernels::axpy(isa, scores[n] * inv, &lat_cache[s * lat_w..s * lat_w + kvl], &mut lat);
                    }
                    let o = &mut out[hd * vd..(hd + 1) * vd];
                    let uv = &layer.w_uv[hd];
                    for (j, ov) in o.iter_mut().enumerate() {
                        *ov = kernels::dot(isa, &uv[j * kvl..(j + 1) * kvl], &lat);
                    }
                }
            });
            for t in 0..t_n {
                let ctx = batch.positions[t] as u64 + 1;
                let n = match (&selection[t], if row_decode[t] { da } else { pa }) {
                    (None, _) | (Some(_), AttnImpl::Dense) => ctx,
                    (Some(s), AttnImpl::Sparse) => s.len() as u64,
                };
                st.attn_keys += n * c.heads as u64;
            }
            if cap.is_some() {
                note(&mut cap, &self.pool, isa, &[format!("{a}.o_proj")], &attn, t_n);
            }
            kernels::matmul(&self.pool, isa, &layer.o, &attn, t_n, &mut xq, &mut proj);
            x.iter_mut().zip(&proj).for_each(|(x, p)| *x += p);
            kernels::rms_norm(&x, &layer.post_ln, c.rms_eps, &mut hn);
            let mp = if cap.is_some() { format!("model.layers.{l}.mlp") } else { String::new() };
            match &layer.ffn {
                Ffn::Dense(m) => m.run(&self.pool, isa, &hn, t_n, &mut xq, &mut proj, &mut cap, &mp),
                Ffn::Moe(m) => {
                    let routes = m.routes(&c, &self.pool, isa, &hn, t_n, &mut xq);
                    let imp = self.opts.moe.pick(t_n);
                    m.run_routed_capture(&self.pool, isa, imp, &routes, &hn, h, &mut xq, &mut proj, &mut cap, &mp);
                }
            }
            x.iter_mut().zip(&proj).for_each(|(x, p)| *x += p);
        }
        self.stats = st;
        self.observer = cap;
        let r_n = batch.logits_rows.len();
        let mut sel = vec![0f32; r_n * h];
        for (i, &r) in batch.logits_rows.iter().enumerate() {
            sel[i * h..(i + 1) * h].copy_from_slice(&x[r as usize * h..(r as usize + 1) * h]);
        }
        let mut normed = vec![0f32; r_n * h];
        kernels::rms_norm(&sel, &self.norm, c.rms_eps, &mut normed);
        let mut logits = vec![0f32; r_n * c.vocab];
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        kernels::matmul(&self.pool, isa, head, &normed, r_n, &mut xq, &mut logits);
        self.xq = xq;
        Ok(logits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Glm5Config {
        Glm5Config {
            hidden: 8,
            layers: 1,
            heads: 1,
            q_lora_rank: 8,
            kv_lora_rank: 8,
            qk_nope: 4,
            qk_rope: 4,
            v_dim: 4,
            n_routed: 8,
            top_k: 2,
            n_shared: 1,
            moe_inter: 4,
            inter: 8,
            first_k_dense: 0,
            mlp_dense: vec![false],
            routed_scaling: 2.5,
            n_group: 4,
            topk_group: 2,
            norm_topk_prob: true,
            idx_heads: 2,
            idx_dim: 8,
            idx_topk: 4,
            indexer_full: vec![true],
            rope_theta: 10000.0,
            rms_eps: 1e-6,
            vocab: 10,
            max_positions: 16,
            tie_word_embeddings: false,
        }
    }

    /// Hand-computed routing: sigmoid(0) = 0.5, the bias steers the choice but not the weight,
    /// groups are ranked by their top-2 sum, weights normalized then scaled by 2.5 once.
    #[test]
    fn routing_by_hand() {
        let c = cfg();
        // Groups of 2: {0,1} {2,3} {4,5} {6,7}.
        let logits = [0.0, 0.0, 2.0, -2.0, 1.0, 1.0, 3.0, -9.0];
        let bias = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0, 0.0];
        let s = |x: f32| 1.0 / (1.0 + (-x).exp());
        // Choice scores: g0 = 0.5+0.5 = 1.0; g1 = s(2)+s(-2) = 1.0; g2 = 2·s(1) = 1.462;
        // g3 = s(3)−1 + s(−9) = −0.047. Groups kept: g2, then g0 and g1 tie at 1.0 → g0.
        let r = route(&c, &logits, &bias);
        let experts: Vec<usize> = r.iter().map(|x| x.0).collect();
        assert_eq!(experts, vec![4, 5]);
        let (w4, w5) = (s(1.0), s(1.0));
        assert!((r[0].1 - 2.5 * w4 / (w4 + w5)).abs() < 1e-6 && (r[1].1 - 1.25).abs() < 1e-6, "{r:?}");
        // Bias only in the choice: expert 6 (raw 0.95) loses its group to the others.
        let mut c2 = c.clone();
        c2.norm_topk_prob = false;
        c2.n_group = 1;
        c2.topk_group = 1;
        let r = route(&c2, &logits, &bias);
        // Choice: e2 = s(2) = 0.881, e6 = s(3) − 1 = −0.047; e4 = e5 = 0.731.
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![2, 4]);
        assert!((r[0].1 - 2.5 * s(2.0)).abs() < 1e-6);
    }

    #[test]
    fn top_k_is_a_set_in_position_order() {
        let s = [0.5, 3.0, -1.0, 3.0, 2.0, 0.0];
        assert_eq!(top_k_positions(&s, 3), vec![1, 3, 4]);
        assert_eq!(top_k_positions(&s, 10), vec![0, 1, 2, 3, 4, 5]);
        // Ties at the boundary go to the lower position.
        assert_eq!(top_k_positions(&[1.0, 1.0, 1.0], 2), vec![0, 1]);
    }

    #[test]
    fn rope_layouts() {
        let (c, s) = ([0.0f32, 1.0], [1.0f32, 0.0]);
        let mut v = [1.0, 2.0, 3.0, 4.0];
        rope_apply(&mut v, &c, &s, true);
        // Pair (1,2) rotated by 90°: (−2, 1); pair (3,4) unrotated.
        assert_eq!(v, [-2.0, 1.0, 3.0, 4.0]);
        let mut v = [1.0, 2.0, 3.0, 4.0];
        rope_apply(&mut v, &c, &s, false);
        // Pairs (v0, v2) = (1, 3) rotated by 90° → (−3, 1); (v1, v3) unrotated.
        assert_eq!(v, [-3.0, 2.0, 1.0, 4.0]);
    }

    /// A config that omits a key means HF's default (GLM-5's values), not zero.
    #[test]
    fn missing_keys_take_hf_defaults() {
        let c = Glm5Config::from_json(&serde_json::json!({"model_type": "glm_moe_dsa", "q_lora_rank": 2048}))
            .expect("defaults parse");
        assert_eq!((c.layers, c.hidden, c.n_routed, c.top_k, c.n_shared, c.first_k_dense), (78, 6144, 256, 8, 1, 3));
        assert_eq!((c.routed_scaling, c.rms_eps, c.idx_topk, c.max_positions), (2.5, 1e-5, 2048, 202752));
        assert_eq!((c.rope_theta, c.vocab, c.n_group, c.topk_group), (10000.0, 154880, 1, 1));
        assert!(c.indexer_full.iter().all(|&f| f) && c.mlp_dense[..3].iter().all(|&d| d) && !c.mlp_dense[3]);
        let e =
            Glm5Config::from_json(&serde_json::json!({"model_type": "glm_moe_dsa", "q_lora_rank": 8, "index_topk": 0}))
                .expect_err("index_topk 0")
                .to_string();
        assert!(e.contains("index_topk"), "{e}");
    }

    #[test]
    fn indexer_type_forms() {
        let v = serde_json::json!({"indexer_types": ["full", "shared", "full"]});
        assert_eq!(indexer_types(&v, 3).expect("list"), vec![true, false, true]);
        // HF's docstring example: freq 4, offset 2, 12 layers → F F S S S F S S S F S S.
        let v = serde_json::json!({"index_topk_freq": 4, "index_skip_topk_offset": 2});
        let want: Vec<bool> = "FFSSSFSSSFSS".chars().map(|c| c == 'F').collect();
        assert_eq!(indexer_types(&v, 12).expect("freq"), want);
        assert_eq!(indexer_types(&serde_json::json!({}), 3).expect("default"), vec![true; 3]);
        let v = serde_json::json!({"index_topk_pattern": "FSSF"});
        assert_eq!(indexer_types(&v, 4).expect("pattern"), vec![true, false, false, true]);
        assert!(indexer_types(&serde_json::json!({"indexer_types": ["full", "half"]}), 2).is_err());
    }
}
