//! DeepSeek-V2 / V2-Lite / V3 (and the models llama.cpp runs as the same architecture, such
//! as GLM-4.7-Flash) from a GGUF file of llama.cpp's `deepseek2` architecture, onto GLM-5's MLA
//! + MoE model without the DSA indexer: every query attends to its whole context.
//!
//! Hyper-parameters, tensor names and arithmetic as llama.cpp reads and runs them
//! (`src/models/deepseek2.cpp`, `llama_context`'s YaRN factors in `src/llama-context.cpp`,
//! `conversion/deepseek.py` for what the converter wrote):
//!
//! - queries through the q LoRA (`attn_q_a`, `attn_q_a_norm`, `attn_q_b`) or, without one
//!   (V2-Lite), one `attn_q`;
//! - `attn_kv_a_mqa` gives the latent and the shared `k_pe`; `attn_k_b` (per head
//!   `[kv_lora × nope]`, i.e. W_UKᵀ) and `attn_v_b` (per head W_UV `[v × kv_lora]`), or a
//!   legacy file's unsplit `attn_kv_b`, become the absorbed per-head W_UK and W_UV;
//! - RoPE on adjacent pairs (llama.cpp's NORM type for `deepseek2`) over `rope.dimension_count`
//!   values, YaRN when `rope.scaling.type` says so, with DeepSeek's attention scale
//!   `mscale² / √(nope + rope)`, `mscale = 1 + 0.1 · mscale_all_dim · ln(factor)`;
//! - `leading_dense_block_count` dense layers, then the router (`ffn_gate_inp`, softmax or
//!   sigmoid by `expert_gating_func`; when absent, sigmoid for GLM-4.7-Flash and softmax for
//!   the V2 files written before the key, as llama.cpp decides),
//!   its selection bias `exp_probs_b` where present, group-limited top-k, the file's
//!   renormalization and `expert_weights_scale`, and the shared experts.

use std::path::Path;

use ggus::GGufMetaMapExt;

use sparrow_cpu::Weight;

use super::load::{absorbed_kv_b, load_mlp, weight_bytes, Parts};
use super::mla::{Mla, QProj};
use super::moe::Ffn;
use super::{DecoderLayer, Glm5Config, Glm5Model, Glm5Options};
use crate::checkpoint::gguf::{Gguf, GgufFile};
use crate::model::common::{RopeScaling, RopeTable};
use crate::model::llama::load::{load_moe, GgufHparams, MoeFamily};
use crate::model::llama::MoeConfig;
use crate::model::moe::{active_weight_bytes, Glu};
use crate::model::routing::Scoring;
use crate::model::vb::{GgufTensors, Vb, DEEPSEEK2_LAYER_NAMES, LLAMA_LAYER_NAMES, MOE_FFN_NAMES};
use crate::model::ModelInfo;
use crate::EngineError;

/// The GGUF architecture this loader reads.
pub const ARCH: &str = "deepseek2";

/// The hyper-parameters of a `deepseek2` file: the model's config, its feed-forward and its
/// RoPE table.
struct FileConfig {
    c: Glm5Config,
    moe: MoeConfig,
    rope: RopeTable,
}

