//! [`HParams`] from a Hugging Face `config.json`, read as llama.cpp's converter reads it
//! (`convert_hf_to_gguf.py`, `conversion/*.py`) so that a checkpoint and its GGUF twin give the
//! same record: RoPE from `rope_parameters` (transformers ≥ 5) or `rope_scaling` with
//! `rope_theta`, the expert keys of each MoE family under their HF spellings, MLA's ranks.
//! A multimodal config's language model is its `text_config` (Mistral 3).

use serde::Deserialize;
use serde_json::Value;

use super::{AttnTemperature, HParams, LinearAttnParams, MlaParams, MoeParams, Rope, Window};
use crate::model::common::RopeScaling;
use crate::model::routing::Scoring;
use crate::EngineError;

fn default_theta() -> f64 {
    10000.0
}

fn default_eps() -> f64 {
    1e-6
}

/// The keys of `config.json` the record reads (unknown keys ignored, as HF keeps them as
/// attributes nobody reads).
#[derive(Debug, Deserialize)]
struct Config {
    hidden_size: usize,
    #[serde(default)]
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "default_theta")]
    rope_theta: f64,
    rope_local_base_freq: Option<f64>,
    rms_norm_eps: Option<f64>,
    /// Nemotron-H's spelling of the RMSNorm ε.
    layer_norm_epsilon: Option<f64>,
    vocab_size: usize,
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    rope_scaling: Option<RopeParams>,
    /// transformers ≥ 5: the RoPE type, θ and the scaling parameters in one block.
    rope_parameters: Option<RopeParams>,
    /// Every layer attends over this many keys when set (Mistral).
    sliding_window: Option<usize>,
    /// Qwen2/Qwen3 state a `sliding_window` but use it only with this set.
    use_sliding_window: Option<bool>,
    /// Per layer `sliding_attention` or `full_attention` (gpt-oss; its `truncate: false` YaRN is
    /// read as llama.cpp runs the converted file, correction dimensions floored and ceiled).
    layer_types: Option<Vec<String>>,
    /// SmolLM3: 1 where a layer applies RoPE, 0 where it does not.
    no_rope_layers: Option<Vec<u8>>,
    /// Phi-4-mini, GLM-4.5: the share of a head RoPE rotates.
    partial_rotary_factor: Option<f64>,
    /// Phi-3: the context LongRoPE extends.
    original_max_position_embeddings: Option<usize>,
    attention_bias: Option<bool>,
    use_qk_norm: Option<bool>,
    /// Granite's multipliers.
    embedding_multiplier: Option<f32>,
    residual_multiplier: Option<f32>,
    attention_multiplier: Option<f32>,
    logits_scaling: Option<f32>,
    // Mixture of experts.
    num_experts: Option<usize>,
    n_routed_experts: Option<usize>,
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    experts_per_token: Option<usize>,
    moe_intermediate_size: Option<usize>,
    n_shared_experts: Option<usize>,
    /// Qwen2-MoE / Qwen3.5-MoE: one shared expert of this width.
    shared_expert_intermediate_size: Option<usize>,
    /// Nemotron-H MoE's spelling of the same.
    moe_shared_expert_intermediate_size: Option<usize>,
    first_k_dense_replace: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    decoder_sparse_step: Option<usize>,
    routed_scaling_factor: Option<f32>,
    norm_topk_prob: Option<bool>,
    scoring_func: Option<String>,
    topk_method: Option<String>,
    n_group: Option<usize>,
    topk_group: Option<usize>,
    swiglu_limit: Option<f32>,
    // Multi-head latent attention.
    kv_lora_rank: Option<usize>,
    /// `null` for no q LoRA (DeepSeek-V2-Lite).
    q_lora_rank: Option<usize>,
    qk_nope_head_dim: Option<usize>,
    qk_rope_head_dim: Option<usize>,
    v_head_dim: Option<usize>,
    // Gated DeltaNet (Qwen3.5: `Qwen3_5TextConfig`).
    linear_conv_kernel_dim: Option<usize>,
    linear_key_head_dim: Option<usize>,
    linear_value_head_dim: Option<usize>,
    linear_num_key_heads: Option<usize>,
    linear_num_value_heads: Option<usize>,
    full_attention_interval: Option<usize>,
    // Mamba-2 (Nemotron-H: `NemotronHConfig`).
    /// One character per layer: `M` Mamba-2, `*` attention, `-` MLP (`E` experts).
    hybrid_override_pattern: Option<String>,
    /// Nemotron 3: the same per layer as words (`mamba`, `attention`, `mlp`, `moe`).
    layers_block_type: Option<Vec<String>>,
    mamba_num_heads: Option<usize>,
    mamba_head_dim: Option<usize>,
    ssm_state_size: Option<usize>,
    n_groups: Option<usize>,
    conv_kernel: Option<usize>,
}

