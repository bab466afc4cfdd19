//! [`HParams`] from a GGUF file: the `{arch}.*` keys by llama.cpp's names (`LLM_KV_*` in
//! `src/llama-arch.cpp`), read as `llama_model::load_hparams` and `llama_context` read them,
//! and the RoPE factor tensors (`rope_freqs`, `rope_factors_{long,short}`).

use super::{AttnTemperature, HParams, LinearAttnParams, MlaParams, MoeParams, Rope, Window};
use crate::checkpoint::gguf::Gguf;
use crate::model::common::RopeScaling;
use crate::model::routing::Scoring;
use crate::EngineError;

/// The `{arch}.*` keys, through serde (unknown keys ignored).
#[derive(Debug, serde::Deserialize)]
struct Keys {
    block_count: usize,
    embedding_length: usize,
    #[serde(default)]
    feed_forward_length: PerLayer,
    context_length: usize,
    #[serde(rename = "attention.head_count")]
    head_count: usize,
    #[serde(rename = "attention.head_count_kv")]
    head_count_kv: Option<PerLayer>,
    #[serde(rename = "attention.key_length")]
    key_length: Option<usize>,
    #[serde(rename = "attention.value_length")]
    value_length: Option<usize>,
    #[serde(rename = "attention.layer_norm_rms_epsilon")]
    rms_eps: Option<f32>,
    #[serde(rename = "attention.q_lora_rank")]
    q_lora_rank: Option<usize>,
    #[serde(rename = "attention.kv_lora_rank")]
    kv_lora_rank: Option<usize>,
    /// MLA: a head's query/key width `nope + rope` when `key_length` states the absorbed
    /// `kv_lora + rope` (files converted since llama.cpp split `attn_kv_b`).
    #[serde(rename = "attention.key_length_mla")]
    key_length_mla: Option<usize>,
    #[serde(rename = "attention.value_length_mla")]
    value_length_mla: Option<usize>,
    #[serde(rename = "attention.sliding_window")]
    sliding_window: Option<usize>,
    #[serde(rename = "attention.sliding_window_pattern")]
    sliding_window_pattern: Option<usize>,
    #[serde(rename = "attention.scale")]
    attention_scale: Option<f32>,
    #[serde(rename = "attention.temperature_scale")]
    attention_temperature_scale: Option<f32>,
    embedding_scale: Option<f32>,
    residual_scale: Option<f32>,
    logit_scale: Option<f32>,
    #[serde(rename = "rope.freq_base")]
    rope_freq_base: Option<f32>,
    #[serde(rename = "rope.freq_base_swa")]
    rope_freq_base_swa: Option<f32>,
    #[serde(rename = "rope.dimension_count")]
    rope_dimension_count: Option<usize>,
    #[serde(rename = "rope.scaling.type")]
    rope_scaling_type: Option<String>,
    #[serde(rename = "rope.scaling.attn_factor")]
    rope_scaling_attn_factor: Option<f32>,
    #[serde(rename = "rope.scaling.original_context_length")]
    rope_scaling_original_context_length: Option<usize>,
    #[serde(rename = "rope.scaling.factor")]
    rope_scaling_factor: Option<f32>,
    #[serde(rename = "rope.scaling.yarn_log_multiplier")]
    rope_scaling_yarn_log_multiplier: Option<f32>,
    #[serde(rename = "rope.scaling.yarn_beta_fast")]
    rope_scaling_yarn_beta_fast: Option<f32>,
    #[serde(rename = "rope.scaling.yarn_beta_slow")]
    rope_scaling_yarn_beta_slow: Option<f32>,
    expert_count: Option<usize>,
    expert_used_count: Option<usize>,
    expert_feed_forward_length: Option<usize>,
    expert_shared_count: Option<usize>,
    expert_shared_feed_forward_length: Option<usize>,
    leading_dense_block_count: Option<usize>,
    expert_weights_scale: Option<f32>,
    expert_weights_norm: Option<bool>,
    expert_gating_func: Option<u32>,
    expert_group_count: Option<usize>,
    expert_group_used_count: Option<usize>,
    /// Multi-token-prediction layers after the trunk (GLM-4.5's NextN): counted in
    /// `block_count`, not run for the next token.
    nextn_predict_layers: Option<usize>,
    #[serde(rename = "ssm.conv_kernel")]
    ssm_conv_kernel: Option<usize>,
    #[serde(rename = "ssm.inner_size")]
    ssm_inner_size: Option<usize>,
    #[serde(rename = "ssm.state_size")]
    ssm_state_size: Option<usize>,
    #[serde(rename = "ssm.time_step_rank")]
    ssm_time_step_rank: Option<usize>,
    #[serde(rename = "ssm.group_count")]
    ssm_group_count: Option<usize>,
    #[serde(rename = "attention.recurrent_layers")]
    recurrent_layers: Option<Vec<bool>>,
    full_attention_interval: Option<usize>,
}