/// RoPE and the attention scale of a `deepseek2` file as llama.cpp derives them: the table's
/// factor on every cosine and sine, and `kq_scale`.
///
/// llama.cpp's `llama_context` sets `yarn_attn_factor = 1 / (1 + 0.1 ln s)` under YaRN with a
/// `yarn_log_multiplier` (the DeepSeek `mscale / mscale_all_dim` ratio is 1, as `deepseek2`
/// takes `mscale = mscale_all_dim`; without one, `(1 + 0.1 ln s) / (1 + 0.1 ln s)` = 1), times
/// the file's `rope.scaling.attn_factor`; ggml's rope multiplies that back by
/// `1 + 0.1 ln s`; the graph scales the scores by `mscale² / √(nope + rope)` with `mscale =
/// attn_factor_org · (1 + 0.1 · log_mul · ln s)`, `log_mul` the file's `yarn_log_multiplier`
/// over 0.1 (the converter wrote `0.1 · mscale_all_dim`).
fn rope_and_scale(hp: &GgufHparams, head_k: usize) -> Result<(Option<RopeScaling>, f64, f32), EngineError> {
    let attn = hp.rope_scaling_attn_factor.map_or(1.0, f64::from);
    let factor = hp.rope_scaling_factor.filter(|f| *f != 0.0).map(f64::from);
    let scaling = match (hp.rope_scaling_type.as_deref(), factor) {
        (Some("none"), _) | (None | Some("yarn"), None) => None,
        // llama.cpp reads a factor without a type as linear scaling, which this model refuses.
        (None, Some(_)) => {
            return Err(EngineError::model(format!(
                "{ARCH}.rope.scaling.factor without rope.scaling.type (linear scaling) is not supported (none or yarn)"
            )))
        }
        (Some("yarn"), Some(f)) => {
            Some(RopeScaling::yarn(f, hp.rope_scaling_original_context_length.unwrap_or(hp.context_length)))
        }
        (Some(s), _) => {
            return Err(EngineError::model(format!("{ARCH}.rope.scaling.type = {s:?} is not supported (none or yarn)")))
        }
    };
    let s = scaling.map_or(1.0, |r| 1.0 / r.freq_scale);
    let log_mul = hp.rope_scaling_yarn_log_multiplier.map_or(0.0, |m| f64::from(m) / 0.1);
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

/// The router's scoring of a file without `expert_gating_func` (or with 0, "none"), as
/// llama.cpp decides it for `layers` trunk layers and a `vocab`-token vocabulary: sigmoid for
/// GLM-4.7-Flash (47 or 48 layers and GLM's 154 880 tokens), softmax for the DeepSeek-V2 / V2.5
/// files written before the key existed.
fn default_scoring(layers: usize, vocab: usize) -> Scoring {
    match (layers, vocab) {
        (47 | 48, 154_880) => Scoring::Sigmoid,
        _ => Scoring::Softmax,
    }
}

/// The hyper-parameters of `ld`, a `deepseek2` file.
fn file_config(ld: &Gguf<'_>) -> Result<FileConfig, EngineError> {
    let hp = GgufHparams::read(ld, ARCH)?;
    let need = |v: Option<usize>, key: &str| {
        v.ok_or_else(|| EngineError::model(format!("{ARCH}.{key} missing (an MLA architecture)")))
    };
    let kv_lora = need(hp.kv_lora_rank, "attention.kv_lora_rank")?;
    let rope = need(hp.rope_dimension_count, "rope.dimension_count")?;
    // Files since the split of `attn_kv_b` state the absorbed widths as key/value_length and
    // the per-head ones as *_mla (llama.cpp's `n_embd_head_k_mla()`).
    let head_k = need(hp.key_length_mla.or(hp.key_length), "attention.key_length")?;
    let v_dim = need(hp.value_length_mla.or(hp.value_length), "attention.value_length")?;
    if head_k <= rope || !rope.is_multiple_of(2) {
        return Err(EngineError::model(format!(
            "{ARCH}: a {head_k}-value query/key head cannot hold {rope} rotary values and a non-rotary part"
        )));
    }
    let layers = hp.block_count.saturating_sub(hp.nextn_predict_layers.unwrap_or(0));
    let vocab = ld.embedding_rows()?;
    let fam = MoeFamily {
        scoring: matches!(hp.expert_gating_func, None | Some(0)).then_some(default_scoring(layers, vocab)),
        norm_topk_prob: None,
        scaled: true,
        act: Glu::Silu,
    };
    let mut moe = hp.moe(ARCH, &fam)?;
    // llama.cpp's `deepseek2` sizes the shared experts as `expert_shared_count` routed ones.
    moe.shared_ffn = hp.expert_shared_count.unwrap_or(0) * moe.expert_ffn;
    if hp.attention_temperature_scale.is_some_and(|t| t != 0.0) {
        return Err(EngineError::model(format!(
            "{ARCH}.attention.temperature_scale is set: the attention temperature tuning of these files \
             (Mistral Large 3) is not supported"
        )));
    }
    // V2-Lite has no q LoRA: llama.cpp decides by the model, the tensors say the same.
    let q_lora_rank = match ld.has_tensor("blk.0.attn_q_a.weight") {
        true => need(hp.q_lora_rank.filter(|&r| r > 0), "attention.q_lora_rank")?,
        false => 0,
    };
    let (scaling, table_mscale, softmax_scale) = rope_and_scale(&hp, head_k)?;
    let base = hp.rope_freq_base.map_or(10000.0, f64::from);
    let ctx = hp.context_length;
    crate::model::common::check_rope_positions(&format!("{ARCH}.context_length"), ctx, rope, ld.file_len())?;
    let rope_table = match &scaling {
        Some(s) => RopeTable::llama_cpp_yarn(base, rope, ctx, None, s, table_mscale),
        None => RopeTable::llama_cpp(base, rope, ctx).scaled_by(table_mscale as f32),
    };
    let eps = hp.rms_eps.unwrap_or(1e-6);
    let c = Glm5Config {
        hidden: hp.embedding_length,
        layers,
        heads: hp.head_count,
        q_lora_rank,
        kv_lora_rank: kv_lora,
        qk_nope: head_k - rope,
        qk_rope: rope,
        v_dim,
        n_routed: moe.n_expert,
        top_k: moe.routing.top_k,
        n_shared: hp.expert_shared_count.unwrap_or(0),
        moe_inter: moe.expert_ffn,
        inter: hp.feed_forward_length,
        first_k_dense: moe.first_dense,
        mlp_dense: (0..layers).map(|l| l < moe.first_dense).collect(),
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
        lora_eps: eps,
        rms_eps: eps,
        vocab,
        max_positions: ctx,
        tie_word_embeddings: !ld.has_tensor("output.weight"),
    };
    Ok(FileConfig { c, moe, rope: rope_table })
}

impl Glm5Model {
    /// Loads a GGUF file of llama.cpp's `deepseek2` architecture (see the module docs).
    ///
    /// # Errors
    /// An unreadable file, a missing or mistyped hyper-parameter (named with its key), RoPE
    /// scaling other than YaRN, a tensor missing or of the wrong shape (named), or a tensor the
    /// model would not read.
    pub fn load_gguf(path: &Path, threads: usize, opts: Glm5Options) -> Result<Self, EngineError> {
        let file = GgufFile::open(path)?;
        let ld = file.view()?;
        let FileConfig { c, moe, rope } = file_config(&ld)?;
        c.check_from(&format!("{} ({ARCH})", path.display()))?;
        let h = c.hidden;
        let src =
            GgufTensors { ld: &ld, layer_names: &[DEEPSEEK2_LAYER_NAMES, LLAMA_LAYER_NAMES, MOE_FFN_NAMES], threads };
        let root = Vb::new(&src);
        let embed = root.matrix("model.embed_tokens", c.vocab, h)?;
        let lm_head = match c.tie_word_embeddings {
            true => None,
            false => Some(root.matrix("lm_head", c.vocab, h)?),
        };
        let vb = root.pp("model.layers");
        let layers = (0..c.layers).map(|l| load_layer(&vb.pp(l), &c, &moe, l)).collect::<Result<Vec<_>, _>>()?;
        let norm = root.vector("model.norm.weight", h)?;
        ld.check_all_read(ARCH, c.layers, |_| false)?;
        let weight_bytes = weight_bytes(&embed, lm_head.as_ref(), &layers);
        let moes = layers.iter().filter_map(|l| match &l.ffn {
            Ffn::Moe(m) => Some(m),
            Ffn::Dense(_) => None,
        });
        let active_weight_bytes = active_weight_bytes(weight_bytes, moes, &embed, lm_head.is_some());
        let info = ModelInfo {
            architecture: ARCH.into(),
            name: ld.meta().general_name().unwrap_or("unnamed").to_owned(),
            vocab_size: c.vocab,
            context_length: c.max_positions,
            num_layers: c.layers,
            hidden_size: h,
            weight_bytes,
            file_weight_bytes: Some(ld.read_bytes()),
            active_weight_bytes,
        };
        Glm5Model::assemble(Parts { cfg: c, info, opts, embed, lm_head, norm, layers, rope }, threads)
    }
}

/// Layer `l` under `vb` (`model.layers.{l}`, llama.cpp's `blk.{l}`).
fn load_layer(vb: &Vb<'_>, c: &Glm5Config, moe: &MoeConfig, l: usize) -> Result<DecoderLayer, EngineError> {
    let (h, hq) = (c.hidden, c.qk_nope + c.qk_rope);
    let a = vb.pp("self_attn");
    let q = match c.q_lora_rank {
        0 => QProj::Direct(a.linear("q_proj", c.heads * hq, h)?),
        r => QProj::Lora {
            a: a.linear("q_a_proj", r, h)?,
            norm: a.vector("q_a_layernorm.weight", r)?,
            b: a.linear("q_b_proj", c.heads * hq, r)?,
        },
    };
    let (w_uk, w_uv) = match a.has("kv_b_proj.weight") {
        true => absorbed_kv_b(&a.matrix("kv_b_proj", c.heads * (c.qk_nope + c.v_dim), c.kv_lora_rank)?, c),
        false => split_kv_b(&a, c)?,
    };
    let ffn = match c.mlp_dense[l] {
        true => Ffn::Dense(load_mlp(&vb.pp("mlp"), h, c.inter)?),
        false => Ffn::Moe(load_moe(&vb.pp("mlp"), h, moe)?),
    };
    Ok(DecoderLayer {
        input_ln: vb.vector("input_layernorm.weight", h)?,
        post_ln: vb.vector("post_attention_layernorm.weight", h)?,
        attn: Mla {
            q,
            kv_a: a.linear("kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope, h)?,
            kv_a_ln: a.vector("kv_a_layernorm.weight", c.kv_lora_rank)?,
            w_uk,
            w_uv: w_uv.into_iter().map(|data| Weight::Dense { rows: c.v_dim, cols: c.kv_lora_rank, data }).collect(),
            o: a.linear("o_proj", h, c.heads * c.v_dim)?,
            indexer: None,
        },
        ffn,
    })
}

/// W_UK (`[nope × kv_lora]`) and W_UV (`[v × kv_lora]`) per head, in f32, from a split file's
/// `attn_k_b` (GGUF shape `[nope, kv_lora, heads]`: per head W_UKᵀ, as the converter
/// transposed it) and `attn_v_b` (`[kv_lora, v, heads]`: per head W_UV).
fn split_kv_b(a: &Vb<'_>, c: &Glm5Config) -> Result<(Vec<Vec<f32>>, Vec<Vec<f32>>), EngineError> {
    let (nope, kvl) = (c.qk_nope, c.kv_lora_rank);
    let kb = a.experts("k_b_proj", c.heads, kvl, nope)?;
    let vb = a.experts("v_b_proj", c.heads, c.v_dim, kvl)?;
    let mut row = vec![0f32; nope.max(kvl)];
    let w_uk = kb
        .iter()
        .map(|k| {
            let mut uk = vec![0f32; nope * kvl];
            for j in 0..kvl {
                k.weight.row_f32(j, &mut row[..nope]);
                for (i, &x) in row[..nope].iter().enumerate() {
                    uk[i * kvl + j] = x;
                }
            }
            uk
        })
        .collect();
    let w_uv = vb
        .iter()
        .map(|v| {
            let mut uv = vec![0f32; c.v_dim * kvl];
            for (j, r) in uv.chunks_exact_mut(kvl).enumerate() {
                v.weight.row_f32(j, r);
            }
            uv
        })
        .collect();
    Ok((w_uk, w_uv))
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
