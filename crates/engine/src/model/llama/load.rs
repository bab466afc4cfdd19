//! Building a [`LlamaModel`] from a file: a GGUF of a dense family (hyper-parameters from its
//! metadata, tensors by llama.cpp's names, kept at the file's block type) or a Hugging Face
//! directory (BF16/F32 or ModelOpt NVFP4); Q/K/V and gate/up fused into one matrix each.

use std::path::Path;

use ggus::GGufMetaMapExt;

use super::*;
use crate::checkpoint::gguf::{Gguf, GgufFile};
use crate::model::common::{check_rope_positions, RopeScaling, RopeTable};
use crate::model::moe::{Glu, Mlp, Moe};
use crate::model::routing::{Routing, Scoring};
use crate::model::vb::{
    GgufTensors, Vb, ATTENTION_SINKS, GEMMA3_LAYER_NAMES, LLAMA_LAYER_NAMES, MOE_FFN_NAMES, PHI3_LAYER_NAMES,
    POST_ATTENTION_NORM,
};

/// A dense architecture the Llama decoder runs, as data: what llama.cpp's graph for it does
/// differently from `llama` (`src/models/{llama,qwen2,qwen3,smollm3,phi3}.cpp`, the RoPE type from
/// `llama_model_rope_type` in `src/llama-model.cpp`) and what HF transformers' modeling file
/// does (`models/{llama,mistral,qwen2,qwen3,smollm3,phi3}/modeling_*.py`).
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// GGUF `general.architecture`.
    pub arch: &'static str,
    /// HF `config.json` `model_type`s read as this family.
    pub hf_model_types: &'static [&'static str],
    /// How a GGUF file pairs a head's values for RoPE: llama.cpp's NORM (adjacent pairs; the
    /// converter permuted HF's Q/K rows for it) or NEOX (halves, HF's own order). HF
    /// checkpoints are always in halves (`rotate_half`).
    pub gguf_rope: RopeLayout,
    /// Q, K and V carry biases, required (Qwen2). Biases of other families are read when the
    /// file has them, as llama.cpp does.
    pub qkv_bias: bool,
    /// Per-head RMSNorm of Q and K before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Per-head Q/K RMSNorm when the file has `attn_q_norm` (GLM-4.5: some sizes have it).
    pub qk_norm_if_present: bool,
    /// Every `n`-th layer (`(l + 1) % n == 0`) skips RoPE (SmolLM3's NoPE layers,
    /// llama.cpp's `n_no_rope_layer_step = 4`).
    pub no_rope_step: Option<usize>,
    /// `(HF, llama.cpp)` names of a layer's modules (`vb.rs`), tables searched in order: Phi-3's fused
    /// Q/K/V and gate/up live under their own names; MoE families add `MOE_FFN_NAMES`.
    pub layer_names: &'static [&'static [(&'static str, &'static str)]],
    /// A Mixture-of-Experts family's routing as llama.cpp's graph for it fixes it; `None` for
    /// a dense family.
    pub moe: Option<MoeFamily>,
    /// Sliding-window layers every `n` (`attention.sliding_window_pattern`, else this; layer
    /// `l` slides when `l % n < n − 1`, llama.cpp's `set_swa_pattern`), over
    /// `attention.sliding_window` keys; `None`: no sliding window.
    pub swa_pattern: Option<usize>,
}

/// What a MoE family's llama.cpp graph fixes and what it reads from the file
/// (`build_moe_ffn`'s `norm_w` and `gating_op` arguments in `src/models/{qwen3moe,glm4-moe}.cpp`).
#[derive(Debug, Clone, Copy)]
pub struct MoeFamily {
    /// The scoring the graph uses; `None`: the file's `expert_gating_func` (1 softmax, 2
    /// sigmoid, 3 softmax over the chosen; sigmoid when absent, as `glm4moe` defaults).
    pub scoring: Option<Scoring>,
    /// Whether the chosen weights are renormalized; `None`: the file's `expert_weights_norm`
    /// (false when absent).
    pub norm_topk_prob: Option<bool>,
    /// Whether `expert_weights_scale` applies (`routed_scaling_factor`).
    pub scaled: bool,
    /// The experts' activation.
    pub act: Glu,
}

