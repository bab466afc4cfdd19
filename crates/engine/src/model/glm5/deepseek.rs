//! DeepSeek-V2 / V2-Lite / V3 (and the models llama.cpp runs as the same architecture, such
//! as GLM-4.7-Flash) on GLM-5's MLA + MoE model without the DSA indexer: the [`Glm5Config`] and
//! RoPE table of the neutral [`HParams`], from a `deepseek2` GGUF file or a `deepseek_v2` /
//! `deepseek_v3` checkpoint alike. Every query attends to its whole context.
//!
//! Arithmetic as llama.cpp runs it (`src/models/deepseek2.cpp`, `llama_context`'s YaRN factors
//! in `src/llama-context.cpp`, `conversion/deepseek.py` for what the converter wrote), which is
//! HF's (`modeling_deepseek_v3.py`: `yarn_get_mscale`):
//!
//! - queries through the q LoRA or, without one (V2-Lite), one `q_proj`;
//! - RoPE on adjacent pairs over the rotary width, YaRN when stated, with DeepSeek's attention
//!   scale `mscale² / √(nope + rope)`, `mscale = 1 + 0.1 · mscale_all_dim · ln(factor)`;
//! - leading dense layers, then the router (softmax or sigmoid as the file says; when it says
//!   nothing, sigmoid for GLM-4.7-Flash and softmax for the V2 files written before the key, as
//!   llama.cpp decides, and each HF class's own default), its selection bias where present,
//!   group-limited top-k, the file's renormalization and scale, and the shared experts.

use super::{Glm5Config, LORA_NORM_EPS};
use crate::model::common::{check_rope_positions, RopeScaling, RopeTable};
use crate::model::hparams::HParams;
use crate::model::moe::MoeConfig;
use crate::model::moe::MoeFamily;
use crate::model::routing::Scoring;
use crate::EngineError;

/// Where a DeepSeek config came from: what llama.cpp or HF assume where the file says nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A `deepseek2` GGUF file: the LoRA norms at the file's ε, the gating by llama.cpp's rule.
    Gguf,
    /// An HF checkpoint of `model_type` `deepseek_v2` (`true`: softmax by default) or
    /// `deepseek_v3` (sigmoid): the LoRA norms at HF's 1e-6.
    Hf {
        /// `deepseek_v2`.
        v2: bool,
    },
}

/// RoPE and the attention scale of a DeepSeek model as llama.cpp derives them: the table's
/// scaling, its factor on every cosine and sine, and `kq_scale`.
///
/// llama.cpp's `llama_context` sets `yarn_attn_factor = 1 / (1 + 0.1 ln s)` under YaRN with a
/// `yarn_log_multiplier` (the DeepSeek `mscale / mscale_all_dim` ratio is 1, as `deepseek2`
/// takes `mscale = mscale_all_dim`; without one, `(1 + 0.1 ln s) / (1 + 0.1 ln s)` = 1), times
/// the file's `rope.scaling.attn_factor`; ggml's rope multiplies that back by
/// `1 + 0.1 ln s`; the graph scales the scores by `mscale² / √(nope + rope)` with `mscale =
/// attn_factor_org · (1 + 0.1 · mscale_all_dim · ln s)`.
fn rope_and_scale(hp: &HParams, head_k: usize) -> Result<(Option<RopeScaling>, f64, f32), EngineError> {
    let scaling = match hp.rope.scaling {
        Some(s) if s.ext_factor == 0.0 => {
            return Err(EngineError::model(format!(
                "{}: linear RoPE scaling is not supported on MLA models (none or yarn)",
                hp.source
            )))
        }
        s => s,
    };
    let attn = f64::from(hp.rope.attn_factor);
    let s = scaling.map_or(1.0, |r| 1.0 / r.freq_scale);
    let log_mul = scaling.map_or(0.0, |r| r.log_mul);
    let yarn_attn = match scaling {
        Some(_) => {
            let ratio = if log_mul != 0.0 || s <= 1.0 { 1.0 } else { 0.1 * s.ln() + 1.0 };
            ratio / (1.0 + 0.1 * s.ln()) * attn
        }
        None => attn,
    };
    // The rope's own factor and the graph's `attn_factor_org` are the same product (ln 1 = 0
    // without scaling).
    let table = yarn_attn * (1.0 + 0.1 * s.ln());
    let mscale = table * (1.0 + 0.1 * log_mul * s.ln());
    Ok((scaling, table, (mscale * mscale / (head_k as f64).sqrt()) as f32))
}

/// The router's scoring of a file that states none, as llama.cpp decides it for `layers`
/// trunk layers and a `vocab`-token vocabulary: sigmoid for GLM-4.7-Flash (47 or 48 layers and
/// GLM's 154 880 tokens), softmax for the DeepSeek-V2 / V2.5 files written before the key.
pub(super) fn default_scoring(layers: usize, vocab: usize) -> Scoring {
    match (layers, vocab) {
        (47 | 48, 154_880) => Scoring::Sigmoid,
        _ => Scoring::Softmax,
    }
}

