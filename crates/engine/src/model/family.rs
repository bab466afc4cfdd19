//! What a decoder family changes in the Llama layer, as data: a [`Family`] states only its
//! differences from [`Family::BASE`] (plain Llama as llama.cpp's `llama` graph runs it), and
//! [`crate::model::arch`] gives each architecture its row.
//!
//! Sources: llama.cpp's graphs (`src/models/{llama,qwen2,qwen3,smollm3,phi3,gemma3,qwen3moe,
//! glm4-moe,openai-moe,granite,mistral3}.cpp`, the RoPE type from `llama_model_rope_type` in
//! `src/llama-model.cpp`) and HF transformers' modeling files.

use crate::model::common::RopeLayout;
use crate::model::hparams::HParams;
use crate::model::moe::{Glu, MoeFamily};
use crate::model::vb::LLAMA_LAYER_NAMES;

/// Whether a family's layers norm Q and K per head before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    /// Never (Llama).
    Off,
    /// Always (Qwen3, Gemma 3).
    On,
    /// When the file has `attn_q_norm` (GLM-4.5: some sizes have it; HF `use_qk_norm`).
    IfPresent,
}

/// A decoder architecture's differences from plain Llama.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// How a GGUF file pairs a head's values for RoPE: llama.cpp's NORM (adjacent pairs; the
    /// converter permuted HF's Q/K rows for it) or NEOX (halves, HF's own order). HF
    /// checkpoints are always in halves (`rotate_half`).
    pub gguf_rope: RopeLayout,
    /// Q, K and V carry biases, required (Qwen2). Biases of other families are read when the
    /// file has them, as llama.cpp does.
    pub qkv_bias: bool,
    /// Per-head RMSNorm of Q and K before RoPE.
    pub qk_norm: QkNorm,
    /// Every `n`-th layer (`(l + 1) % n == 0`) skips RoPE (SmolLM3's NoPE layers,
    /// llama.cpp's `n_no_rope_layer_step = 4`).
    pub no_rope_step: Option<usize>,
    /// `(HF, llama.cpp)` names of a layer's modules ([`crate::model::vb`]), tables searched in
    /// order: Phi-3's fused Q/K/V and gate/up live under their own names; MoE families add
    /// `MOE_FFN_NAMES`.
    pub layer_names: &'static [&'static [(&'static str, &'static str)]],
    /// A Mixture-of-Experts family's routing as llama.cpp's graph fixes it; `None` for a dense
    /// family.
    pub moe: Option<MoeFamily>,
    /// Sliding-window layers every `n` (`attention.sliding_window_pattern`, else this; layer
    /// `l` slides when `l % n < n − 1`, llama.cpp's `set_swa_pattern`), over
    /// `attention.sliding_window` keys, which are then required; `None`: the file's window on
    /// every layer when it states one (Mistral's HF configs), else none.
    pub swa_pattern: Option<usize>,
    /// The dense MLP's activation (SwiGLU; Gemma's GeGLU).
    pub act: Glu,
    /// Embeddings × √hidden (Gemma), unless the file states `embedding_scale`.
    pub embed_scale_sqrt: bool,
    /// RMSNorm of the attention and MLP outputs before the residual add, the MLP's input norm
    /// stored as `pre_feedforward_layernorm` (Gemma 2/3).
    pub post_norms: bool,
    /// RoPE base of the sliding-window layers when the file states none (Gemma 3: 10 000).
    pub rope_local_base: Option<f32>,
    /// RoPE base when the file states none.
    pub rope_base: f32,
    /// RMSNorm ε when a GGUF file states none.
    pub rms_eps: f32,
    /// Whether RoPE scaling is run; `false`: a file that states one is refused (Gemma 3's
    /// linear scaling of its global layers is not implemented).
    pub rope_scaling: bool,
    /// The attention scale's rule; `None`: `1/√head_dim` (or Granite's stated one).
    pub attn_scale: Option<fn(&HParams, usize) -> f32>,
    /// Granite's multipliers apply: the file's `embedding_scale`, `attention.scale`,
    /// `residual_scale` (each block's output before its residual add) and `logit_scale` (a
    /// divisor of the logits); llama.cpp reads them for the Granite architectures only.
    pub multipliers: bool,
    /// Module paths an HF checkpoint of the family spells otherwise, `(ours, theirs)`
    /// (gpt-oss's router: `mlp.router`, not `mlp.gate`), read through [`crate::model::vb::Renamed`].
    pub hf_names: &'static [(&'static str, &'static str)],
    /// Llama 4's attention temperature applies (`attention.temperature_scale`, Mistral 3):
    /// the rotated queries × `1 + β · ln(⌊pos / original context⌋ + 1)`.
    pub attn_temperature: bool,
    /// Qwen3-Next's gated attention (Qwen3.5, Qwen3-Next): the query projection gives each
    /// head its query and a gate (`[q_h, gate_h]` per head, `2 · head_dim` rows), and the
    /// attention output is multiplied by `σ(gate)` before the output projection.
    pub attn_gate: bool,
    /// Hugging Face checkpoints store the RMSNorm weights zero-centred (`x · (1 + w)`:
    /// Qwen3-Next, Qwen3.5; llama.cpp's converter adds the 1), all but the recurrent layers'
    /// gated norm.
    pub hf_norm_plus_one: bool,
    /// The family's recurrent layers, and how they sit in its GGUF files; `None` for a family
    /// without them (a file with `ssm.*` keys is then refused).
    pub recurrent: Option<RecurrentMixer>,
}