/// The `{arch}.*` keys read as arrays: one value per layer.
const PER_LAYER_KEYS: &[&str] = &["attention.head_count_kv", "feed_forward_length", "attention.recurrent_layers"];

/// A key llama.cpp reads as one value or one per layer (`get_key_or_arr`): Nemotron-H's
/// `attention.head_count_kv` and `feed_forward_length`, 0 where a layer has no attention or no
/// MLP.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(untagged)]
enum PerLayer {
    One(usize),
    Each(Vec<usize>),
}

impl Default for PerLayer {
    fn default() -> PerLayer {
        PerLayer::One(0)
    }
}

impl PerLayer {
    /// The value, or the largest of the per-layer values (the width a buffer needs).
    fn max(&self) -> usize {
        match self {
            PerLayer::One(v) => *v,
            PerLayer::Each(v) => v.iter().copied().max().unwrap_or(0),
        }
    }

    /// Layer `l`'s value.
    fn at(&self, l: usize) -> usize {
        match self {
            PerLayer::One(v) => *v,
            PerLayer::Each(v) => v.get(l).copied().unwrap_or(0),
        }
    }
}

impl HParams {
    /// Reads the hyper-parameters of GGUF file `ld` of architecture `arch`.
    ///
    /// # Errors
    /// A missing or mistyped key, a layer count past what the file holds, an unknown RoPE
    /// scaling type or gating function, or a RoPE factor tensor of the wrong length, each
    /// named with its key or tensor.
    pub fn from_gguf(ld: &Gguf<'_>, arch: &str) -> Result<HParams, EngineError> {
        // Arrays only where a key is read per layer; any other key given as an array is left
        // out, as before arrays were read (a default, or "missing" where the key is required).
        let mut keys = ld.arch_keys(arch);
        keys.retain(|key, v| !v.is_array() || PER_LAYER_KEYS.contains(&key.as_str()));
        let k: Keys = serde_json::from_value(serde_json::Value::Object(keys))
            .map_err(|e| EngineError::model(format!("{arch} GGUF metadata: {e}")))?;
        // Per-layer settings are sized by the count before any layer's tensors are read.
        ld.check_layers(&format!("{arch}.block_count"), k.block_count)?;
        let layers = k.block_count.saturating_sub(k.nextn_predict_layers.unwrap_or(0));
        let ctx = k.context_length;
        let orig_ctx = k.rope_scaling_original_context_length.unwrap_or(ctx);
        let rope = Rope {
            base: k.rope_freq_base,
            local_base: k.rope_freq_base_swa,
            dims: k.rope_dimension_count,
            freq_factors: freq_factors(ld, &k)?,
            attn_factor: k.rope_scaling_attn_factor.unwrap_or(1.0),
            scaling: scaling(arch, &k, orig_ctx)?,
        };
        let attn_temperature = match k.attention_temperature_scale.filter(|t| *t != 0.0) {
            // llama.cpp steps by the original YaRN context (`n_attn_temp_floor_scale`).
            Some(scale) if orig_ctx > 0 => Some(AttnTemperature { scale, floor: orig_ctx }),
            Some(_) => {
                return Err(EngineError::model(format!(
                    "{arch}.attention.temperature_scale needs a positive rope.scaling.original_context_length"
                )))
            }
            None => None,
        };
        let moe = match k.expert_count {
            Some(n_expert) => Some(MoeParams {
                n_expert,
                top_k: k.expert_used_count,
                expert_ffn: k.expert_feed_forward_length,
                // One shared expert when only its width is stated (Qwen3.5-MoE, Qwen3-Next).
                shared_count: k
                    .expert_shared_count
                    .unwrap_or(usize::from(k.expert_shared_feed_forward_length.is_some())),
                shared_ffn: k.expert_shared_feed_forward_length,
                first_dense: k.leading_dense_block_count.unwrap_or(0),
                dense_layers: None,
                weights_scale: k.expert_weights_scale,
                weights_norm: k.expert_weights_norm,
                scoring: match k.expert_gating_func.unwrap_or(0) {
                    // 0: the key's "none", the architecture's default.
                    0 => None,
                    1 => Some(Scoring::Softmax),
                    2 => Some(Scoring::Sigmoid),
                    3 => Some(Scoring::SoftmaxSelected),
                    g => return Err(EngineError::model(format!("{arch}.expert_gating_func = {g}: not 1, 2 or 3"))),
                },
                n_group: k.expert_group_count,
                topk_group: k.expert_group_used_count,
            }),
            None => None,
        };
        let mla = match k.kv_lora_rank {
            Some(kv_lora_rank) => {
                let need = |v: Option<usize>, key: &str| {
                    v.ok_or_else(|| EngineError::model(format!("{arch}.{key} missing (an MLA architecture)")))
                };
                Some(MlaParams {
                    q_lora_rank: k.q_lora_rank.unwrap_or(0),
                    kv_lora_rank,
                    // Files since the split of `attn_kv_b` state the absorbed widths as
                    // key/value_length and the per-head ones as *_mla (`n_embd_head_k_mla()`).
                    head_k: need(k.key_length_mla.or(k.key_length), "attention.key_length")?,
                    v_dim: need(k.value_length_mla.or(k.value_length), "attention.value_length")?,
                })
            }
            None => None,
        };
        let linear_attn = linear_attn(arch, &k, layers)?;
        Ok(HParams {
            source: arch.to_owned(),
            layers,
            hidden: k.embedding_length,
            ffn: k.feed_forward_length.max(),
            heads: k.head_count,
            kv_heads: k.head_count_kv.as_ref().map_or(k.head_count, PerLayer::max),
            key_length: k.key_length,
            value_length: k.value_length,
            rms_eps: k.rms_eps,
            vocab: ld.embedding_rows()?,
            context_length: ctx,
            rope,
            window: k.sliding_window.map(|size| Window { size, pattern: k.sliding_window_pattern, layers: None }),
            attention_scale: k.attention_scale.filter(|s| *s != 0.0),
            embedding_scale: k.embedding_scale.filter(|s| *s != 0.0),
            residual_scale: k.residual_scale.filter(|s| *s != 0.0),
            logit_scale: k.logit_scale.filter(|s| *s != 0.0),
            attn_temperature,
            qkv_bias: None,
            qk_norm: None,
            no_rope_layers: None,
            tie_word_embeddings: None,
            moe,
            mla,
            swiglu_limit: None,
            linear_attn,
        })
    }
}