/// The model's config, its feed-forward and its RoPE table from `hp`; `has_q_lora` says
/// whether the file holds the q LoRA's tensors (V2-Lite has none: llama.cpp decides by the
/// model, the tensors say the same); `file_bytes` bounds the RoPE table's size.
///
/// # Errors
/// A missing MLA or expert key (named), linear RoPE scaling, Mistral Large 3's attention
/// temperature, a head too narrow for its rotary part, a context too long for the file.
pub fn config(
    hp: &HParams,
    src: Source,
    has_q_lora: bool,
    file_bytes: usize,
) -> Result<(Glm5Config, MoeConfig, RopeTable), EngineError> {
    let name = &hp.source;
    let mla = hp
        .mla
        .as_ref()
        .ok_or_else(|| EngineError::model(format!("{name}.attention.kv_lora_rank missing (an MLA architecture)")))?;
    let rope = hp.need(hp.rope.dims, "rope.dimension_count", "an MLA architecture")?;
    let head_k = mla.head_k;
    if head_k <= rope || !rope.is_multiple_of(2) {
        return Err(EngineError::model(format!(
            "{name}: a {head_k}-value query/key head cannot hold {rope} rotary values and a non-rotary part"
        )));
    }
    if hp.attn_temperature.is_some() {
        return Err(EngineError::model(format!(
            "{name}.attention.temperature_scale is set: the attention temperature tuning of these files \
             (Mistral Large 3) is not supported"
        )));
    }
    let layers = hp.layers;
    let default = match src {
        Source::Gguf => default_scoring(layers, hp.vocab),
        Source::Hf { v2: true } => Scoring::Softmax,
        Source::Hf { v2: false } => Scoring::Sigmoid,
    };
    let fam = MoeFamily { default_scoring: default, scaled: true, ..MoeFamily::BASE };
    let mut moe = MoeConfig::from_hparams(hp, &fam)?;
    // llama.cpp's `deepseek2` sizes the shared experts as `expert_shared_count` routed ones.
    moe.shared_ffn = hp.need_moe()?.shared_count * moe.expert_ffn;
    let q_lora_rank = match has_q_lora {
        true => hp.need(Some(mla.q_lora_rank).filter(|&r| r > 0), "attention.q_lora_rank", "an MLA architecture")?,
        false => 0,
    };
    let (scaling, table_mscale, softmax_scale) = rope_and_scale(hp, head_k)?;
    let base = hp.rope.base.map_or(10000.0, f64::from);
    let ctx = hp.context_length;
    let key = match src {
        Source::Gguf => format!("{name}.context_length"),
        Source::Hf { .. } => "max_position_embeddings".into(),
    };
    check_rope_positions(&key, ctx, rope, file_bytes)?;
    let rope_table = match &scaling {
        Some(s) => RopeTable::llama_cpp_yarn(base, rope, ctx, None, s, table_mscale),
        None => RopeTable::llama_cpp(base, rope, ctx).scaled_by(table_mscale as f32),
    };
    let eps = hp.rms_eps.unwrap_or(1e-6);
    let c = Glm5Config {
        hidden: hp.hidden,
        layers,
        heads: hp.heads,
        q_lora_rank,
        kv_lora_rank: mla.kv_lora_rank,
        qk_nope: head_k - rope,
        qk_rope: rope,
        v_dim: mla.v_dim,
        n_routed: moe.n_expert,
        top_k: moe.routing.top_k,
        n_shared: hp.need_moe()?.shared_count,
        moe_inter: moe.expert_ffn,
        inter: hp.ffn,
        first_k_dense: moe.first_dense,
        mlp_dense: (0..layers).map(|l| moe.is_dense(l)).collect(),
        scoring: moe.routing.scoring,
        routed_scaling: moe.routing.scaling,
        n_group: moe.routing.n_group,
        topk_group: moe.routing.topk_group,
        norm_topk_prob: moe.routing.norm_topk_prob,
        idx_heads: 0,
        idx_dim: 0,
        idx_topk: 0,
        indexer_full: vec![false; layers],
        rope_theta: base,
        softmax_scale,
        lora_eps: match src {
            Source::Gguf => eps,
            Source::Hf { .. } => LORA_NORM_EPS,
        },
        rms_eps: eps,
        vocab: hp.vocab,
        max_positions: ctx,
        tie_word_embeddings: hp.tie_word_embeddings.unwrap_or(false),
    };
    Ok((c, moe, rope_table))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's default gating for files without the key: GLM-4.7-Flash's shape is sigmoid,
    /// DeepSeek-V2-Lite's (27 layers, 102 400 tokens) and a GLM-vocabulary file of another depth
    /// softmax.
    #[test]
    fn gating_default_follows_llama_cpp() {
        assert_eq!(default_scoring(47, 154_880), Scoring::Sigmoid);
        assert_eq!(default_scoring(48, 154_880), Scoring::Sigmoid);
        assert_eq!(default_scoring(27, 102_400), Scoring::Softmax);
        assert_eq!(default_scoring(46, 154_880), Scoring::Softmax);
    }
}
