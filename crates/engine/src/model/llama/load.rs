//! Building a [`LlamaModel`] from a file: a GGUF of a decoder family (hyper-parameters from its
//! metadata, tensors by llama.cpp's names, kept at the file's block type) or a Hugging Face
//! directory (BF16/F32 or ModelOpt NVFP4), through one layer loader over HF module names
//! ([`Vb`]); Q/K/V and gate/up stacked into one matrix each (or read packed). Which family a
//! file is comes from [`crate::model::arch`].

use std::path::Path;

use ggus::GGufMetaMapExt;

use super::config::Format;
use super::*;
use crate::checkpoint::gguf::GgufFile;
use crate::checkpoint::hf::Checkpoint;
use crate::model::arch::{self, Arch, Body};
use crate::model::common::{check_rope_positions, RopeTable};
use crate::model::family::{Family, RecurrentMixer};
use crate::model::hparams::HParams;
use crate::model::vb::{GgufTensors, Renamed, Vb};

/// The family of decoder architecture `a`.
fn family(a: &Arch, what: &str) -> Result<Family, EngineError> {
    match a.body {
        Body::Decoder(f) => Ok(f),
        _ => Err(EngineError::model(format!("{what}: architecture {:?} is not a Llama-layer decoder", a.name))),
    }
}

impl LlamaModel {
    /// Loads a GGUF file of a decoder family keyed by `general.architecture` (a
    /// [`Body::Decoder`] row of [`arch::ARCHITECTURES`]); `threads` is the size of the compute
    /// pool.
    ///
    /// # Errors
    /// [`EngineError::Model`] for an unreadable file, another architecture, a missing tensor,
    /// a tensor the family does not use, an unsupported tensor type or inconsistent shapes.
    pub fn load(path: &Path, threads: usize) -> Result<Self, EngineError> {
        // Mapped only while the weights are copied into our own layout.
        let file = GgufFile::open(path)?;
        let ld = file.view()?;
        let name = ld
            .meta()
            .general_architecture()
            .map_err(|e| EngineError::model(format!("general.architecture: {e:?}")))?
            .to_owned();
        let a = arch::by_gguf(&name).map_err(|e| EngineError::model(format!("{}: {e}", path.display())))?;
        let fam = family(a, &path.display().to_string())?;
        let hp = HParams::from_gguf(&ld, a.name)?;
        let cfg = LlamaConfig::from_hparams(&hp, &fam, Format::Gguf, ld.has_tensor("blk.0.attn_q_norm.weight"))?;
        cfg.check()?;
        if !cfg.variant.no_rope.iter().all(|n| *n) {
            check_rope_positions(&format!("{name}.context_length"), cfg.context_length, cfg.head_dim, ld.file_len())?;
        }
        let src = GgufTensors { ld: &ld, layer_names: fam.layer_names, threads };
        let root = Vb::new(&src);
        let tied = !root.has("lm_head.weight");
        let model_name = ld.meta().general_name().unwrap_or("unnamed").to_owned();
        let mut m = Self::load_from(&root, cfg, &fam, tied, name.clone(), model_name, threads)?;
        // LongRoPE files hold factors for both regimes; one is used.
        ld.check_all_read(&name, m.cfg.layers, |n| n.starts_with("rope_factors_"))?;
        m.info.file_weight_bytes = Some(ld.read_bytes());
        Ok(m)
    }

