//! Builds a [`Glm5Model`] from a Hugging Face checkpoint directory: HF transformers' state-dict
//! names (`modeling_glm_moe_dsa.py`), ModelOpt NVFP4 or BF16/F32 tensors through
//! [`Checkpoint`]. `kv_b_proj` is split per head into `W_UK` and `W_UV` here, once, for the
//! absorbed attention.

use std::path::Path;

use sparrow_cpu::format::ggml::QActs;
use sparrow_cpu::{Isa, ThreadPool, Weight};

use super::indexer::Indexer;
use super::mla::{Mla, QProj};
use super::moe::{routing, Ffn};
use super::{AttnStats, DecoderLayer, Glm5Config, Glm5Model, Glm5Options};
use crate::checkpoint::hf::Checkpoint;
use crate::model::common::RopeTable;
use crate::model::linear::Linear;
use crate::model::moe::{Glu, Mlp, Moe};
use crate::model::vb::Vb;
use crate::model::{Instruments, ModelInfo};
use crate::EngineError;

impl Glm5Model {
    /// Loads a checkpoint directory (`config.json`, safetensors, NVFP4 config).
    ///
    /// # Errors
    /// Anything [`Checkpoint::open`], [`Glm5Config::from_json`] or a tensor check refuses.
    pub fn load(dir: &Path, threads: usize, opts: Glm5Options) -> Result<Self, EngineError> {
        let ck = Checkpoint::open(dir)?;
        // Checked before the config is built: it sizes per-layer tables by the count.
        let stated = ck.config.get("num_hidden_layers").and_then(serde_json::Value::as_u64);
        ck.check_layers("num_hidden_layers", stated.map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX)))?;
        let c = Glm5Config::from_json(&ck.config)?;
        let h = c.hidden;
        let layers = (0..c.layers).map(|l| load_layer(&ck, &c, l)).collect::<Result<Vec<_>, _>>()?;
        let (es, embed) = ck.f32("model.embed_tokens.weight")?;
        if es != [c.vocab, h] {
            return Err(EngineError::model(format!(
                "model.embed_tokens.weight: shape {es:?}, want [{}, {h}]",
                c.vocab
            )));
        }
        let embed = Weight::Dense { rows: c.vocab, cols: h, data: embed };
        let lm_head = match (c.tie_word_embeddings, ck.has("lm_head.weight")) {
            (true, _) => None,
            (false, true) => Some(ck.linear("lm_head", c.vocab, h)?),
            (false, false) => {
                return Err(EngineError::model("lm_head.weight missing and tie_word_embeddings is false"))
            }
        };
        let norm = ck.vector("model.norm.weight", h)?;
        crate::model::common::check_rope_positions(
            "max_position_embeddings",
            c.max_positions,
            c.qk_rope,
            ck.file_bytes(),
        )?;
        let rope = RopeTable::hf_f32(c.rope_theta, c.qk_rope, c.max_positions);
        let info = ModelInfo {
            architecture: "glm_moe_dsa".into(),
            name: dir.file_name().map_or("glm5".into(), |n| n.to_string_lossy().into_owned()),
            vocab_size: c.vocab,
            context_length: c.max_positions,
            num_layers: c.layers,
            hidden_size: h,
            weight_bytes: weight_bytes(&embed, lm_head.as_ref(), &layers),
            file_weight_bytes: None,
            active_weight_bytes: None,
        };
        Glm5Model::assemble(Parts { cfg: c, info, opts, embed, lm_head, norm, layers, rope }, threads)
    }

    /// The model of loaded `parts`, with a pool of `threads` and fresh scratch and counters.
    ///
    /// # Errors
    /// A thread pool that cannot start.
    pub(super) fn assemble(p: Parts, threads: usize) -> Result<Self, EngineError> {
        let pool = ThreadPool::new(threads).map_err(|e| EngineError::model(format!("thread pool: {e}")))?;
        Ok(Glm5Model {
            cfg: p.cfg,
            info: p.info,
            opts: p.opts,
            embed: p.embed,
            lm_head: p.lm_head,
            norm: p.norm,
            layers: p.layers,
            rope: p.rope,
            pool,
            isa: Isa::detect(),
            xq: QActs::default(),
            bufs: Default::default(),
            stats: AttnStats::default(),
            inst: Instruments::default(),
        })
    }
}

/// What a loader reads for a [`Glm5Model`]: its config and facts, the weights and the RoPE
/// table.
pub(super) struct Parts {
    pub(super) cfg: Glm5Config,
    pub(super) info: ModelInfo,
    pub(super) opts: Glm5Options,
    pub(super) embed: Weight,
    pub(super) lm_head: Option<Weight>,
    pub(super) norm: Vec<f32>,
    pub(super) layers: Vec<DecoderLayer>,
    pub(super) rope: RopeTable,
}