/// Every dense family [`LlamaModel::load`] reads from GGUF besides `gemma3`, and
/// [`LlamaModel::load_hf`] from HF checkpoints.
pub const FAMILIES: &[Family] = &[
    Family {
        arch: "llama",
        hf_model_types: &["llama", "mistral"],
        gguf_rope: RopeLayout::Interleaved,
        qkv_bias: false,
        qk_norm: false,
        qk_norm_if_present: false,
        no_rope_step: None,
        layer_names: &[LLAMA_LAYER_NAMES],
        moe: None,
        swa_pattern: None,
    },
    Family {
        arch: "qwen2",
        hf_model_types: &["qwen2"],
        gguf_rope: RopeLayout::Halves,
        qkv_bias: true,
        qk_norm: false,
        qk_norm_if_present: false,
        no_rope_step: None,
        layer_names: &[LLAMA_LAYER_NAMES],
        moe: None,
        swa_pattern: None,
    },
    Family {
        arch: "qwen3",
        hf_model_types: &["qwen3"],
        gguf_rope: RopeLayout::Halves,
        qkv_bias: false,
        qk_norm: true,
        qk_norm_if_present: false,
        no_rope_step: None,
        layer_names: &[LLAMA_LAYER_NAMES],
        moe: None,
        swa_pattern: None,
    },
    Family {
        arch: "smollm3",
        hf_model_types: &["smollm3"],
        gguf_rope: RopeLayout::Interleaved,
        qkv_bias: false,
        qk_norm: false,
        qk_norm_if_present: false,
        no_rope_step: Some(4),
        layer_names: &[LLAMA_LAYER_NAMES],
        moe: None,
        swa_pattern: None,
    },
    Family {
        arch: "phi3",
        hf_model_types: &["phi3"],
        gguf_rope: RopeLayout::Halves,
        qkv_bias: false,
        qk_norm: false,
        qk_norm_if_present: false,
        no_rope_step: None,
        layer_names: &[PHI3_LAYER_NAMES],
        moe: None,
        swa_pattern: None,
    },
    // Qwen3-MoE: Qwen3's attention; softmax over all experts, the chosen renormalized
    // (`build_moe_ffn(…, norm_w = true, …, SOFTMAX)` whatever the file says).
    Family {
        arch: "qwen3moe",
        hf_model_types: &[],
        gguf_rope: RopeLayout::Halves,
        qkv_bias: false,
        qk_norm: true,
        qk_norm_if_present: false,
        no_rope_step: None,
        layer_names: &[LLAMA_LAYER_NAMES, MOE_FFN_NAMES],
        moe: Some(MoeFamily {
            scoring: Some(Scoring::Softmax),
            norm_topk_prob: Some(true),
            scaled: false,
            act: Glu::Silu,
        }),
        swa_pattern: None,
    },
    // GLM-4.5 / 4.6 / 4.7 (and Solar Open): Q/K/V biases, partial NEOX RoPE, optional Q/K norms,
    // the pre-FFN norm stored as `post_attention_norm`; leading dense layers, then sigmoid
    // routing with the selection bias, the file's renormalization and scale, shared experts.
    Family {
        arch: "glm4moe",
        hf_model_types: &[],
        gguf_rope: RopeLayout::Halves,
        qkv_bias: false,
        qk_norm: false,
        qk_norm_if_present: true,
        no_rope_step: None,
        layer_names: &[POST_ATTENTION_NORM, LLAMA_LAYER_NAMES, MOE_FFN_NAMES],
        moe: Some(MoeFamily { scoring: None, norm_topk_prob: None, scaled: true, act: Glu::Silu }),
        swa_pattern: None,
    },
    // gpt-oss (`src/models/openai-moe.cpp`): Q/K/V and output biases, attention sinks, NEOX RoPE
    // (YaRN in the files), every other layer a sliding window (even layers); the router's
    // bias, top-k by raw logit with a softmax over the chosen, experts with biases and the
    // clamped SwiGLU (alpha 1.702, limit 7).
    Family {
        arch: "gpt-oss",
        hf_model_types: &[],
        gguf_rope: RopeLayout::Halves,
        qkv_bias: true,
        qk_norm: false,
        qk_norm_if_present: false,
        no_rope_step: None,
        layer_names: &[POST_ATTENTION_NORM, ATTENTION_SINKS, LLAMA_LAYER_NAMES, MOE_FFN_NAMES],
        moe: Some(MoeFamily {
            scoring: Some(Scoring::SoftmaxSelected),
            norm_topk_prob: Some(false),
            scaled: false,
            act: Glu::SwigluOai { alpha: 1.702, limit: 7.0 },
        }),
        swa_pattern: Some(2),
    },
];

/// The GGUF architectures [`LlamaModel::load`] reads, for error messages.
pub fn gguf_architectures() -> Vec<&'static str> {
    FAMILIES.iter().map(|f| f.arch).chain(["gemma3", crate::model::glm5::gguf::ARCH]).collect()
}

/// The `{arch}.*` hyper-parameters of a dense-family GGUF file, by llama.cpp's key names
/// (`LLM_KV_*` in `src/llama-arch.cpp`), read through [`Gguf::arch_keys`].
#[derive(Debug, serde::Deserialize)]
pub(crate) struct GgufHparams {
    pub block_count: usize,
    pub embedding_length: usize,
    pub feed_forward_length: usize,
    pub context_length: usize,
    #[serde(rename = "attention.head_count")]
    pub head_count: usize,
    #[serde(rename = "attention.head_count_kv")]
    pub head_count_kv: Option<usize>,
    #[serde(rename = "attention.key_length")]
    pub key_length: Option<usize>,
    #[serde(rename = "attention.value_length")]
    pub value_length: Option<usize>,
    #[serde(rename = "attention.layer_norm_rms_epsilon")]
    pub rms_eps: Option<f32>,
    /// MLA (`deepseek2`): the query LoRA rank (absent or 0: one query projection).
    #[serde(rename = "attention.q_lora_rank")]
    pub q_lora_rank: Option<usize>,
    /// MLA: the latent width.
    #[serde(rename = "attention.kv_lora_rank")]
    pub kv_lora_rank: Option<usize>,
    /// MLA: a head's query/key width `nope + rope` when `key_length` states the absorbed
    /// `kv_lora + rope` (files converted since llama.cpp split `attn_kv_b`).
    #[serde(rename = "attention.key_length_mla")]
    pub key_length_mla: Option<usize>,
    /// MLA: a head's value width, likewise.
    #[serde(rename = "attention.value_length_mla")]
    pub value_length_mla: Option<usize>,
    #[serde(rename = "attention.sliding_window")]
    pub sliding_window: Option<usize>,
    #[serde(rename = "attention.sliding_window_pattern")]
    pub sliding_window_pattern: Option<usize>,
    #[serde(rename = "attention.scale")]
    pub attention_scale: Option<f32>,
    #[serde(rename = "rope.freq_base")]
    pub rope_freq_base: Option<f32>,
    #[serde(rename = "rope.dimension_count")]
    pub rope_dimension_count: Option<usize>,
    #[serde(rename = "rope.scaling.type")]
    pub rope_scaling_type: Option<String>,
    #[serde(rename = "rope.scaling.attn_factor")]
    pub rope_scaling_attn_factor: Option<f32>,
    #[serde(rename = "rope.scaling.original_context_length")]
    pub rope_scaling_original_context_length: Option<usize>,
    #[serde(rename = "rope.scaling.factor")]
    pub rope_scaling_factor: Option<f32>,
    #[serde(rename = "rope.scaling.yarn_log_multiplier")]
    pub rope_scaling_yarn_log_multiplier: Option<f32>,
    pub expert_count: Option<usize>,
    pub expert_used_count: Option<usize>,
    pub expert_feed_forward_length: Option<usize>,
    pub expert_shared_count: Option<usize>,
    pub expert_shared_feed_forward_length: Option<usize>,
    pub leading_dense_block_count: Option<usize>,
    pub expert_weights_scale: Option<f32>,
    pub expert_weights_norm: Option<bool>,
    pub expert_gating_func: Option<u32>,
    pub expert_group_count: Option<usize>,
    pub expert_group_used_count: Option<usize>,
    /// Mistral Large 3's attention temperature tuning (`deepseek2`), refused when set.
    #[serde(rename = "attention.temperature_scale")]
    pub attention_temperature_scale: Option<f32>,
    /// Multi-token-prediction layers after the trunk (GLM-4.5's NextN): counted in
    /// `block_count`, not run for the next token.
    pub nextn_predict_layers: Option<usize>,
}