/// HF's `rope_scaling` / `rope_parameters` block.
#[derive(Debug, Deserialize)]
struct RopeParams {
    rope_type: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    rope_theta: Option<f64>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<usize>,
    /// LongRoPE (Phi-3.5, Phi-4-mini): per-pair factors past and within the original context.
    long_factor: Option<Vec<f64>>,
    short_factor: Option<Vec<f64>>,
    attention_factor: Option<f64>,
    beta_fast: Option<f64>,
    beta_slow: Option<f64>,
    mscale_all_dim: Option<f64>,
    /// Mistral 3: Llama 4's attention temperature.
    llama_4_scaling_beta: Option<f32>,
    /// Qwen3.5 states the rotated share here.
    partial_rotary_factor: Option<f64>,
}

impl HParams {
    /// Reads `config.json` (`cfg`, already parsed): the language model's keys, or those of its
    /// `text_config` when it has one.
    ///
    /// # Errors
    /// A missing or mistyped key (named), an unsupported RoPE type, a per-layer list of the
    /// wrong length.
    pub fn from_hf(cfg: &Value) -> Result<HParams, EngineError> {
        let text = cfg.get("text_config").filter(|t| t.is_object()).unwrap_or(cfg);
        // A null means what a missing key means, except q_lora_rank's (no q LoRA).
        let mut obj = text.as_object().cloned().unwrap_or_default();
        obj.retain(|k, x| !x.is_null() || k == "q_lora_rank");
        let c = Config::deserialize(Value::Object(obj)).map_err(|e| EngineError::model(format!("config.json: {e}")))?;
        let layers = c.num_hidden_layers;
        let heads = c.num_attention_heads;
        let head_dim = match c.head_dim {
            Some(d) => d,
            None if heads > 0 && c.hidden_size.is_multiple_of(heads) => c.hidden_size / heads,
            None => {
                return Err(EngineError::model(format!(
                    "config.json: {heads} heads do not divide hidden_size {}",
                    c.hidden_size
                )))
            }
        };
        let mla = match c.kv_lora_rank {
            Some(kv_lora_rank) => {
                let need = |v: Option<usize>, k: &str| {
                    v.ok_or_else(|| EngineError::model(format!("config.json: {k} missing (an MLA model)")))
                };
                let (nope, rope) =
                    (need(c.qk_nope_head_dim, "qk_nope_head_dim")?, need(c.qk_rope_head_dim, "qk_rope_head_dim")?);
                Some(MlaParams {
                    q_lora_rank: c.q_lora_rank.unwrap_or(0),
                    kv_lora_rank,
                    head_k: nope + rope,
                    v_dim: need(c.v_head_dim, "v_head_dim")?,
                })
            }
            None => None,
        };
        let rp = c.rope_parameters.as_ref().or(c.rope_scaling.as_ref());
        let partial = c.partial_rotary_factor.or(rp.and_then(|p| p.partial_rotary_factor));
        let dims = match (&mla, c.qk_rope_head_dim, partial) {
            (Some(_), r, _) => r,
            (None, _, Some(f)) => Some(((head_dim as f64 * f) as usize) & !1),
            (None, _, None) => None,
        };
        let base = rp.and_then(|p| p.rope_theta).unwrap_or(c.rope_theta);
        let mut rope = Rope {
            base: Some(base as f32),
            local_base: c.rope_local_base_freq.map(|b| b as f32),
            dims,
            freq_factors: None,
            attn_factor: 1.0,
            scaling: None,
        };
        let mut attn_temperature = None;
        if let Some(r) = rp {
            let width = dims.unwrap_or(head_dim);
            let kind = r.rope_type.as_deref().or(r.legacy_type.as_deref()).unwrap_or("default");
            let orig = r.original_max_position_embeddings.or(c.original_max_position_embeddings);
            match (kind, r.factor) {
                ("default", _) => {}
                ("linear", Some(f)) => rope.scaling = Some(RopeScaling::linear(f)),
                ("llama3", Some(f)) => {
                    let (Some(lo), Some(hi), Some(old)) = (r.low_freq_factor, r.high_freq_factor, orig) else {
                        return Err(EngineError::model(
                            "config.json: rope_scaling llama3 needs low_freq_factor, high_freq_factor and \
                             original_max_position_embeddings",
                        ));
                    };
                    rope.freq_factors = Some(llama3_rope_factors(base, width, f, lo, hi, old as f64));
                }
                ("longrope" | "su", _) => {
                    let Some(orig) = orig else {
                        return Err(EngineError::model(
                            "config.json: rope_scaling longrope needs original_max_position_embeddings",
                        ));
                    };
                    // HF `_compute_longrope_parameters`: the attention factor from the extension
                    // ratio; the long factors past the original context, chosen once from the
                    // context offered (as llama.cpp does), not per sequence.
                    let ext = c.max_position_embeddings as f64 / orig as f64;
                    rope.attn_factor = r.attention_factor.unwrap_or(match ext > 1.0 {
                        true => (1.0 + ext.ln() / (orig as f64).ln()).sqrt(),
                        false => 1.0,
                    }) as f32;
                    let f = if ext > 1.0 { &r.long_factor } else { &r.short_factor };
                    rope.freq_factors = match f {
                        Some(f) if f.len() == width / 2 => Some(f.iter().map(|&x| x as f32).collect()),
                        _ => {
                            return Err(EngineError::model(format!(
                                "config.json: rope_scaling longrope needs long_factor and short_factor of {} values",
                                width / 2
                            )))
                        }
                    };
                }
                ("yarn", Some(f)) => {
                    // As the converter writes it: the factor, the original context, the betas and
                    // `mscale_all_dim` as `yarn_log_multiplier`; HF's `attention_factor` when
                    // stated (`rope.scaling.attn_factor`).
                    let mut s = RopeScaling::yarn(f, orig.unwrap_or(c.max_position_embeddings));
                    s.log_mul = r.mscale_all_dim.unwrap_or(0.0);
                    s.beta_fast = r.beta_fast.unwrap_or(s.beta_fast);
                    s.beta_slow = r.beta_slow.unwrap_or(s.beta_slow);
                    rope.scaling = Some(s);
                    if let Some(a) = r.attention_factor {
                        rope.attn_factor = a as f32;
                    }
                    if let Some(scale) = r.llama_4_scaling_beta.filter(|b| *b != 0.0) {
                        attn_temperature = Some(AttnTemperature { scale, floor: s.n_ctx_orig.max(1) });
                    }
                }
                _ => {
                    return Err(EngineError::model(format!(
                        "config.json: rope_scaling {kind:?} is not supported (default, linear, llama3, longrope and \
                         yarn with their factors are)"
                    )))
                }
            }
        }
        let window = match c.sliding_window.filter(|_| c.use_sliding_window.unwrap_or(true)) {
            Some(w) if w < c.max_position_embeddings || c.layer_types.is_some() => Some(Window {
                size: w,
                pattern: None,
                layers: match &c.layer_types {
                    Some(t) if t.len() == layers => Some(t.iter().map(|t| t == "sliding_attention").collect()),
                    Some(t) => {
                        return Err(EngineError::model(format!(
                            "config.json: layer_types has {} entries for {layers} layers",
                            t.len()
                        )))
                    }
                    None => None,
                },
            }),
            _ => None,
        };
        let no_rope_layers = match &c.no_rope_layers {
            Some(v) if v.len() == layers => Some(v.iter().map(|&r| r == 0).collect()),
            Some(v) => {
                return Err(EngineError::model(format!(
                    "config.json: no_rope_layers has {} entries for {layers} layers",
                    v.len()
                )))
            }
            None => None,
        };
        Ok(HParams {
            source: "config.json".into(),
            layers,
            hidden: c.hidden_size,
            ffn: c.intermediate_size,
            heads,
            kv_heads: c.num_key_value_heads.unwrap_or(heads),
            key_length: c.head_dim,
            value_length: None,
            rms_eps: Some(c.rms_norm_eps.or(c.layer_norm_epsilon).unwrap_or(default_eps()) as f32),
            vocab: c.vocab_size,
            context_length: c.max_position_embeddings,
            rope,
            window,
            attention_scale: c.attention_multiplier,
            embedding_scale: c.embedding_multiplier,
            residual_scale: c.residual_multiplier,
            logit_scale: c.logits_scaling,
            attn_temperature,
            qkv_bias: c.attention_bias,
            qk_norm: c.use_qk_norm,
            no_rope_layers,
            tie_word_embeddings: Some(c.tie_word_embeddings),
            moe: moe(&c, layers)?,
            mla,
            swiglu_limit: c.swiglu_limit,
            linear_attn: linear_attn(&c, layers)?,
        })
    }
}