/// A hybrid file's Gated DeltaNet keys (`ssm.*`), all required once one is present, and which
/// of the `layers` trunk layers are recurrent.
fn linear_attn(arch: &str, k: &Keys, layers: usize) -> Result<Option<LinearAttnParams>, EngineError> {
    let Some(conv_kernel) = k.ssm_conv_kernel else { return Ok(None) };
    let need = |v: Option<usize>, key: &str| {
        v.filter(|v| *v > 0)
            .ok_or_else(|| EngineError::model(format!("{arch}.{key} missing or 0 (a hybrid architecture)")))
    };
    // Per-layer head counts (Nemotron-H): a layer with neither KV heads nor an MLP is
    // recurrent, one with an MLP has no mixer (`llama_model_nemotron_h::load_arch_hparams`).
    if let Some(kv @ PerLayer::Each(v)) = &k.head_count_kv {
        if v.len() < layers {
            return Err(EngineError::model(format!(
                "{arch}.attention.head_count_kv has {} entries for {layers} layers",
                v.len()
            )));
        }
        let ff = &k.feed_forward_length;
        let (recurrent, ffn_only) =
            (0..layers).map(|l| (kv.at(l) == 0 && ff.at(l) == 0, kv.at(l) == 0 && ff.at(l) > 0)).unzip();
        return Ok(Some(LinearAttnParams {
            conv_kernel: need(Some(conv_kernel), "ssm.conv_kernel")?,
            head_k: need(k.ssm_state_size, "ssm.state_size")?,
            inner: need(k.ssm_inner_size, "ssm.inner_size")?,
            k_heads: need(k.ssm_group_count, "ssm.group_count")?,
            v_heads: need(k.ssm_time_step_rank, "ssm.time_step_rank")?,
            recurrent,
            ffn_only,
        }));
    }
    let recurrent = match &k.recurrent_layers {
        Some(r) if r.len() >= layers => r[..layers].to_vec(),
        Some(r) => {
            return Err(EngineError::model(format!(
                "{arch}.attention.recurrent_layers has {} entries for {layers} layers",
                r.len()
            )))
        }
        None => {
            let every = k.full_attention_interval.unwrap_or(4);
            if every == 0 {
                return Err(EngineError::model(format!("{arch}.full_attention_interval is 0")));
            }
            (0..layers).map(|l| !(l + 1).is_multiple_of(every)).collect()
        }
    };
    Ok(Some(LinearAttnParams {
        conv_kernel: need(Some(conv_kernel), "ssm.conv_kernel")?,
        head_k: need(k.ssm_state_size, "ssm.state_size")?,
        inner: need(k.ssm_inner_size, "ssm.inner_size")?,
        k_heads: need(k.ssm_group_count, "ssm.group_count")?,
        v_heads: need(k.ssm_time_step_rank, "ssm.time_step_rank")?,
        ffn_only: vec![false; recurrent.len()],
        recurrent,
    }))
}

