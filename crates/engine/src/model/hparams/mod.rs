//! One neutral record of a model's hyper-parameters, [`HParams`], read from a GGUF file's
//! `{arch}.*` keys ([`HParams::from_gguf`]) and from a Hugging Face `config.json`
//! ([`HParams::from_hf`]) alike, so the two paths cannot disagree: the vocabulary is llama.cpp's
//! `llama_hparams` (`src/llama-hparams.h`), which its converter fills from HF configs
//! (`convert_hf_to_gguf.py`), and which the model bodies read.
//!
//! RoPE is normalised once, here ([`Rope`]): the base, the rotary width, frequency factors
//! (Llama 3's `rope_freqs` or the converter's `rope_scaling = {rope_type: llama3, …}`, LongRoPE's
//! `rope_factors_{long,short}` or `long_factor` / `short_factor`), the attention factor on every
//! cosine and sine, and linear or YaRN scaling with its `yarn_log_multiplier`
//! (`mscale_all_dim`). Windows (size, pattern, per-layer list), MoE ([`MoeParams`]) and MLA
//! ([`MlaParams`]) are read once each; what a family fixes regardless of the file stays in its
//! row of [`crate::model::arch`].

mod gguf;
mod hf;

pub use hf::llama3_rope_factors;

use crate::model::common::RopeScaling;
use crate::model::routing::Scoring;
use crate::EngineError;

/// A model's hyper-parameters, from either file format. Counts are as the model runs them
/// (`layers` is the trunk: GLM-4.5's NextN layers past it are not counted).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HParams {
    /// Where the values came from, for errors: `qwen2` (a GGUF file's `{arch}.` prefix) or
    /// `config.json`.
    pub source: String,
    /// Decoder layers run for the next token (`block_count` less `nextn_predict_layers`;
    /// `num_hidden_layers`).
    pub layers: usize,
    /// Hidden size (`embedding_length`, `hidden_size`).
    pub hidden: usize,
    /// Dense MLP width (`feed_forward_length`, `intermediate_size`).
    pub ffn: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (GQA); `heads` when not stated.
    pub kv_heads: usize,
    /// A head's query/key width when stated (`attention.key_length`, `head_dim`).
    pub key_length: Option<usize>,
    /// A head's value width when stated (`attention.value_length`).
    pub value_length: Option<usize>,
    /// RMSNorm ε when stated.
    pub rms_eps: Option<f32>,
    /// Vocabulary size (the embedding's rows in a GGUF file, `vocab_size`).
    pub vocab: usize,
    /// Trained context (`context_length`, `max_position_embeddings`).
    pub context_length: usize,
    /// Rotary position embedding.
    pub rope: Rope,
    /// Sliding-window attention, when the file states a window.
    pub window: Option<Window>,
    /// The attention score scale when stated (`attention.scale`; Granite's
    /// `attention_multiplier`); else `1/√head_dim`.
    pub attention_scale: Option<f32>,
    /// Factor on the embedding rows (`embedding_scale`; Granite's `embedding_multiplier`).
    pub embedding_scale: Option<f32>,
    /// Factor on each block's output before its residual add (`residual_scale`; Granite's
    /// `residual_multiplier`).
    pub residual_scale: Option<f32>,
    /// Divisor of the logits (`logit_scale`; Granite's `logits_scaling`).
    pub logit_scale: Option<f32>,
    /// Llama 4's attention temperature tuning (Mistral 3): queries scaled by
    /// `1 + scale · ln(⌊pos / floor⌋ + 1)`.
    pub attn_temperature: Option<AttnTemperature>,
    /// Q/K/V biases as the file states them (HF `attention_bias`); `None`: not stated.
    pub qkv_bias: Option<bool>,
    /// Per-head Q/K norms as the file states them (HF `use_qk_norm`); `None`: not stated.
    pub qk_norm: Option<bool>,
    /// Per layer, whether it skips RoPE (HF `no_rope_layers`: SmolLM3), when stated.
    pub no_rope_layers: Option<Vec<bool>>,
    /// The LM head shares the embedding (HF `tie_word_embeddings`); `None` in a GGUF file,
    /// where a missing `output.weight` says so.
    pub tie_word_embeddings: Option<bool>,
    /// Mixture of experts, when the file has experts.
    pub moe: Option<MoeParams>,
    /// Multi-head latent attention, when the file has a latent.
    pub mla: Option<MlaParams>,
    /// gpt-oss's clamp of its SwiGLU (`swiglu_limit`).
    pub swiglu_limit: Option<f32>,
    /// Linear-attention (recurrent) layers of a hybrid model, when the file has them.
    pub linear_attn: Option<LinearAttnParams>,
}