impl GgufHparams {
    /// A MoE family's feed-forward from the `expert_*` keys, read as llama.cpp reads them for
    /// `fam` (`llama_model::load_hparams`).
    ///
    /// # Errors
    /// A missing `expert_count`, `expert_used_count` or `expert_feed_forward_length`, or an
    /// unknown gating function, named with the key.
    pub(crate) fn moe(&self, arch: &str, fam: &MoeFamily) -> Result<MoeConfig, EngineError> {
        let need = |v: Option<usize>, key: &str| {
            v.ok_or_else(|| EngineError::model(format!("{arch}.{key} missing (a MoE architecture)")))
        };
        let n_expert = need(self.expert_count, "expert_count")?;
        let expert_ffn = need(self.expert_feed_forward_length, "expert_feed_forward_length")?;
        let scoring = match fam.scoring {
            Some(s) => s,
            None => match self.expert_gating_func.unwrap_or(0) {
                1 => Scoring::Softmax,
                0 | 2 => Scoring::Sigmoid,
                3 => Scoring::SoftmaxSelected,
                g => return Err(EngineError::model(format!("{arch}.expert_gating_func = {g}: not 1, 2 or 3"))),
            },
        };
        let shared = self.expert_shared_count.unwrap_or(0);
        let n_group = self.expert_group_count.unwrap_or(1).max(1);
        Ok(MoeConfig {
            act: fam.act,
            n_expert,
            expert_ffn,
            shared_ffn: shared * self.expert_shared_feed_forward_length.unwrap_or(expert_ffn),
            first_dense: self.leading_dense_block_count.unwrap_or(0),
            routing: Routing {
                scoring,
                top_k: need(self.expert_used_count, "expert_used_count")?,
                norm_topk_prob: fam.norm_topk_prob.unwrap_or(self.expert_weights_norm.unwrap_or(false)),
                // llama.cpp scales by neither 0 (the key's default) nor 1.
                scaling: match self.expert_weights_scale {
                    Some(s) if fam.scaled && s != 0.0 => s,
                    _ => 1.0,
                },
                n_group,
                topk_group: self.expert_group_used_count.unwrap_or(n_group),
            },
        })
    }

    /// Reads `{arch}.*` of `ld`.
    ///
    /// # Errors
    /// A missing or mistyped key, named with the architecture.
    pub(crate) fn read(ld: &Gguf<'_>, arch: &str) -> Result<GgufHparams, EngineError> {
        let hp: GgufHparams = serde_json::from_value(serde_json::Value::Object(ld.arch_keys(arch)))
            .map_err(|e| EngineError::model(format!("{arch} GGUF metadata: {e}")))?;
        // Per-layer settings are sized by the count before any layer's tensors are read.
        ld.check_layers(&format!("{arch}.block_count"), hp.block_count)?;
        Ok(hp)
    }

    /// Per-head width: `attention.key_length` when stated (Qwen3: 128 with 2560 hidden and 32
    /// heads), else `embedding_length / head_count`.
    ///
    /// # Errors
    /// A value length unlike the key length, or a hidden size the heads do not divide.
    pub(crate) fn head_dim(&self, arch: &str) -> Result<usize, EngineError> {
        let hd = match self.key_length {
            Some(k) => k,
            None if self.head_count > 0 && self.embedding_length.is_multiple_of(self.head_count) => {
                self.embedding_length / self.head_count
            }
            None => {
                return Err(EngineError::model(format!(
                    "{arch}: {} heads do not divide the hidden size {}",
                    self.head_count, self.embedding_length
                )))
            }
        };
        if self.value_length.is_some_and(|v| v != hd) {
            return Err(EngineError::model(format!("{arch}: attention.value_length differs from key_length ({hd})")));
        }
        Ok(hd)
    }

    /// The values of a head RoPE rotates (`rope.dimension_count`, else all), refusing RoPE the
    /// decoder does not apply: scaling other than `none` (Llama 3's factors come as the
    /// `rope_freqs` tensor, Phi-3's LongRoPE as `rope_factors_{short,long}`) and a rotary
    /// width that is odd or wider than the head.
    ///
    /// # Errors
    /// Naming the key and value.
    pub(crate) fn rope_dims(&self, arch: &str, head_dim: usize) -> Result<usize, EngineError> {
        if let Some(s) = self.rope_scaling_type.as_deref().filter(|s| *s != "none") {
            return Err(EngineError::model(format!(
                "{arch}.rope.scaling.type = {s:?} is not supported (none, Llama 3's rope_freqs tensor, \
                 or LongRoPE's rope_factors_short/long tensors)"
            )));
        }
        self.rotary_width(arch, head_dim)
    }

    /// The values of a head RoPE rotates, `rope.dimension_count` or all.
    ///
    /// # Errors
    /// A width that is odd, zero or wider than the head.
    fn rotary_width(&self, arch: &str, head_dim: usize) -> Result<usize, EngineError> {
        match self.rope_dimension_count {
            Some(rd) if rd > head_dim || !rd.is_multiple_of(2) || rd == 0 => Err(EngineError::model(format!(
                "{arch}.rope.dimension_count = {rd}: not an even width within the {head_dim}-value head"
            ))),
            Some(rd) => Ok(rd),
            None => Ok(head_dim),
        }
    }
}