/// RoPE scaling as llama.cpp reads it: `rope.scaling.type` `none`, `linear` or `yarn` (absent
/// with a factor is linear: llama.cpp defaults the type to `linear`), with its factor, the
/// original context, the YaRN betas and `yarn_log_multiplier`.
fn scaling(arch: &str, k: &Keys, orig_ctx: usize) -> Result<Option<RopeScaling>, EngineError> {
    let factor = k.rope_scaling_factor.filter(|f| *f != 0.0).map(f64::from);
    // [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]: llama.cpp's converter writes `0.1 · mscale_all_dim` for
    // `deepseek2` and its loader divides it back; every other architecture stores the value.
    let log_mul = k.rope_scaling_yarn_log_multiplier.map_or(0.0, |m| match arch {
        "deepseek2" => f64::from(m) / 0.1,
        _ => f64::from(m),
    });
    Ok(match (k.rope_scaling_type.as_deref(), factor) {
        (Some("none"), _) | (Some("linear" | "yarn"), None) | (None, None) => None,
        (Some("linear") | None, Some(f)) => Some(RopeScaling::linear(f)),
        (Some("yarn"), Some(f)) => {
            let mut s = RopeScaling::yarn(f, orig_ctx);
            s.log_mul = log_mul;
            if let Some(b) = k.rope_scaling_yarn_beta_fast.filter(|b| *b != 0.0) {
                s.beta_fast = b.into();
            }
            if let Some(b) = k.rope_scaling_yarn_beta_slow.filter(|b| *b != 0.0) {
                s.beta_slow = b.into();
            }
            Some(s)
        }
        (Some(s), _) => {
            return Err(EngineError::model(format!(
                "{arch}.rope.scaling.type = {s:?} is not supported (none, linear, yarn, Llama 3's \
                 rope_freqs tensor, or LongRoPE's rope_factors_short/long tensors)"
            )))
        }
    })
}

/// The file's RoPE frequency factors: Llama 3's `rope_freqs`, or LongRoPE's long factors when
/// the context is past the original one and its short ones otherwise (Phi-3.5, Phi-4-mini; as
/// llama.cpp chooses them by its context, `llama_model::get_rope_factors`: here the context
/// is the trained one the server offers).
fn freq_factors(ld: &Gguf<'_>, k: &Keys) -> Result<Option<Vec<f32>>, EngineError> {
    let long = k.rope_scaling_original_context_length.is_some_and(|orig| k.context_length > orig);
    let names = ["rope_freqs.weight", if long { "rope_factors_long.weight" } else { "rope_factors_short.weight" }];
    match names.iter().find(|n| ld.has_tensor(n)) {
        Some(n) => {
            let (_, shape, _) = ld.tensor(n)?;
            let len = match shape.as_slice() {
                [len] => *len,
                other => return Err(EngineError::model(format!("{n}: shape {other:?}, want one dimension"))),
            };
            Ok(Some(ld.vector(n, len)?))
        }
        None => Ok(None),
    }
}