/// A hybrid model's recurrent layers: Gated DeltaNet (llama.cpp's `ssm.*` keys as `qwen35.cpp`
/// reads them; HF `linear_*` of `Qwen3NextConfig` / `Qwen3_5TextConfig`) or Mamba-2
/// (`nemotron-h.cpp`, `mamba-base.cpp`: `state_size` is `d_state`, `group_count` `n_group`,
/// `time_step_rank` the heads, `inner_size` `d_inner`; the field names below are the delta
/// rule's).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LinearAttnParams {
    /// Taps of the short convolution (`ssm.conv_kernel`, `linear_conv_kernel_dim`).
    pub conv_kernel: usize,
    /// A key head's width, = a value head's (`ssm.state_size`, `linear_key_head_dim`).
    pub head_k: usize,
    /// All value heads' width (`ssm.inner_size`: `linear_value_head_dim × linear_num_value_heads`).
    pub inner: usize,
    /// Key heads (`ssm.group_count`, `linear_num_key_heads`).
    pub k_heads: usize,
    /// Value heads (`ssm.time_step_rank`, `linear_num_value_heads`).
    pub v_heads: usize,
    /// Per trunk layer: recurrent (`attention.recurrent_layers`, else every layer but each
    /// `full_attention_interval`-th, default 4, as llama.cpp's loader decides).
    pub recurrent: Vec<bool>,
    /// Per trunk layer: an MLP block without a token mixer (Nemotron-H's `-` layers).
    pub ffn_only: Vec<bool>,
}

/// RoPE, normalised from either format.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rope {
    /// θ base when stated (`rope.freq_base`, `rope_theta`).
    pub base: Option<f32>,
    /// The sliding-window layers' base when stated (`rope.freq_base_swa`,
    /// `rope_local_base_freq`).
    pub local_base: Option<f32>,
    /// Values of a head RoPE rotates, when stated (`rope.dimension_count`,
    /// `partial_rotary_factor · head_dim`, `qk_rope_head_dim`).
    pub dims: Option<usize>,
    /// Per-pair frequency divisors: Llama 3's (`rope_freqs`, or computed from its
    /// `rope_scaling`) or LongRoPE's (the long factors when the context is past the original
    /// one, as llama.cpp chooses them).
    pub freq_factors: Option<Vec<f32>>,
    /// Factor on every cosine and sine (`rope.scaling.attn_factor`; LongRoPE's
    /// `attention_factor`); 1 when absent.
    pub attn_factor: f32,
    /// Linear or YaRN scaling.
    pub scaling: Option<RopeScaling>,
}

/// Sliding-window attention as a file states it.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// Keys a query sees, itself included (`attention.sliding_window`, `sliding_window`).
    pub size: usize,
    /// Every `n`-th layer is global (`attention.sliding_window_pattern`); `None`: the family's
    /// default, or every layer when the file lists none.
    pub pattern: Option<usize>,
    /// Per layer, whether it slides (HF `layer_types`), when stated.
    pub layers: Option<Vec<bool>>,
}

/// Llama 4's attention temperature tuning (`llm_graph_input_attn_temp`): a query at position
/// `p` is multiplied by `1 + scale · ln(⌊(p + offset) / floor⌋ + 1)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnTemperature {
    /// `attention.temperature_scale` (HF `llama_4_scaling_beta`).
    pub scale: f32,
    /// Positions per step (llama.cpp's `n_attn_temp_floor_scale`: the original YaRN context).
    pub floor: usize,
}

impl AttnTemperature {
    /// The factor on a query at position `pos` (Mistral 3: offset 0).
    pub fn factor(&self, pos: usize) -> f32 {
        // llama.cpp: the quotient in f32, the logarithm and the rest in f64.
        (((pos as f32 / self.floor as f32).floor() as f64 + 1.0).ln() * self.scale as f64 + 1.0) as f32
    }
}