impl GgufHparams {
    /// The rotary width and RoPE scaling of a file of the Llama decoder's families, read as
    /// llama.cpp reads them (`llama_model_base::load_hparams`, `llama_context`): `rope.scaling.
    /// type` `none` or absent (no scaling; absent with a `rope.scaling.factor` is linear, as
    /// llama.cpp defaults the type to `linear`), `linear`, or `yarn` with
    /// `rope.scaling.factor` and `original_context_length` (default: the context length).
    ///
    /// # Errors
    /// Another scaling type, DeepSeek's `yarn_log_multiplier` (its attention-scale rule is not
    /// the Llama decoder's), or a bad rotary width, naming the key.
    pub(crate) fn rope_width_scaling(
        &self,
        arch: &str,
        head_dim: usize,
    ) -> Result<(usize, Option<RopeScaling>), EngineError> {
        let width = self.rotary_width(arch, head_dim)?;
        let factor = self.rope_scaling_factor.filter(|f| *f != 0.0).map(f64::from);
        let scaling = match (self.rope_scaling_type.as_deref(), factor) {
            (None | Some("none"), _) | (Some("linear" | "yarn"), None) => None,
            (Some("linear"), Some(f)) => Some(RopeScaling::linear(f)),
            (Some("yarn"), Some(f)) => {
                if self.rope_scaling_yarn_log_multiplier.is_some_and(|m| m != 0.0) {
                    return Err(EngineError::model(format!(
                        "{arch}.rope.scaling.yarn_log_multiplier is set: DeepSeek's YaRN attention scale is not \
                         supported on this architecture"
                    )));
                }
                let orig = self.rope_scaling_original_context_length.unwrap_or(self.context_length);
                Some(RopeScaling::yarn(f, orig))
            }
            (Some(s), _) => {
                return Err(EngineError::model(format!(
                    "{arch}.rope.scaling.type = {s:?} is not supported (none, linear, yarn, Llama 3's \
                     rope_freqs tensor, or LongRoPE's rope_factors_short/long tensors)"
                )))
            }
        };
        Ok((width, scaling))
    }
}

/// The hyper-parameters of a GGUF file of family `fam`.
fn gguf_config(ld: &Gguf<'_>, fam: &Family) -> Result<LlamaConfig, EngineError> {
    let arch = fam.arch;
    let hp = GgufHparams::read(ld, arch)?;
    let head_dim = hp.head_dim(arch)?;
    let (rope_dims, rope_scaling) = hp.rope_width_scaling(arch, head_dim)?;
    // LongRoPE (Phi-3.5, Phi-4-mini): the long factors when the context is past the original
    // one, as llama.cpp chooses them by its context (`llama_model::get_rope_factors`); here
    // the context is the trained one the server offers.
    let long = hp.rope_scaling_original_context_length.is_some_and(|orig| hp.context_length > orig);
    let factors = ["rope_freqs.weight", if long { "rope_factors_long.weight" } else { "rope_factors_short.weight" }];
    let rope_freq_factors = match factors.iter().find(|n| ld.has_tensor(n)) {
        Some(n) => Some(ld.vector(n, rope_dims / 2)?),
        None => None,
    };
    // The trunk: llama.cpp's `n_layer()`, `block_count` less the NextN layers, which serve
    // only speculative decoding.
    let layers = hp.block_count.saturating_sub(hp.nextn_predict_layers.unwrap_or(0));
    let rope_base = hp.rope_freq_base.unwrap_or(10000.0);
    let mut variant = Variant::llama(layers, head_dim, rope_base);
    variant.rope_dims = rope_dims;
    variant.rope_attn_factor = hp.rope_scaling_attn_factor.unwrap_or(1.0);
    variant.rope_scaling = rope_scaling;
    if let Some(default) = fam.swa_pattern {
        let w = hp.sliding_window.ok_or_else(|| {
            EngineError::model(format!("{arch}.attention.sliding_window missing (its sliding-window layers need it)"))
        })?;
        let n = hp.sliding_window_pattern.unwrap_or(default).max(1);
        variant.windows = (0..layers).map(|l| (l % n < n - 1).then_some(w)).collect();
    }
    variant.rope_layout = fam.gguf_rope;
    variant.qk_norm = fam.qk_norm || (fam.qk_norm_if_present && ld.has_tensor("blk.0.attn_q_norm.weight"));
    variant.rope_freq_factors = rope_freq_factors;
    variant.no_rope = no_rope_layers(layers, fam.no_rope_step);
    let moe = match &fam.moe {
        Some(m) => Some(hp.moe(arch, m)?),
        None => None,
    };
    Ok(LlamaConfig {
        layers,
        hidden: hp.embedding_length,
        ffn: hp.feed_forward_length,
        heads: hp.head_count,
        kv_heads: hp.head_count_kv.unwrap_or(hp.head_count),
        head_dim,
        rope_base,
        rms_eps: hp.rms_eps.unwrap_or(1e-5),
        vocab: ld.embedding_rows()?,
        context_length: hp.context_length,
        variant,
        moe,
    })
}

/// Which layers skip RoPE when every `step`-th does.
fn no_rope_layers(layers: usize, step: Option<usize>) -> Vec<bool> {
    (0..layers).map(|l| step.is_some_and(|n| n > 0 && (l + 1) % n == 0)).collect()
}

fn default_theta() -> f64 {
    10000.0
}

fn default_hf_eps() -> f64 {
    1e-6
}