/// What a hybrid family's recurrent layers are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecurrentMixer {
    /// Gated DeltaNet (Qwen3.5 / Qwen3.6, Qwen3-Next), laid out as the [`GdnLayout`] says.
    DeltaNet(GdnLayout),
    /// Mamba-2 (Nemotron-H: `mamba-base.cpp`'s `build_mamba2_layer`).
    Mamba2,
}

/// The GGUF layout of a family's Gated DeltaNet layers (llama.cpp `qwen35.cpp` against
/// `qwen3next.cpp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdnLayout {
    /// Value head `h` reads key head `h / (v_heads / k_heads)` (HF's `repeat_interleave`, as
    /// Qwen3-Next files keep it), not `h mod k_heads` (Qwen3.5 files, whose converter reorders
    /// the value heads so ggml's broadcast tiles them).
    pub grouped_heads: bool,
    /// β's and the decay's inputs come from one `ssm_ba` projection laid out per key head as
    /// `[b × r, a × r]` (`r = v_heads / k_heads`, Qwen3-Next), not from `ssm_beta` and
    /// `ssm_alpha`.
    pub fused_ba: bool,
}

impl GdnLayout {
    /// Qwen3.5 / Qwen3.6 (`qwen35`, `qwen35moe`).
    pub const QWEN35: GdnLayout = GdnLayout { grouped_heads: false, fused_ba: false };
    /// Qwen3-Next (`qwen3next`).
    pub const QWEN3NEXT: GdnLayout = GdnLayout { grouped_heads: true, fused_ba: true };
}

impl Family {
    /// Plain Llama: adjacent-pair RoPE in GGUF files, no biases required, no Q/K norms, SwiGLU,
    /// global attention, θ 10 000, ε 1e-5.
    pub const BASE: Family = Family {
        gguf_rope: RopeLayout::Interleaved,
        qkv_bias: false,
        qk_norm: QkNorm::Off,
        no_rope_step: None,
        layer_names: &[LLAMA_LAYER_NAMES],
        moe: None,
        swa_pattern: None,
        act: Glu::Silu,
        embed_scale_sqrt: false,
        post_norms: false,
        rope_local_base: None,
        rope_base: 10_000.0,
        rms_eps: 1e-5,
        rope_scaling: true,
        attn_scale: None,
        multipliers: false,
        hf_names: &[],
        attn_temperature: false,
        attn_gate: false,
        hf_norm_plus_one: false,
        recurrent: None,
    };
}
