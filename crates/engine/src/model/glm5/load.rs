//! Builds a [`Glm5Model`] from a file, through one layer loader over HF module names ([`Vb`]):
//! a Hugging Face checkpoint directory (GLM-5's `glm_moe_dsa` with its DSA indexer, or
//! DeepSeek's `deepseek_v2` / `deepseek_v3`; ModelOpt NVFP4 or BF16/F32 tensors through
//! [`Checkpoint`]) or a llama.cpp `deepseek2` GGUF file (tensors by llama.cpp's names,
//! [`GgufTensors`]). `kv_b_proj` (or a GGUF file's split `attn_k_b` / `attn_v_b`) becomes the
//! per-head `W_UK` and `W_UV` here, once, for the absorbed attention.

use std::path::Path;

use ggus::GGufMetaMapExt;
use sparrow_cpu::format::ggml::QActs;
use sparrow_cpu::{Isa, ThreadPool, Weight};

use super::deepseek::{self, Source};
use super::indexer::Indexer;
use super::mla::{Mla, QProj};
use super::moe::{routing, Ffn};
use super::{AttnStats, DecoderLayer, Glm5Config, Glm5Model, Glm5Options};
use crate::checkpoint::gguf::GgufFile;
use crate::checkpoint::hf::Checkpoint;
use crate::model::common::{check_rope_positions, RopeTable};
use crate::model::hparams::HParams;
use crate::model::moe::{active_weight_bytes, Glu, Mlp, Moe, MoeConfig};
use crate::model::vb::{GgufTensors, Vb, DEEPSEEK2_LAYER_NAMES, LLAMA_LAYER_NAMES, MOE_FFN_NAMES};
use crate::model::{Instruments, ModelInfo};
use crate::EngineError;

/// The GGUF architecture [`Glm5Model::load_gguf`] reads.
pub const GGUF_ARCH: &str = "deepseek2";