/// The `config.json` of a dense HF checkpoint (the fields transformers' `LlamaConfig`,
/// `MistralConfig`, `Qwen2Config`, `Qwen3Config` and `SmolLM3Config` share).
#[derive(Debug, serde::Deserialize)]
struct HfConfig {
    model_type: String,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "default_theta")]
    rope_theta: f64,
    #[serde(default = "default_hf_eps")]
    rms_norm_eps: f64,
    vocab_size: usize,
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    rope_scaling: Option<HfRopeScaling>,
    /// Mistral: every layer attends over this many keys when set.
    sliding_window: Option<usize>,
    /// Qwen2/Qwen3 state a `sliding_window` but use it only with this set.
    use_sliding_window: Option<bool>,
    /// SmolLM3: 1 where a layer applies RoPE, 0 where it does not.
    no_rope_layers: Option<Vec<u8>>,
    /// Phi-4-mini: the share of a head RoPE rotates.
    partial_rotary_factor: Option<f64>,
    /// Phi-3: the context LongRoPE extends.
    original_max_position_embeddings: Option<usize>,
}

/// HF's `rope_scaling` block.
#[derive(Debug, serde::Deserialize)]
struct HfRopeScaling {
    rope_type: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<usize>,
    /// LongRoPE (Phi-3.5, Phi-4-mini): per-pair factors past and within the original context.
    long_factor: Option<Vec<f64>>,
    short_factor: Option<Vec<f64>>,
    attention_factor: Option<f64>,
}

/// Llama 3's RoPE frequency factors, one per pair of a `head_dim` head, as llama.cpp's
/// converter computes the `rope_freqs` tensor (`convert_hf_to_gguf.py`, `LlamaModel.
/// generate_extra_tensors`; HF `_compute_llama3_parameters`): wavelengths below
/// `old_ctx / high` keep their frequency, those above `old_ctx / low` are divided by
/// `factor`, and the band between is interpolated.
pub fn llama3_rope_factors(base: f64, head_dim: usize, factor: f64, low: f64, high: f64, old_ctx: f64) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / base.powf(2.0 * i as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = if wavelen < old_ctx / high {
                1.0
            } else if wavelen > old_ctx / low {
                factor
            } else {
                let smooth = (old_ctx / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            f as f32
        })
        .collect()
}

impl HfConfig {
    fn to_config(&self, fam: &Family) -> Result<LlamaConfig, EngineError> {
        let (hidden, heads) = (self.hidden_size, self.num_attention_heads);
        let head_dim = match self.head_dim {
            Some(d) => d,
            None if heads > 0 && hidden.is_multiple_of(heads) => hidden / heads,
            None => {
                return Err(EngineError::model(format!(
                    "config.json: {heads} heads do not divide hidden_size {hidden}"
                )))
            }
        };
        let layers = self.num_hidden_layers;
        let rope_base = self.rope_theta as f32;
        let rope_dims = match self.partial_rotary_factor {
            Some(f) => ((head_dim as f64 * f) as usize) & !1,
            None => head_dim,
        };
        let mut rope_attn_factor = 1.0;
        let rope_freq_factors = match &self.rope_scaling {
            None => None,
            Some(r) => {
                let kind = r.rope_type.as_deref().or(r.legacy_type.as_deref()).unwrap_or("");
                let orig = r.original_max_position_embeddings.or(self.original_max_position_embeddings);
                match (kind, r.factor, r.low_freq_factor, r.high_freq_factor, orig) {
                    ("llama3", Some(f), Some(lo), Some(hi), Some(old)) => {
                        Some(llama3_rope_factors(self.rope_theta, rope_dims, f, lo, hi, old as f64))
                    }
                    ("longrope" | "su", _, _, _, Some(orig)) => {
                        // HF `_compute_longrope_parameters`: the attention factor from the
                        // extension ratio; the long factors past the original context, chosen
                        // once from the context offered (as llama.cpp does), not per sequence.
                        let ext = self.max_position_embeddings as f64 / orig as f64;
                        rope_attn_factor = r.attention_factor.unwrap_or(match ext > 1.0 {
                            true => (1.0 + ext.ln() / (orig as f64).ln()).sqrt(),
                            false => 1.0,
                        }) as f32;
                        let f = if ext > 1.0 { &r.long_factor } else { &r.short_factor };
                        match f {
                            Some(f) if f.len() == rope_dims / 2 => Some(f.iter().map(|&x| x as f32).collect()),
                            _ => {
                                return Err(EngineError::model(format!(
                                "config.json: rope_scaling longrope needs long_factor and short_factor of {} values",
                                rope_dims / 2
                            )))
                            }
                        }
                    }
                    ("default", ..) => None,
                    _ => {
                        return Err(EngineError::model(format!(
                            "config.json: rope_scaling {kind:?} is not supported (llama3 with factor, \
                             low_freq_factor, high_freq_factor and original_max_position_embeddings; longrope)"
                        )))
                    }
                }
            }
        };
        let mut variant = Variant::llama(layers, head_dim, rope_base);
        variant.rope_dims = rope_dims;
        variant.rope_attn_factor = rope_attn_factor;
        variant.rope_layout = RopeLayout::Halves;
        variant.qk_norm = fam.qk_norm;
        variant.rope_freq_factors = rope_freq_factors;
        variant.no_rope = match &self.no_rope_layers {
            Some(v) if v.len() == layers => v.iter().map(|&r| r == 0).collect(),
            Some(v) => {
                return Err(EngineError::model(format!(
                    "config.json: no_rope_layers has {} entries for {layers} layers",
                    v.len()
                )))
            }
            None => no_rope_layers(layers, fam.no_rope_step),
        };
        if let Some(w) = self.sliding_window.filter(|_| self.use_sliding_window.unwrap_or(true)) {
            if w < self.max_position_embeddings {
                variant.windows = vec![Some(w); layers];
            }
        }
        Ok(LlamaConfig {
            layers,
            hidden,
            ffn: self.intermediate_size,
            heads,
            kv_heads: self.num_key_value_heads.unwrap_or(heads),
            head_dim,
            rope_base,
            rms_eps: self.rms_norm_eps as f32,
            vocab: self.vocab_size,
            context_length: self.max_position_embeddings,
            variant,
            moe: None,
        })
    }
}