    /// Loads a Hugging Face checkpoint directory of a decoder family (a `model_type` of a
    /// [`Body::Decoder`] row: `llama`, `mistral`, `qwen2`, `qwen3`, `smollm3`, `phi3`,
    /// `granite`, `ministral3`, `qwen3_moe`, `glm4_moe`, `gpt_oss` (its MXFP4 experts as the
    /// checkpoint packs them, [`crate::checkpoint::mxfp4`]); `config.json`, safetensors
    /// weights, optionally ModelOpt NVFP4, e.g. from `sparrow quantize`), RoPE scaling as
    /// [`HParams::from_hf`] reads it.
    ///
    /// HF stores Q and K for `rotate_half` RoPE (pairs `(i, i + d/2)` of a head), which the
    /// forward rotates as they are ([`RopeLayout::Halves`]).
    ///
    /// # Errors
    /// As [`Checkpoint::open`], plus another `model_type`, unsupported RoPE scaling, or tensors
    /// of the wrong shape.
    pub fn load_hf(dir: &Path, threads: usize) -> Result<Self, EngineError> {
        let ck = Checkpoint::open(dir)?;
        let mt = ck.config.get("model_type").and_then(|v| v.as_str()).unwrap_or("").to_owned();
        let a = arch::by_model_type(&mt).map_err(|e| EngineError::model(format!("{}: {e}", dir.display())))?;
        let mut hp = HParams::from_hf(&ck.config)?;
        // Nemotron-H and Nemotron-H MoE share one `model_type`: expert layers in the layer
        // pattern tell them apart (transformers 5 writes expert counts into every Nemotron-H
        // config, dense ones too).
        let sparse = hp.moe.as_ref().and_then(|m| m.dense_layers.as_ref()).is_some_and(|d| d.iter().any(|x| !x));
        let a = match a.name == "nemotron_h" && hp.moe.is_some() && sparse {
            true => {
                arch::by_gguf("nemotron_h_moe").map_err(|e| EngineError::model(format!("{}: {e}", dir.display())))?
            }
            false => a,
        };
        if a.name == "nemotron_h" {
            hp.moe = None;
        }
        let fam = family(a, &dir.display().to_string())?;
        ck.check_layers("num_hidden_layers", hp.layers)?;
        let cfg = LlamaConfig::from_hparams(&hp, &fam, Format::Hf, ck.has("model.layers.0.self_attn.q_norm.weight"))?;
        cfg.check()?;
        if !cfg.variant.no_rope.iter().all(|n| *n) {
            check_rope_positions("max_position_embeddings", cfg.context_length, cfg.head_dim, ck.file_bytes())?;
        }
        let renamed = Renamed { inner: &ck, names: fam.hf_names };
        // A multimodal checkpoint keeps the language model under `model.language_model`.
        let vlm = Renamed { inner: &renamed, names: crate::model::vb::LANGUAGE_MODEL_NAMES };
        let nested = ck.has("model.language_model.embed_tokens.weight");
        let root = Vb::new(if nested { &vlm } else { &renamed });
        let tied = hp.tie_word_embeddings.unwrap_or(false) || !ck.has("lm_head.weight");
        let name = dir.file_name().map_or(mt.clone(), |n| n.to_string_lossy().into_owned());
        Self::load_from(&root, cfg, &fam, tied, mt, name, threads)
    }

    /// The model under `root` (HF names): embedding, layers, final norm and head, the RoPE
    /// tables and the weight bytes counted as read.
    fn load_from(
        root: &Vb<'_>,
        cfg: LlamaConfig,
        fam: &Family,
        tied: bool,
        arch: String,
        name: String,
        threads: usize,
    ) -> Result<Self, EngineError> {
        let (hidden, vocab) = (cfg.hidden, cfg.vocab);
        let embed = root.dense("model.embed_tokens", vocab, hidden)?;
        let output = match tied {
            true => None,
            false => Some(root.matrix("lm_head", vocab, hidden)?),
        };
        let vb = root.pp("model.layers");
        let layers = (0..cfg.layers).map(|l| load_layer(&vb.pp(l), l, &cfg, fam)).collect::<Result<Vec<_>, _>>()?;
        let output_norm = norm_vector(root, "model.norm.weight", hidden, cfg.variant.norm_offset)?;
        let factors = cfg.variant.rope_freq_factors.as_ref().map_or(0, |f| 4 * f.len());
        let weight_bytes = root.held_bytes() + factors;
        Self::assemble(cfg, arch, name, embed, output, output_norm, layers, weight_bytes, threads)
    }