impl Glm5Model {
    /// Loads a checkpoint directory (`config.json`, safetensors, NVFP4 config) of `model_type`
    /// `glm_moe_dsa` (GLM-5, its RoPE as HF computes it) or `deepseek_v2` / `deepseek_v3`
    /// (RoPE and YaRN as llama.cpp computes them for the same model's GGUF file).
    ///
    /// # Errors
    /// Anything [`Checkpoint::open`], [`Glm5Config::from_json`], [`HParams::from_hf`] or a
    /// tensor check refuses.
    pub fn load(dir: &Path, threads: usize, opts: Glm5Options) -> Result<Self, EngineError> {
        let ck = Checkpoint::open(dir)?;
        // Checked before the config is built: it sizes per-layer tables by the count.
        let stated = ck.config.get("num_hidden_layers").and_then(serde_json::Value::as_u64);
        ck.check_layers("num_hidden_layers", stated.map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX)))?;
        let mt = ck.config.get("model_type").and_then(|v| v.as_str()).unwrap_or("").to_owned();
        let (c, moe, rope) = match mt.as_str() {
            "deepseek_v2" | "deepseek_v3" => {
                let hp = HParams::from_hf(&ck.config)?;
                let has_q_lora = ck.has("model.layers.0.self_attn.q_a_proj.weight");
                deepseek::config(&hp, Source::Hf { v2: mt == "deepseek_v2" }, has_q_lora, ck.file_bytes())?
            }
            _ => {
                let c = Glm5Config::from_json(&ck.config)?;
                check_rope_positions("max_position_embeddings", c.max_positions, c.qk_rope, ck.file_bytes())?;
                let rope = RopeTable::hf_f32(c.rope_theta, c.qk_rope, c.max_positions);
                let moe = moe_config(&c);
                (c, moe, rope)
            }
        };
        c.check_from("config.json")?;
        if !c.tie_word_embeddings && !ck.has("lm_head.weight") {
            return Err(EngineError::model("lm_head.weight missing and tie_word_embeddings is false"));
        }
        let name = dir.file_name().map_or("glm5".into(), |n| n.to_string_lossy().into_owned());
        load_from(&Vb::new(&ck), c, &moe, rope, mt, name, opts, threads)
    }

    /// Loads a GGUF file of llama.cpp's `deepseek2` architecture ([`deepseek`]).
    ///
    /// # Errors
    /// An unreadable file, a missing or mistyped hyper-parameter (named with its key), RoPE
    /// scaling other than YaRN, a tensor missing or of the wrong shape (named), or a tensor the
    /// model would not read.
    pub fn load_gguf(path: &Path, threads: usize, opts: Glm5Options) -> Result<Self, EngineError> {
        let file = GgufFile::open(path)?;
        let ld = file.view()?;
        let hp = HParams::from_gguf(&ld, GGUF_ARCH)?;
        let has_q_lora = ld.has_tensor("blk.0.attn_q_a.weight");
        let (mut c, moe, rope) = deepseek::config(&hp, Source::Gguf, has_q_lora, ld.file_len())?;
        c.tie_word_embeddings = !ld.has_tensor("output.weight");
        c.check_from(&format!("{} ({GGUF_ARCH})", path.display()))?;
        let src =
            GgufTensors { ld: &ld, layer_names: &[DEEPSEEK2_LAYER_NAMES, LLAMA_LAYER_NAMES, MOE_FFN_NAMES], threads };
        let name = ld.meta().general_name().unwrap_or("unnamed").to_owned();
        let layers = c.layers;
        let mut m = load_from(&Vb::new(&src), c, &moe, rope, GGUF_ARCH.into(), name, opts, threads)?;
        ld.check_all_read(GGUF_ARCH, layers, |_| false)?;
        m.info.file_weight_bytes = Some(ld.read_bytes());
        Ok(m)
    }

    /// The model of loaded `parts`, with a pool of `threads` and fresh scratch and counters.
    ///
    /// # Errors
    /// A thread pool that cannot start.
    fn assemble(p: Parts, threads: usize) -> Result<Self, EngineError> {
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
struct Parts {
    cfg: Glm5Config,
    info: ModelInfo,
    opts: Glm5Options,
    embed: Weight,
    lm_head: Option<Weight>,
    norm: Vec<f32>,
    layers: Vec<DecoderLayer>,
    rope: RopeTable,
}

/// GLM-5's feed-forward settings in the shared MoE's terms.
fn moe_config(c: &Glm5Config) -> MoeConfig {
    MoeConfig {
        n_expert: c.n_routed,
        expert_ffn: c.moe_inter,
        shared_ffn: c.moe_inter * c.n_shared,
        first_dense: c.first_k_dense,
        dense_layers: Some(c.mlp_dense.clone()),
        routing: routing(c),
        act: Glu::Silu,
    }
}

/// The model under `root` (HF names), weight bytes counted as read.
#[allow(clippy::too_many_arguments)]
fn load_from(
    root: &Vb<'_>,
    c: Glm5Config,
    moe: &MoeConfig,
    rope: RopeTable,
    arch: String,
    name: String,
    opts: Glm5Options,
    threads: usize,
) -> Result<Glm5Model, EngineError> {
    let h = c.hidden;
    let embed = root.dense("model.embed_tokens", c.vocab, h)?;
    let lm_head = match c.tie_word_embeddings {
        true => None,
        false => Some(root.matrix("lm_head", c.vocab, h)?),
    };
    let vb = root.pp("model.layers");
    let layers = (0..c.layers).map(|l| load_layer(&vb.pp(l), &c, moe, l)).collect::<Result<Vec<_>, _>>()?;
    let norm = root.vector("model.norm.weight", h)?;
    let weight_bytes = root.held_bytes();
    let moes = layers.iter().filter_map(|l| match &l.ffn {
        Ffn::Moe(m) => Some(m),
        Ffn::Dense(_) => None,
    });
    let active_weight_bytes = active_weight_bytes(weight_bytes, moes, &embed, lm_head.is_some());
    let info = ModelInfo {
        architecture: arch,
        name,
        vocab_size: c.vocab,
        context_length: c.max_positions,
        num_layers: c.layers,
        hidden_size: h,
        weight_bytes,
        file_weight_bytes: None,
        active_weight_bytes,
    };
    Glm5Model::assemble(Parts { cfg: c, info, opts, embed, lm_head, norm, layers, rope }, threads)
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
    let (w_uk, w_uv) = absorbed_kv_b(&a, c)?;
    let indexer = match c.indexer_full[l] {
        true => {
            let ix = a.pp("indexer");
            Some(Indexer {
                wq_b: ix.linear("wq_b", c.idx_heads * c.idx_dim, c.q_lora_rank)?,
                wk: ix.linear("wk", c.idx_dim, h)?,
                k_norm_w: ix.vector("k_norm.weight", c.idx_dim)?,
                k_norm_b: ix.vector("k_norm.bias", c.idx_dim)?,
                weights_proj: ix.linear("weights_proj", c.idx_heads, h)?,
            })
        }
        false => None,
    };
    let ffn = match c.mlp_dense[l] {
        true => Ffn::Dense(Mlp::load(&vb.pp("mlp"), h, c.inter, Glu::Silu)?),
        false => Ffn::Moe(Moe::load(&vb.pp("mlp"), h, moe)?),
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
            indexer,
        },
        ffn,
    })
}