/// Layer `l` (`model.layers.{l}`).
fn load_layer(ck: &Checkpoint, c: &Glm5Config, l: usize) -> Result<DecoderLayer, EngineError> {
    let (h, hq) = (c.hidden, c.qk_nope + c.qk_rope);
    let vb = Vb::new(ck).pp("model.layers").pp(l);
    let a = vb.pp("self_attn");
    let (w_uk, w_uv) = absorbed_kv_b(&a.matrix("kv_b_proj", c.heads * (c.qk_nope + c.v_dim), c.kv_lora_rank)?, c);
    let indexer = if c.indexer_full[l] {
        let ix = a.pp("indexer");
        Some(Indexer {
            wq_b: ix.linear("wq_b", c.idx_heads * c.idx_dim, c.q_lora_rank)?,
            wk: ix.linear("wk", c.idx_dim, h)?,
            k_norm_w: ix.vector("k_norm.weight", c.idx_dim)?,
            k_norm_b: ix.vector("k_norm.bias", c.idx_dim)?,
            weights_proj: ix.linear("weights_proj", c.idx_heads, h)?,
        })
    } else {
        None
    };
    let ffn = if c.mlp_dense[l] {
        Ffn::Dense(load_mlp(&vb.pp("mlp"), h, c.inter)?)
    } else {
        Ffn::Moe(load_moe(ck, c, &vb.pp("mlp"))?)
    };
    Ok(DecoderLayer {
        input_ln: vb.vector("input_layernorm.weight", h)?,
        post_ln: vb.vector("post_attention_layernorm.weight", h)?,
        attn: Mla {
            q: QProj::Lora {
                a: a.linear("q_a_proj", c.q_lora_rank, h)?,
                norm: a.vector("q_a_layernorm.weight", c.q_lora_rank)?,
                b: a.linear("q_b_proj", c.heads * hq, c.q_lora_rank)?,
            },
            kv_a: a.linear("kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope, h)?,
            kv_a_ln: a.vector("kv_a_layernorm.weight", c.kv_lora_rank)?,
            w_uk,
            w_uv: w_uv.into_iter().map(|data| Weight::Dense { rows: c.v_dim, cols: c.kv_lora_rank, data }).collect(),
            o: a.linear("o_proj", h, c.heads * c.v_dim)?,
            indexer,
        },
        ffn,
    })
}

/// `kv_b_proj` (`[heads·(nope + v) × kv_lora]`) as per-head `W_UK [nope × kv_lora]` and
/// `W_UV [v × kv_lora]`, in f32.
pub(super) type AbsorbedKvB = (Vec<Vec<f32>>, Vec<Vec<f32>>);

pub(super) fn absorbed_kv_b(kv_b: &Weight, c: &Glm5Config) -> AbsorbedKvB {
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
    (w_uk, w_uv)
}

/// A SwiGLU MLP under `vb` (`gate_proj`, `up_proj`, `down_proj`), gate and up stacked.
pub(super) fn load_mlp(vb: &Vb<'_>, hidden: usize, inter: usize) -> Result<Mlp, EngineError> {
    let gate_up = Linear::stack(vec![vb.linear("gate_proj", inter, hidden)?, vb.linear("up_proj", inter, hidden)?]);
    Ok(Mlp { gate_up, down: vb.linear("down_proj", hidden, inter)?, inter, act: Glu::Silu })
}

/// The MoE block under `vb` (`model.layers.L.mlp`): routed experts, shared experts, the router
/// (f32, read from `ck` whatever the quantization config says of it) and its correction bias.
fn load_moe(ck: &Checkpoint, c: &Glm5Config, vb: &Vb<'_>) -> Result<Moe, EngineError> {
    let h = c.hidden;
    let experts =
        (0..c.n_routed).map(|e| load_mlp(&vb.pp("experts").pp(e), h, c.moe_inter)).collect::<Result<Vec<_>, _>>()?;
    let shared = match c.n_shared > 0 {
        true => Some(load_mlp(&vb.pp("shared_experts"), h, c.moe_inter * c.n_shared)?),
        false => None,
    };
    let gate_name = vb.path("gate.weight");
    let (gs, gate) = ck.f32(&gate_name)?;
    if gs != [c.n_routed, h] {
        return Err(EngineError::model(format!("{gate_name}: shape {gs:?}, want [{}, {h}]", c.n_routed)));
    }
    Ok(Moe {
        gate: Weight::Dense { rows: c.n_routed, cols: h, data: gate },
        gate_bias: None,
        bias: Some(vb.vector("gate.e_score_correction_bias", c.n_routed)?),
        routing: routing(c),
        experts,
        shared,
    })
}

/// Bytes of weights held, for [`ModelInfo::weight_bytes`].
pub(super) fn weight_bytes(embed: &Weight, lm_head: Option<&Weight>, layers: &[DecoderLayer]) -> usize {
    let mut wbytes = embed.bytes() + lm_head.map_or(0, Weight::bytes);
    for l in layers {
        let m = &l.attn;
        wbytes += m.q.linears().iter().chain([&&m.kv_a, &&m.o]).map(|x| x.weight.bytes()).sum::<usize>();
        wbytes += 4 * m.w_uk.iter().map(Vec::len).sum::<usize>() + m.w_uv.iter().map(Weight::bytes).sum::<usize>();
        if let Some(ix) = &m.indexer {
            wbytes += [&ix.wq_b, &ix.wk, &ix.weights_proj].iter().map(|x| x.weight.bytes()).sum::<usize>();
        }
        wbytes += match &l.ffn {
            Ffn::Dense(m) => m.bytes(),
            Ffn::Moe(m) => m.bytes(),
        };
    }
    wbytes
}