    /// The model of loaded weights, with RoPE tables for its context and a pool of
    /// `threads`.
    ///
    /// # Errors
    /// A thread pool that cannot start.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn assemble(
        cfg: LlamaConfig,
        arch: String,
        name: String,
        embed: Weight,
        output: Option<Weight>,
        output_norm: Vec<f32>,
        layers: Vec<Layer>,
        weight_bytes: usize,
        threads: usize,
    ) -> Result<Self, EngineError> {
        let (ff, dims, m) =
            (cfg.variant.rope_freq_factors.as_deref(), cfg.variant.rope_dims, cfg.variant.rope_attn_factor);
        // One table per RoPE base, under the file's scaling (YaRN / linear) or none.
        let table = |base: f32| match &cfg.variant.rope_scaling {
            Some(s) => RopeTable::llama_cpp_yarn(base as f64, dims, cfg.context_length, ff, s, s.mscale(m as f64)),
            None => RopeTable::llama_cpp_scaled(base as f64, dims, cfg.context_length, ff).scaled_by(m),
        };
        // A model without RoPE (Nemotron-H) keeps an empty table whatever its context.
        let table = |base: f32| match cfg.variant.no_rope.iter().all(|n| *n) {
            true => RopeTable::llama_cpp(base as f64, dims, 0),
            false => table(base),
        };
        let rope = table(cfg.rope_base);
        let local = cfg.variant.windows.iter().any(Option::is_some) && cfg.variant.rope_local_base != cfg.rope_base;
        let rope_local = local.then(|| table(cfg.variant.rope_local_base));
        let moes = layers.iter().filter_map(|l| match &l.ffn {
            Some(FeedForward::Moe(m)) => Some(&**m),
            _ => None,
        });
        let info = ModelInfo {
            architecture: arch,
            name,
            vocab_size: cfg.vocab,
            context_length: cfg.context_length,
            num_layers: cfg.layers,
            hidden_size: cfg.hidden,
            weight_bytes,
            file_weight_bytes: None,
            active_weight_bytes: crate::model::moe::active_weight_bytes(weight_bytes, moes, &embed, output.is_some()),
        };
        let pool = ThreadPool::new(threads).map_err(|e| EngineError::model(format!("thread pool: {e}")))?;
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

/// RMSNorm weight `name` under `vb`, plus `offset` (1 for a zero-centred HF checkpoint).
fn norm_vector(vb: &Vb<'_>, name: &str, len: usize, offset: f32) -> Result<Vec<f32>, EngineError> {
    let mut w = vb.vector(name, len)?;
    if offset != 0.0 {
        w.iter_mut().for_each(|v| *v += offset);
    }
    Ok(w)
}

/// Decoder layer `vb` (`model.layers.{l}`), by HF module names (a GGUF file maps them to
/// llama.cpp's, [`GgufTensors`]). Q/K/V and gate/up are stacked, each a single matmul; a
/// projection's bias is taken when the file has one, and required for Q/K/V where the family
/// says so.
fn load_layer(vb: &Vb<'_>, l: usize, cfg: &LlamaConfig, fam: &Family) -> Result<Layer, EngineError> {
    let (hidden, hd, qd, kvd) = (cfg.hidden, cfg.head_dim, cfg.q_dim(), cfg.kv_heads * cfg.head_dim);
    let (attn, mlp) = (vb.pp("self_attn"), vb.pp("mlp"));
    // Nemotron-H: a block is a recurrent mixer, an attention or an MLP, one of them.
    let la = cfg.linear_attn.as_ref();
    let ffn_only = la.is_some_and(|la| la.ffn_only[l]);
    let mixer_only = matches!(cfg.recurrent, Some(RecurrentMixer::Mamba2)) && !ffn_only;
    let ffn = match &cfg.moe {
        _ if mixer_only => None,
        Some(m) if !m.is_dense(l) => {
            // Nemotron-H MoE always routes with its selection bias (llama.cpp requires
            // `exp_probs_b`): without it the choice of experts would silently be another. The
            // read names the tensor as the file does.
            let bias = "gate.e_score_correction_bias";
            if matches!(cfg.recurrent, Some(RecurrentMixer::Mamba2)) && !mlp.has(bias) {
                let e = match mlp.vector(bias, m.n_expert) {
                    Err(EngineError::Model(e)) => e,
                    _ => mlp.path(bias),
                };
                return Err(EngineError::model(format!(
                    "{e} (Nemotron-H MoE chooses experts with its selection bias)"
                )));
            }
            Some(FeedForward::Moe(Box::new(Moe::load(&mlp, hidden, m)?)))
        }
        _ => Some(FeedForward::Dense(Mlp::load(&mlp, hidden, cfg.ffn, cfg.variant.act)?)),
    };
    let norm = |name: &str, len: usize| norm_vector(vb, name, len, cfg.variant.norm_offset);
    let pair = |a: &str, b: &str, len: usize| -> Result<(Vec<f32>, Vec<f32>), EngineError> {
        Ok((norm(a, len)?, norm(b, len)?))
    };
    let mixer = match (la, cfg.recurrent) {
        _ if ffn_only => None,
        (Some(la), Some(kind)) if la.recurrent[l] => {
            let state_layer = la.recurrent[..l].iter().filter(|r| **r).count();
            Some(match kind {
                RecurrentMixer::DeltaNet(layout) => {
                    Mixer::DeltaNet(Box::new(DeltaNet::load(vb, hidden, la, layout, state_layer, cfg.rms_eps)?))
                }
                RecurrentMixer::Mamba2 => {
                    Mixer::Mamba2(Box::new(Mamba2::load(vb, hidden, la, state_layer, cfg.rms_eps)?))
                }
            })
        }
        _ => {
            if fam.qkv_bias {
                if let Some(p) = ["q_proj", "k_proj", "v_proj"].iter().find(|p| !attn.has(&format!("{p}.bias"))) {
                    return Err(EngineError::model(format!(
                        "{}.bias missing (the architecture has Q/K/V biases)",
                        attn.path(p)
                    )));
                }
            }
            // A gated layer's query projection gives each head its query and its gate.
            let q_rows = if cfg.variant.attn_gate { 2 * qd } else { qd };
            let kv_layer = la.map_or(l, |la| (0..l).filter(|&i| !la.recurrent[i] && !la.ffn_only[i]).count());
            Some(Mixer::Attention(Attention {
                qkv: attn.packed(&[("q_proj", q_rows), ("k_proj", kvd), ("v_proj", kvd)], hidden)?,
                wo: attn.linear("o_proj", hidden, qd)?,
                qk_norm: match cfg.variant.qk_norm {
                    true => Some(pair("self_attn.q_norm.weight", "self_attn.k_norm.weight", hd)?),
                    false => None,
                },
                sinks: match vb.has("self_attn.sinks") {
                    true => Some(vb.vector("self_attn.sinks", cfg.heads)?),
                    false => None,
                },
                kv_layer,
            }))
        }
    };
    let post_norms = cfg.variant.post_norms;
    let both = mixer.is_some() && ffn.is_some();
    Ok(Layer {
        attn_norm: norm("input_layernorm.weight", hidden)?,
        mixer,
        ffn_norm: match (post_norms, both) {
            (_, false) => Vec::new(),
            (true, true) => norm("pre_feedforward_layernorm.weight", hidden)?,
            (false, true) => norm("post_attention_layernorm.weight", hidden)?,
        },
        ffn,
        post_norms: match post_norms {
            true => Some(pair("post_attention_layernorm.weight", "post_feedforward_layernorm.weight", hidden)?),
            false => None,
        },
    })
}