/// A hybrid model's recurrent layers: Qwen3.5's `linear_*` keys with `layer_types` (else every
/// `full_attention_interval`-th layer attends, as the converter writes it), or Nemotron-H's
/// `mamba_*` keys with `hybrid_override_pattern` / `layers_block_type` (field names as
/// [`LinearAttnParams`] documents for Mamba-2); `None` for neither.
fn linear_attn(c: &Config, layers: usize) -> Result<Option<LinearAttnParams>, EngineError> {
    let need = |v: Option<usize>, k: &str| {
        v.filter(|v| *v > 0)
            .ok_or_else(|| EngineError::model(format!("config.json: {k} missing or 0 (a hybrid model)")))
    };
    let per_layer = |n: usize, what: &str| -> Result<(), EngineError> {
        match n == layers {
            true => Ok(()),
            false => Err(EngineError::model(format!("config.json: {what} has {n} entries for {layers} layers"))),
        }
    };
    if let Some(k) = c.linear_conv_kernel_dim {
        let recurrent = match &c.layer_types {
            Some(t) => {
                per_layer(t.len(), "layer_types")?;
                t.iter().map(|t| t == "linear_attention").collect()
            }
            None => {
                let every = c.full_attention_interval.unwrap_or(4).max(1);
                (0..layers).map(|l| !(l + 1).is_multiple_of(every)).collect()
            }
        };
        let (dv, vh) = (
            need(c.linear_value_head_dim, "linear_value_head_dim")?,
            need(c.linear_num_value_heads, "linear_num_value_heads")?,
        );
        return Ok(Some(LinearAttnParams {
            conv_kernel: need(Some(k), "linear_conv_kernel_dim")?,
            head_k: need(c.linear_key_head_dim, "linear_key_head_dim")?,
            inner: dv * vh,
            k_heads: need(c.linear_num_key_heads, "linear_num_key_heads")?,
            v_heads: vh,
            ffn_only: vec![false; layers],
            recurrent,
        }));
    }
    let kinds: Vec<char> = match (&c.hybrid_override_pattern, &c.layers_block_type) {
        (Some(p), _) => p.chars().collect(),
        (None, Some(t)) => t
            .iter()
            .map(|w| match w.as_str() {
                "mamba" | "linear_attention" => 'M',
                "attention" | "full_attention" => '*',
                "moe" => 'E',
                _ => '-',
            })
            .collect(),
        (None, None) => return Ok(None),
    };
    per_layer(kinds.len(), "hybrid_override_pattern")?;
    let (nh, hd) = (need(c.mamba_num_heads, "mamba_num_heads")?, need(c.mamba_head_dim, "mamba_head_dim")?);
    Ok(Some(LinearAttnParams {
        conv_kernel: need(c.conv_kernel, "conv_kernel")?,
        head_k: need(c.ssm_state_size, "ssm_state_size")?,
        inner: nh * hd,
        k_heads: need(c.n_groups, "n_groups")?,
        v_heads: nh,
        recurrent: kinds.iter().map(|&k| k == 'M').collect(),
        ffn_only: kinds.iter().map(|&k| k == '-' || k == 'E').collect(),
    }))
}