/// A MoE file's expert settings, as stated (llama.cpp's `LLM_KV_EXPERT_*` keys; HF's
/// `num_experts` / `n_routed_experts` / `num_local_experts` and their kin).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MoeParams {
    /// Routed experts.
    pub n_expert: usize,
    /// Experts per token.
    pub top_k: Option<usize>,
    /// Each routed expert's inner width.
    pub expert_ffn: Option<usize>,
    /// Shared experts.
    pub shared_count: usize,
    /// Each shared expert's inner width when stated (else the routed width).
    pub shared_ffn: Option<usize>,
    /// Leading dense layers (`leading_dense_block_count`, `first_k_dense_replace`).
    pub first_dense: usize,
    /// Per layer, whether it is dense, when the file lists it (Qwen3-MoE's `mlp_only_layers`
    /// and `decoder_sparse_step`).
    pub dense_layers: Option<Vec<bool>>,
    /// `routed_scaling_factor` (`expert_weights_scale`).
    pub weights_scale: Option<f32>,
    /// `norm_topk_prob` (`expert_weights_norm`).
    pub weights_norm: Option<bool>,
    /// The router's scoring when stated (`expert_gating_func`, `scoring_func`).
    pub scoring: Option<Scoring>,
    /// Expert groups (`expert_group_count`, `n_group`).
    pub n_group: Option<usize>,
    /// Groups kept per token (`expert_group_used_count`, `topk_group`).
    pub topk_group: Option<usize>,
}

/// Multi-head latent attention (DeepSeek-V2 §2.1) as a file states it.
#[derive(Debug, Clone, PartialEq)]
pub struct MlaParams {
    /// The query LoRA rank; 0: one query projection (DeepSeek-V2-Lite).
    pub q_lora_rank: usize,
    /// Latent width.
    pub kv_lora_rank: usize,
    /// A head's query/key width, non-rotary plus rotary.
    pub head_k: usize,
    /// A head's value width.
    pub v_dim: usize,
}

impl HParams {
    /// A head's query/key width: stated, else `hidden / heads`.
    ///
    /// # Errors
    /// A value width unlike the key width, or a hidden size the heads do not divide.
    pub fn head_dim(&self) -> Result<usize, EngineError> {
        let hd = match self.key_length {
            Some(k) => k,
            None if self.heads > 0 && self.hidden.is_multiple_of(self.heads) => self.hidden / self.heads,
            None => {
                return Err(EngineError::model(format!(
                    "{}: {} heads do not divide the hidden size {}",
                    self.source, self.heads, self.hidden
                )))
            }
        };
        if self.value_length.is_some_and(|v| v != hd) {
            return Err(EngineError::model(format!(
                "{}: attention.value_length differs from key_length ({hd})",
                self.source
            )));
        }
        Ok(hd)
    }

    /// The values of a head of `head_dim` RoPE rotates: stated, else all.
    ///
    /// # Errors
    /// A width that is odd, zero or wider than the head.
    pub fn rope_dims(&self, head_dim: usize) -> Result<usize, EngineError> {
        match self.rope.dims {
            Some(rd) if rd > head_dim || !rd.is_multiple_of(2) || rd == 0 => Err(EngineError::model(format!(
                "{}: rope.dimension_count = {rd}: not an even width within the {head_dim}-value head",
                self.source
            ))),
            Some(rd) => Ok(rd),
            None => Ok(head_dim),
        }
    }

    /// The MoE settings, or an error naming the key a MoE architecture needs.
    ///
    /// # Errors
    /// No expert settings in the file.
    pub fn need_moe(&self) -> Result<&MoeParams, EngineError> {
        self.moe
            .as_ref()
            .ok_or_else(|| EngineError::model(format!("{}: expert_count missing (a MoE architecture)", self.source)))
    }

    /// Value `v`, or an error naming `key` as missing (`what` says why it is needed).
    ///
    /// # Errors
    /// `v` is `None`.
    pub fn need<T>(&self, v: Option<T>, key: &str, what: &str) -> Result<T, EngineError> {
        v.ok_or_else(|| EngineError::model(format!("{}.{key} missing ({what})", self.source)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Llama 4's temperature factor at llama.cpp's positions: 1 within the first step.
    #[test]
    fn attention_temperature_steps_with_the_floor() {
        let t = AttnTemperature { scale: 0.1, floor: 8 };
        assert_eq!(t.factor(0), 1.0);
        assert_eq!(t.factor(7), 1.0);
        assert!((t.factor(8) - (1.0 + 0.1 * 2f32.ln())).abs() < 1e-7);
        assert!((t.factor(40) - (1.0 + 0.1 * 6f32.ln())).abs() < 1e-7);
    }
}