/// Per-head `W_UK [nope × kv_lora]` and `W_UV [v × kv_lora]`, in f32.
type AbsorbedKvB = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// `W_UK` and `W_UV` of the attention under `a`: from `kv_b_proj` (`[heads·(nope + v) ×
/// kv_lora]`), or from a GGUF file's split `attn_k_b` (shape `[nope, kv_lora, heads]`: per head
/// W_UKᵀ, as the converter transposed it) and `attn_v_b` (`[kv_lora, v, heads]`: per head
/// W_UV). The count of held bytes is told they are kept in f32.
fn absorbed_kv_b(a: &Vb<'_>, c: &Glm5Config) -> Result<AbsorbedKvB, EngineError> {
    let (nope, kvl, v) = (c.qk_nope, c.kv_lora_rank, c.v_dim);
    let (mut w_uk, mut w_uv) = (Vec::with_capacity(c.heads), Vec::with_capacity(c.heads));
    let read = match a.has("kv_b_proj.weight") {
        true => {
            let kv_b = a.matrix("kv_b_proj", c.heads * (nope + v), kvl)?;
            let mut row = vec![0f32; kvl];
            for hd in 0..c.heads {
                let base = hd * (nope + v);
                let mut uk = Vec::with_capacity(nope * kvl);
                for i in 0..nope {
                    kv_b.row_f32(base + i, &mut row);
                    uk.extend_from_slice(&row);
                }
                let mut uv = Vec::with_capacity(v * kvl);
                for j in 0..v {
                    kv_b.row_f32(base + nope + j, &mut row);
                    uv.extend_from_slice(&row);
                }
                w_uk.push(uk);
                w_uv.push(uv);
            }
            kv_b.bytes()
        }
        false => {
            let kb = a.experts("k_b_proj", c.heads, kvl, nope)?;
            let vb = a.experts("v_b_proj", c.heads, v, kvl)?;
            let mut row = vec![0f32; nope.max(kvl)];
            for k in &kb {
                let mut uk = vec![0f32; nope * kvl];
                for j in 0..kvl {
                    k.weight.row_f32(j, &mut row[..nope]);
                    for (i, &x) in row[..nope].iter().enumerate() {
                        uk[i * kvl + j] = x;
                    }
                }
                w_uk.push(uk);
            }
            for m in &vb {
                let mut uv = vec![0f32; v * kvl];
                for (j, r) in uv.chunks_exact_mut(kvl).enumerate() {
                    m.weight.row_f32(j, r);
                }
                w_uv.push(uv);
            }
            kb.iter().chain(&vb).map(|l| l.weight.bytes()).sum()
        }
    };
    let held = 4 * (w_uk.iter().map(Vec::len).sum::<usize>() + w_uv.iter().map(Vec::len).sum::<usize>());
    a.held_as(read, held);
    Ok((w_uk, w_uv))
}