/// The expert keys under each family's spelling (`Qwen3MoeConfig`, `DeepseekV3Config`,
/// `Glm4MoeConfig`, `GptOssConfig`).
fn moe(c: &Config, layers: usize) -> Result<Option<MoeParams>, EngineError> {
    let Some(n_expert) = c.num_experts.or(c.n_routed_experts).or(c.num_local_experts).filter(|&n| n > 0) else {
        return Ok(None);
    };
    let scoring = match c.scoring_func.as_deref() {
        None => None,
        Some("softmax") => Some(Scoring::Softmax),
        Some("sigmoid") => Some(Scoring::Sigmoid),
        Some(s) => return Err(EngineError::model(format!("config.json: scoring_func {s:?} is not supported"))),
    };
    if let Some(m) = c.topk_method.as_deref().filter(|m| !matches!(*m, "noaux_tc" | "greedy" | "group_limited_greedy"))
    {
        return Err(EngineError::model(format!("config.json: topk_method {m:?} is not supported")));
    }
    let shared_ffn = c.shared_expert_intermediate_size.or(c.moe_shared_expert_intermediate_size).filter(|&w| w > 0);
    // Qwen3-MoE: layer l is sparse unless listed in `mlp_only_layers`, and only every
    // `decoder_sparse_step`-th (`(l + 1) % step == 0`); Nemotron-H: the `E` layers of its
    // pattern (`moe` in its word list).
    let pattern: Option<Vec<bool>> = match (&c.hybrid_override_pattern, &c.layers_block_type) {
        (Some(p), _) => Some(p.chars().map(|k| k != 'E').collect()),
        (None, Some(t)) => Some(t.iter().map(|w| w != "moe").collect()),
        (None, None) => None,
    };
    let dense_layers = match (&c.mlp_only_layers, c.decoder_sparse_step) {
        // A Nemotron-H config without expert layers keeps `dense_layers` all true, so the
        // loader takes it for the dense family.
        _ if pattern.is_some() => pattern,
        (None, None | Some(1)) => None,
        (only, step) => {
            let step = step.unwrap_or(1).max(1);
            let only = only.as_deref().unwrap_or(&[]);
            Some((0..layers).map(|l| only.contains(&l) || (l + 1) % step != 0).collect())
        }
    };
    Ok(Some(MoeParams {
        n_expert,
        top_k: c.num_experts_per_tok.or(c.experts_per_token),
        // gpt-oss's experts are `intermediate_size` wide.
        expert_ffn: c.moe_intermediate_size.or(Some(c.intermediate_size).filter(|&i| i > 0)),
        // Qwen2-MoE's, Qwen3.5-MoE's and Nemotron-H MoE's one shared expert has a width of its
        // own.
        shared_count: c.n_shared_experts.unwrap_or(usize::from(shared_ffn.is_some())),
        shared_ffn,
        first_dense: c.first_k_dense_replace.unwrap_or(0),
        dense_layers,
        weights_scale: c.routed_scaling_factor,
        weights_norm: c.norm_topk_prob,
        scoring,
        n_group: c.n_group,
        topk_group: c.topk_group,
    }))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(v: Value) -> Result<HParams, EngineError> {
        HParams::from_hf(&v)
    }

    /// Fields of real `config.json` files (Qwen2.5-1.5B-Instruct, Mistral-7B-v0.1,
    /// Phi-4-mini-instruct, Llama-3.2-1B, Qwen3-30B-A3B, DeepSeek-V3) read as transformers and
    /// llama.cpp's converter read them.
    #[test]
    fn configs_of_the_families() {
        let qwen = hp(serde_json::json!({
            "model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
            "num_attention_heads": 12, "num_key_value_heads": 2, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
            "vocab_size": 151936, "max_position_embeddings": 32768, "tie_word_embeddings": true,
            "sliding_window": 32768, "use_sliding_window": false, "max_window_layers": 21
        }))
        .expect("qwen2");
        assert_eq!((qwen.head_dim().expect("hd"), qwen.kv_heads), (128, 2));
        assert!(qwen.window.is_none(), "use_sliding_window is false");
        let mistral = hp(serde_json::json!({
            "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 10000.0, "rms_norm_eps": 1e-05,
            "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096
        }))
        .expect("mistral");
        assert_eq!(mistral.window.map(|w| w.size), Some(4096));
        let long: Vec<f64> = (0..48).map(|i| 1.0 + i as f64).collect();
        let phi = hp(serde_json::json!({
            "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
            "num_attention_heads": 24, "num_key_value_heads": 8, "rope_theta": 10000.0, "rms_norm_eps": 1e-05,
            "vocab_size": 200064, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
            "partial_rotary_factor": 0.75,
            "rope_scaling": {"type": "longrope", "long_factor": long, "short_factor": vec![1.0; 48]}
        }))
        .expect("phi3");
        assert_eq!((phi.head_dim().expect("hd"), phi.rope.dims), (128, Some(96)));
        assert_eq!(phi.rope.freq_factors.as_deref().map(|f| f[47]), Some(48.0), "long factors past 4096");
        // √(1 + ln(131072 / 4096) / ln 4096), HF's LongRoPE attention factor.
        assert!((phi.rope.attn_factor - 1.190238).abs() < 1e-5, "{}", phi.rope.attn_factor);
        let llama = hp(serde_json::json!({
            "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "rope_theta": 500000.0,
            "vocab_size": 128256, "max_position_embeddings": 131072,
            "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192}
        }))
        .expect("llama");
        let ff = llama.rope.freq_factors.expect("llama3 factors");
        assert_eq!((ff.len(), ff[0], ff[31]), (32, 1.0, 32.0));
        // YaRN, as Qwen3's model cards extend it past 32k: read, not refused.
        let yarn = hp(serde_json::json!({
            "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 1, "vocab_size": 8, "max_position_embeddings": 131072,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
        }))
        .expect("yarn");
        let s = yarn.rope.scaling.expect("yarn scaling");
        assert_eq!((s.freq_scale, s.n_ctx_orig, s.ext_factor, s.beta_fast, s.beta_slow), (0.25, 32768, 1.0, 32.0, 1.0));
        let e = hp(serde_json::json!({
            "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 1, "vocab_size": 8,
            "max_position_embeddings": 8, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}
        }))
        .expect_err("dynamic");
        assert!(e.to_string().contains("\"dynamic\" is not supported"), "{e}");
    }

    /// The MoE and MLA keys of Qwen3-30B-A3B and DeepSeek-V3 (YaRN with `mscale_all_dim`).
    #[test]
    fn moe_and_mla_configs() {
        let q = hp(serde_json::json!({
            "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
            "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
            "max_position_embeddings": 40960, "num_experts": 128, "num_experts_per_tok": 8,
            "moe_intermediate_size": 768, "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": []
        }))
        .expect("qwen3_moe");
        let m = q.moe.expect("experts");
        assert_eq!(
            (m.n_expert, m.top_k, m.expert_ffn, m.dense_layers),
            (128, Some(8), Some(768), Some(vec![false; 48]))
        );
        let d = hp(serde_json::json!({
            "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
            "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280,
            "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "n_routed_experts": 256,
            "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "n_group": 8,
            "topk_group": 4, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
            "norm_topk_prob": true, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "rope_theta": 10000,
            "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                             "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}
        }))
        .expect("deepseek_v3");
        let mla = d.mla.expect("mla");
        assert_eq!(
            (mla.q_lora_rank, mla.kv_lora_rank, mla.head_k, mla.v_dim, d.rope.dims),
            (1536, 512, 192, 128, Some(64))
        );
        let m = d.moe.expect("experts");
        assert_eq!((m.n_expert, m.shared_count, m.first_dense, m.n_group, m.topk_group), (256, 1, 3, Some(8), Some(4)));
        assert_eq!((m.scoring, m.weights_scale), (Some(Scoring::Sigmoid), Some(2.5)));
        let s = d.rope.scaling.expect("yarn");
        assert_eq!((s.freq_scale, s.n_ctx_orig, s.log_mul), (1.0 / 40.0, 4096, 1.0));
    }
}