/// Decoder layer `vb` (`model.layers.{l}`), by HF module names (a GGUF file maps them to
/// llama.cpp's, [`GgufTensors`]). Q/K/V and gate/up are stacked, each a single matmul; a
/// projection's bias is taken when the file has one, and required for Q/K/V where the family
/// says so.
fn load_layer(vb: &Vb<'_>, l: usize, cfg: &LlamaConfig, fam: &Family) -> Result<Layer, EngineError> {
    let (hidden, hd, qd, kvd) = (cfg.hidden, cfg.head_dim, cfg.q_dim(), cfg.kv_heads * cfg.head_dim);
    let (attn, mlp) = (vb.pp("self_attn"), vb.pp("mlp"));
    // Phi-3 files keep Q/K/V and gate/up fused already, in the order the forward stacks them.
    let qkv = match attn.has("qkv_proj.weight") {
        true => vec![attn.linear("qkv_proj", qd + 2 * kvd, hidden)?],
        false => vec![
            attn.linear("q_proj", qd, hidden)?,
            attn.linear("k_proj", kvd, hidden)?,
            attn.linear("v_proj", kvd, hidden)?,
        ],
    };
    let ffn = match &cfg.moe {
        Some(m) if l >= m.first_dense => FeedForward::Moe(Box::new(load_moe(&mlp, hidden, m)?)),
        _ => {
            let gate_up = match mlp.has("gate_up_proj.weight") {
                true => vec![mlp.linear("gate_up_proj", 2 * cfg.ffn, hidden)?],
                false => vec![mlp.linear("gate_proj", cfg.ffn, hidden)?, mlp.linear("up_proj", cfg.ffn, hidden)?],
            };
            FeedForward::Dense { gate_up: Linear::stack(gate_up), down: mlp.linear("down_proj", hidden, cfg.ffn)? }
        }
    };
    if fam.qkv_bias {
        if let Some(l) = qkv.iter().find(|l| l.bias.is_none()) {
            return Err(EngineError::model(format!(
                "{}: {}.bias missing ({} has Q/K/V biases)",
                fam.arch, l.modules[0], fam.arch
            )));
        }
    }
    let pair = |a: &str, b: &str, len: usize| -> Result<(Vec<f32>, Vec<f32>), EngineError> {
        Ok((vb.vector(a, len)?, vb.vector(b, len)?))
    };
    let post_norms = cfg.variant.post_norms;
    Ok(Layer {
        attn_norm: vb.vector("input_layernorm.weight", hidden)?,
        qkv: Linear::stack(qkv),
        wo: attn.linear("o_proj", hidden, qd)?,
        ffn_norm: match post_norms {
            true => vb.vector("pre_feedforward_layernorm.weight", hidden)?,
            false => vb.vector("post_attention_layernorm.weight", hidden)?,
        },
        ffn,
        qk_norm: match cfg.variant.qk_norm {
            true => Some(pair("self_attn.q_norm.weight", "self_attn.k_norm.weight", hd)?),
            false => None,
        },
        post_norms: match post_norms {
            true => Some(pair("post_attention_layernorm.weight", "post_feedforward_layernorm.weight", hidden)?),
            false => None,
        },
        sinks: match vb.has("self_attn.sinks") {
            true => Some(vb.vector("self_attn.sinks", cfg.heads)?),
            false => None,
        },
    })
}

/// A MoE layer's feed-forward under `mlp` (`model.layers.L.mlp`): the router `gate`, its
/// selection bias when the file has one, the routed experts (gate and up stacked per expert)
/// and the shared experts.
pub(crate) fn load_moe(mlp: &Vb<'_>, hidden: usize, m: &MoeConfig) -> Result<Moe, EngineError> {
    let (n, inter) = (m.n_expert, m.expert_ffn);
    let ex = mlp.pp("experts");
    // Each projection's experts, with their biases when the file has them (gpt-oss: one
    // `[rows, n_expert]` tensor per projection, expert `e`'s rows at `e · rows`).
    let proj = |name: &str, rows: usize, cols: usize| -> Result<Vec<Linear>, EngineError> {
        let mut ls = ex.experts(name, n, rows, cols)?;
        let b = format!("{name}.bias");
        if ex.has(&b) {
            let all = ex.vector(&b, n * rows)?;
            for (l, b) in ls.iter_mut().zip(all.chunks_exact(rows)) {
                l.bias = Some(b.to_vec());
            }
        }
        Ok(ls)
    };
    let gates = proj("gate_proj", inter, hidden)?;
    let ups = proj("up_proj", inter, hidden)?;
    let downs = proj("down_proj", hidden, inter)?;
    let experts = gates
        .into_iter()
        .zip(ups)
        .zip(downs)
        .map(|((g, u), down)| Mlp { gate_up: Linear::stack(vec![g, u]), down, inter, act: m.act })
        .collect();
    let shared = match m.shared_ffn {
        0 => None,
        si => {
            let sv = mlp.pp("shared_experts");
            let gate_up = Linear::stack(vec![sv.linear("gate_proj", si, hidden)?, sv.linear("up_proj", si, hidden)?]);
            Some(Mlp { gate_up, down: sv.linear("down_proj", hidden, si)?, inter: si, act: m.act })
        }
    };
    let opt = |name: &str| -> Result<Option<Vec<f32>>, EngineError> {
        if mlp.has(name) {
            Ok(Some(mlp.vector(name, n)?))
        } else {
            Ok(None)
        }
    };
    Ok(Moe {
        gate: mlp.matrix("gate", n, hidden)?,
        gate_bias: opt("gate.bias")?,
        bias: opt("gate.e_score_correction_bias")?,
        routing: m.routing,
        experts,
        shared,
    })
}

/// Gemma 3 in the decoder's terms: plain Llama's family data (its differences are in
/// [`Variant`], read by [`crate::model::gemma3::config`]).
const GEMMA3: Family = Family {
    arch: "gemma3",
    hf_model_types: &[],
    gguf_rope: RopeLayout::Halves,
    qkv_bias: false,
    qk_norm: true,
    qk_norm_if_present: false,
    no_rope_step: None,
    layer_names: &[GEMMA3_LAYER_NAMES],
    moe: None,
    swa_pattern: None,
};

impl LlamaModel {
    /// Loads a GGUF file of a dense family keyed by `general.architecture`: a [`FAMILIES`] row
    /// (`llama`, `qwen2`, `qwen3`, `smollm3`, `phi3`) or `gemma3` ([`crate::model::gemma3`]);
    /// `threads` is the size of the compute pool. The families share this loader and the
    /// layer's HF module names; each reads its own hyper-parameters and names its tensors.
    ///
    /// # Errors
    /// [`EngineError::Model`] for an unreadable file, another architecture, a missing tensor,
    /// a tensor the family does not use, an unsupported tensor type or inconsistent shapes.
    pub fn load(path: &Path, threads: usize) -> Result<Self, EngineError> {
        // Mapped only while the weights are copied into our own layout.
        let file = GgufFile::open(path)?;
        let ld = file.view()?;
        let arch = ld
            .meta()
            .general_architecture()
            .map_err(|e| EngineError::model(format!("general.architecture: {e:?}")))?
            .to_owned();
        let (fam, cfg) = match arch.as_str() {
            "gemma3" => (GEMMA3, crate::model::gemma3::config(&ld)?),
            a => match FAMILIES.iter().find(|f| f.arch == a) {
                Some(f) => (*f, gguf_config(&ld, f)?),
                None => {
                    return Err(EngineError::model(format!(
                        "{}: architecture {a:?} is not supported (GGUF: {})",
                        path.display(),
                        gguf_architectures().join(", ")
                    )))
                }
            },
        };
        cfg.check()?;
        check_rope_positions(&format!("{arch}.context_length"), cfg.context_length, cfg.head_dim, ld.file_len())?;
        let (hidden, vocab) = (cfg.hidden, cfg.vocab);
        let src = GgufTensors { ld: &ld, layer_names: fam.layer_names, threads };
        let root = Vb::new(&src);
        let embed = root.matrix("model.embed_tokens", vocab, hidden)?;
        let output = match root.has("lm_head.weight") {
            true => Some(root.matrix("lm_head", vocab, hidden)?),
            false => None,
        };
        let vb = root.pp("model.layers");
        let layers = (0..cfg.layers).map(|l| load_layer(&vb.pp(l), l, &cfg, &fam)).collect::<Result<Vec<_>, _>>()?;
        let output_norm = root.vector("model.norm.weight", hidden)?;
        // LongRoPE files hold factors for both regimes; one is used.
        ld.check_all_read(&arch, cfg.layers, |n| n.starts_with("rope_factors_"))?;
        let name = ld.meta().general_name().unwrap_or("unnamed").to_owned();
        let mut m = Self::assemble(cfg, arch, name, embed, output, output_norm, layers, threads)?;
        m.info.file_weight_bytes = Some(ld.read_bytes());
        Ok(m)
    }

    /// Loads a Hugging Face checkpoint directory of a dense family ([`FAMILIES`]' `model_type`s:
    /// `llama`, `mistral`, `qwen2`, `qwen3`, `smollm3`; `config.json`, safetensors weights,
    /// optionally ModelOpt NVFP4, e.g. from `sparrow quantize`), with Llama 3's `rope_scaling`.
    ///
    /// HF stores Q and K for `rotate_half` RoPE (pairs `(i, i + d/2)` of a head), which the
    /// forward rotates as they are ([`RopeLayout::Halves`]).
    ///
    /// # Errors
    /// As [`Checkpoint::open`](crate::checkpoint::hf::Checkpoint::open), plus another
    /// `model_type`, unsupported RoPE scaling, or tensors of the wrong shape.
    pub fn load_hf(dir: &Path, threads: usize) -> Result<Self, EngineError> {
        let ck = crate::checkpoint::hf::Checkpoint::open(dir)?;
        let hf: HfConfig = serde_json::from_value(ck.config.clone())
            .map_err(|e| EngineError::model(format!("{}: config.json: {e}", dir.display())))?;
        ck.check_layers("num_hidden_layers", hf.num_hidden_layers)?;
        let fam = FAMILIES.iter().find(|f| f.hf_model_types.contains(&hf.model_type.as_str())).ok_or_else(|| {
            let known: Vec<&str> = FAMILIES.iter().flat_map(|f| f.hf_model_types.iter().copied()).collect();
            EngineError::model(format!(
                "{}: config.json model_type {:?}: the dense loader reads {}",
                dir.display(),
                hf.model_type,
                known.join(", ")
            ))
        })?;
        let cfg = hf.to_config(fam)?;
        cfg.check()?;
        check_rope_positions("max_position_embeddings", cfg.context_length, cfg.head_dim, ck.file_bytes())?;
        let hidden = cfg.hidden;
        let (es, ed) = ck.f32("model.embed_tokens.weight")?;
        if es != [cfg.vocab, hidden] {
            return Err(EngineError::model(format!(
                "model.embed_tokens.weight: shape {es:?}, want [{}, {hidden}]",
                cfg.vocab
            )));
        }
        let embed = Weight::Dense { rows: cfg.vocab, cols: hidden, data: ed };
        let tied = hf.tie_word_embeddings || !ck.has("lm_head.weight");
        let output = if tied { None } else { Some(ck.linear("lm_head", cfg.vocab, hidden)?) };
        let vb = Vb::new(&ck).pp("model.layers");
        let layers = (0..cfg.layers).map(|l| load_layer(&vb.pp(l), l, &cfg, fam)).collect::<Result<Vec<_>, _>>()?;
        let output_norm = ck.vector("model.norm.weight", hidden)?;
        let name = dir.file_name().map_or(hf.model_type.clone(), |n| n.to_string_lossy().into_owned());
        Self::assemble(cfg, fam.arch.into(), name, embed, output, output_norm, layers, threads)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn assemble(
        cfg: LlamaConfig,
        arch: String,
        name: String,
        embed: Weight,
        output: Option<Weight>,
        output_norm: Vec<f32>,
        layers: Vec<Layer>,
        threads: usize,
    ) -> Result<Self, EngineError> {
        let (ff, dims, m) =
            (cfg.variant.rope_freq_factors.as_deref(), cfg.variant.rope_dims, cfg.variant.rope_attn_factor);
        // One table per RoPE base, under the file's scaling (YaRN / linear) or none.
        let table = |base: f32| match &cfg.variant.rope_scaling {
            Some(s) => RopeTable::llama_cpp_yarn(base as f64, dims, cfg.context_length, ff, s, s.mscale(m as f64)),
            None => RopeTable::llama_cpp_scaled(base as f64, dims, cfg.context_length, ff).scaled_by(m),
        };
        let rope = table(cfg.rope_base);
        let local = cfg.variant.windows.iter().any(Option::is_some) && cfg.variant.rope_local_base != cfg.rope_base;
        let rope_local = local.then(|| table(cfg.variant.rope_local_base));
        let mut wbytes = embed.bytes() + output.as_ref().map_or(0, Weight::bytes) + 4 * output_norm.len();
        let vec_bytes = |v: &Option<(Vec<f32>, Vec<f32>)>| v.as_ref().map_or(0, |(a, b)| 4 * (a.len() + b.len()));
        for l in &layers {
            wbytes += [&l.qkv, &l.wo].iter().map(|x| x.weight.bytes()).sum::<usize>() + l.ffn.bytes();
            wbytes += 4 * (l.attn_norm.len() + l.ffn_norm.len()) + vec_bytes(&l.qk_norm) + vec_bytes(&l.post_norms);
        }
        wbytes += cfg.variant.rope_freq_factors.as_ref().map_or(0, |f| 4 * f.len());
        let info = ModelInfo {
            architecture: arch,
            name,
            vocab_size: cfg.vocab,
            context_length: cfg.context_length,
            num_layers: cfg.layers,
            hidden_size: cfg.hidden,
            weight_bytes: wbytes,
            file_weight_bytes: None,
            active_weight_bytes: None,
        };
        let pool = ThreadPool::new(threads).map_err(|e| EngineError::model(format!("thread pool: {e}")))?;
        let mut info = info;
        let moes = layers.iter().filter_map(|l| match &l.ffn {
            FeedForward::Moe(m) => Some(&**m),
            FeedForward::Dense { .. } => None,
        });
        info.active_weight_bytes =
            crate::model::moe::active_weight_bytes(info.weight_bytes, moes, &embed, output.is_some());
        Ok(LlamaModel {
            cfg,
            info,
            embed,
            output,
            output_norm,
            layers,
            rope,
            rope_local,
            pool,
            isa: Isa::detect(),
            s: LayerBuffers::default(),
            inst: Instruments::default(),
            kv_dtype: KvDtype::F16,
            moe: MoeChoice::Fixed(MoeImpl::ExpertMajor),
            embedding: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(v: serde_json::Value) -> Result<LlamaConfig, EngineError> {
        let hf: HfConfig = serde_json::from_value(v).expect("config.json");
        let fam = FAMILIES.iter().find(|f| f.hf_model_types.contains(&hf.model_type.as_str())).expect("family");
        hf.to_config(fam)
    }

    /// Fields of real `config.json` files (Qwen2.5-1.5B-Instruct, Mistral-7B-v0.1,
    /// Phi-4-mini-instruct, Llama-3.2-1B) read as transformers reads them.
    #[test]
    fn hf_configs_of_the_families() {
        let qwen = cfg(serde_json::json!({
            "model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
            "num_attention_heads": 12, "num_key_value_heads": 2, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
            "vocab_size": 151936, "max_position_embeddings": 32768, "tie_word_embeddings": true,
            "sliding_window": 32768, "use_sliding_window": false, "max_window_layers": 21
        }))
        .expect("qwen2");
        assert_eq!((qwen.head_dim, qwen.kv_heads, qwen.variant.rope_layout), (128, 2, RopeLayout::Halves));
        assert!(qwen.variant.windows.iter().all(Option::is_none), "use_sliding_window is false");
        let mistral = cfg(serde_json::json!({
            "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 10000.0, "rms_norm_eps": 1e-05,
            "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096
        }))
        .expect("mistral");
        assert!(mistral.variant.windows.iter().all(|w| *w == Some(4096)));
        let long: Vec<f64> = (0..48).map(|i| 1.0 + i as f64).collect();
        let phi = cfg(serde_json::json!({
            "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
            "num_attention_heads": 24, "num_key_value_heads": 8, "rope_theta": 10000.0, "rms_norm_eps": 1e-05,
            "vocab_size": 200064, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
            "partial_rotary_factor": 0.75,
            "rope_scaling": {"type": "longrope", "long_factor": long, "short_factor": vec![1.0; 48]}
        }))
        .expect("phi3");
        assert_eq!((phi.head_dim, phi.variant.rope_dims), (128, 96));
        assert_eq!(phi.variant.rope_freq_factors.as_deref().map(|f| f[47]), Some(48.0), "long factors past 4096");
        // √(1 + ln(131072 / 4096) / ln 4096), HF's LongRoPE attention factor.
        assert!((phi.variant.rope_attn_factor - 1.190238).abs() < 1e-5, "{}", phi.variant.rope_attn_factor);
        let llama = cfg(serde_json::json!({
            "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "rope_theta": 500000.0,
            "vocab_size": 128256, "max_position_embeddings": 131072,
            "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192}
        }))
        .expect("llama");
        let ff = llama.variant.rope_freq_factors.expect("llama3 factors");
        assert_eq!((ff.len(), ff[0], ff[31]), (32, 1.0, 32.0));
        let yarn = cfg(serde_json::json!({
            "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 1, "vocab_size": 8, "max_position_embeddings": 8,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0}
        }));
        assert!(yarn.expect_err("refused").to_string().contains("\"yarn\" is not supported"));
    }
}
