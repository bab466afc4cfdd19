//! Building a [`LlamaModel`] from a file: a GGUF of a dense family (hyper-parameters from its
//! metadata, tensors by llama.cpp's names, kept at the file's block type) or a Hugging Face
//! directory (BF16/F32 or ModelOpt NVFP4); Q/K/V and gate/up fused into one matrix each.

use std::path::Path;

use ggus::GGufMetaMapExt;

use super::*;
use crate::checkpoint::gguf::GgufFile;
use crate::model::common::RopeTable;
use crate::model::vb::{GgufTensors, Vb, GEMMA3_LAYER_NAMES, LLAMA_LAYER_NAMES};

/// `general.architecture = llama`: `llama.*` keys as llama.cpp reads them.
fn llama_gguf_config(ld: &crate::checkpoint::gguf::Gguf<'_>) -> Result<LlamaConfig, EngineError> {
    let arch = "llama";
    let get = |k: &str| {
        ld.meta().get_usize(&format!("{arch}.{k}")).map_err(|e| EngineError::model(format!("{arch}.{k}: {e:?}")))
    };
    let hidden = get("embedding_length")?;
    let heads = get("attention.head_count")?;
    let kv_heads = get("attention.head_count_kv").unwrap_or(heads);
    let head_dim = hidden.checked_div(heads).unwrap_or(0);
    if let Ok(rd) = get("rope.dimension_count") {
        if rd != head_dim {
            return Err(EngineError::model(format!("partial RoPE ({rd} of {head_dim} dims) is not supported")));
        }
    }
    if let Ok(s) = ld.meta().get_str(&format!("{arch}.rope.scaling.type")) {
        if s != "none" {
            return Err(EngineError::model(format!("RoPE scaling {s:?} is not supported")));
        }
    }
    let rope_freq_factors = match ld.has_tensor("rope_freqs.weight") {
        true => Some(ld.vector("rope_freqs.weight", head_dim / 2)?),
        false => None,
    };
    let vocab = ld.embedding_rows()?;
    let layers = get("block_count")?;
    let rope_base = ld.meta().get_f32(&format!("{arch}.rope.freq_base")).unwrap_or(10000.0);
    let mut variant = Variant::llama(layers, head_dim, rope_base);
    variant.rope_freq_factors = rope_freq_factors;
    Ok(LlamaConfig {
        layers,
        hidden,
        ffn: get("feed_forward_length")?,
        heads,
        kv_heads,
        head_dim,
        rope_base,
        rms_eps: ld.meta().get_f32(&format!("{arch}.attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
        vocab,
        context_length: get("context_length")?,
        variant,
    })
}

/// Decoder layer `vb` (`model.layers.{l}`), by HF module names (a GGUF file maps them to
/// llama.cpp's, [`GgufTensors`]). Q/K/V and gate/up are stacked, each a single matmul. With
/// `hf_rope` (an HF checkpoint, whose RoPE rotates halves of a head, `rotate_half`), Q and K
/// rows are permuted from those halves into adjacent pairs, the inverse of
/// llama.cpp's `convert_hf_to_gguf.py` `permute`.
fn load_layer(vb: &Vb<'_>, cfg: &LlamaConfig, hf_rope: bool) -> Result<Layer, EngineError> {
    let (hidden, hd, qd, kvd) = (cfg.hidden, cfg.head_dim, cfg.q_dim(), cfg.kv_heads * cfg.head_dim);
    let (attn, mlp) = (vb.pp("self_attn"), vb.pp("mlp"));
    let (mut q, mut k) = (attn.linear("q_proj", qd, hidden)?, attn.linear("k_proj", kvd, hidden)?);
    if hf_rope {
        let permuted = |w: Weight, n_heads: usize| {
            let half = hd / 2;
            let perm: Vec<usize> = (0..n_heads * hd)
                .map(|r| {
                    let (h, i) = (r / hd, r % hd);
                    h * hd + if i % 2 == 0 { i / 2 } else { half + i / 2 }
                })
                .collect();
            w.permute_rows(&perm).ok_or_else(|| EngineError::model("cannot permute a GGUF-repacked weight"))
        };
        q.weight = permuted(q.weight, cfg.heads)?;
        k.weight = permuted(k.weight, cfg.kv_heads)?;
    }
    let pair = |a: &str, b: &str, len: usize| -> Result<(Vec<f32>, Vec<f32>), EngineError> {
        Ok((vb.vector(a, len)?, vb.vector(b, len)?))
    };
    let post_norms = cfg.variant.post_norms;
    Ok(Layer {
        attn_norm: vb.vector("input_layernorm.weight", hidden)?,
        qkv: Linear::stack(vec![q, k, attn.linear("v_proj", kvd, hidden)?]),
        wo: attn.linear("o_proj", hidden, qd)?,
        ffn_norm: match post_norms {
            true => vb.vector("pre_feedforward_layernorm.weight", hidden)?,
            false => vb.vector("post_attention_layernorm.weight", hidden)?,
        },
        gate_up: Linear::stack(vec![
            mlp.linear("gate_proj", cfg.ffn, hidden)?,
            mlp.linear("up_proj", cfg.ffn, hidden)?,
        ]),
        down: mlp.linear("down_proj", hidden, cfg.ffn)?,
        qk_norm: match cfg.variant.qk_norm {
            true => Some(pair("self_attn.q_norm.weight", "self_attn.k_norm.weight", hd)?),
            false => None,
        },
        post_norms: match post_norms {
            true => Some(pair("post_attention_layernorm.weight", "post_feedforward_layernorm.weight", hidden)?),
            false => None,
        },
    })
}

impl LlamaModel {
    /// Loads a GGUF file of a dense family keyed by `general.architecture`: `llama`, or
    /// `gemma3` ([`crate::model::gemma3`]); `threads` is the size of the compute pool. The families
    /// share the tensor names and this loader; each reads its own hyper-parameters.
    ///
    /// # Errors
    /// [`EngineError::Model`] for an unreadable file, another architecture, a missing tensor,
    /// an unsupported tensor type or inconsistent shapes.
    pub fn load(path: &Path, threads: usize) -> Result<Self, EngineError> {
        // Mapped only while the weights are copied into our own layout.
        let file = GgufFile::open(path)?;
        let ld = file.view()?;
        let arch = ld
            .meta()
            .general_architecture()
            .map_err(|e| EngineError::model(format!("general.architecture: {e:?}")))?
            .to_owned();
        let cfg = match arch.as_str() {
            "llama" => llama_gguf_config(&ld)?,
            "gemma3" => crate::model::gemma3::config(&ld)?,
            other => {
                return Err(EngineError::model(format!(
                    "{}: architecture {other:?} is not supported (GGUF: llama, gemma3)",
                    path.display()
                )))
            }
        };
        cfg.check()?;
        let (hidden, vocab) = (cfg.hidden, cfg.vocab);
        let names = match arch.as_str() {
            "gemma3" => GEMMA3_LAYER_NAMES,
            _ => LLAMA_LAYER_NAMES,
        };
        let src = GgufTensors { ld: &ld, layer_names: names, threads };
        let root = Vb::new(&src);
        let embed = root.matrix("model.embed_tokens", vocab, hidden)?;
        let output = match root.has("lm_head.weight") {
            true => Some(root.matrix("lm_head", vocab, hidden)?),
            false => None,
        };
        let vb = root.pp("model.layers");
        let layers = (0..cfg.layers).map(|l| load_layer(&vb.pp(l), &cfg, false)).collect::<Result<Vec<_>, _>>()?;
        let output_norm = root.vector("model.norm.weight", hidden)?;
        let name = ld.meta().general_name().unwrap_or("unnamed").to_owned();
        let mut m = Self::assemble(cfg, arch, name, embed, output, output_norm, layers, threads)?;
        m.info.file_weight_bytes = Some(ld.read_bytes());
        Ok(m)
    }

    /// Loads a Hugging Face Llama checkpoint directory (`LlamaForCausalLM` `config.json`,
    /// safetensors weights, optionally ModelOpt NVFP4, e.g. from `sparrow quantize`).
    ///
    /// HF stores Q and K for `rotate_half` RoPE (pairs `(i, i + d/2)` of a head); their rows are
    /// permuted here into the adjacent-pair layout the GGUF path uses, the inverse of
    /// llama.cpp's `convert_hf_to_gguf.py` `permute`.
    ///
    /// # Errors
    /// As [`Checkpoint::open`](crate::checkpoint::hf::Checkpoint::open), plus another architecture, RoPE
    /// scaling, or tensors of the wrong shape.
    pub fn load_hf(dir: &Path, threads: usize) -> Result<Self, EngineError> {
        let ck = crate::checkpoint::hf::Checkpoint::open(dir)?;
        let v = &ck.config;
        let mt = v.get("model_type").and_then(|x| x.as_str()).unwrap_or("");
        if mt != "llama" {
            return Err(EngineError::model(format!("config.json model_type {mt:?}: the Llama loader reads llama")));
        }
        if v.get("rope_scaling").is_some_and(|x| !x.is_null()) {
            return Err(EngineError::model("config.json: rope_scaling is not supported"));
        }
        let u = |k: &str| {
            v.get(k)
                .and_then(|x| x.as_u64())
                .map(|x| x as usize)
                .ok_or_else(|| EngineError::model(format!("config.json: {k} missing")))
        };
        let (hidden, heads) = (u("hidden_size")?, u("num_attention_heads")?);
        let kv_heads = u("num_key_value_heads").unwrap_or(heads);
        let head_dim =
            v.get("head_dim").and_then(|x| x.as_u64()).map_or(hidden.checked_div(heads).unwrap_or(0), |x| x as usize);
        let (layers, rope_base) =
            (u("num_hidden_layers")?, v.get("rope_theta").and_then(|x| x.as_f64()).unwrap_or(10000.0) as f32);
        let cfg = LlamaConfig {
            layers,
            hidden,
            ffn: u("intermediate_size")?,
            heads,
            kv_heads,
            head_dim,
            rope_base,
            rms_eps: v.get("rms_norm_eps").and_then(|x| x.as_f64()).unwrap_or(1e-5) as f32,
            vocab: u("vocab_size")?,
            context_length: u("max_position_embeddings")?,
            variant: Variant::llama(layers, head_dim, rope_base),
        };
        cfg.check()?;
        let (es, ed) = ck.f32("model.embed_tokens.weight")?;
        if es != [cfg.vocab, hidden] {
            return Err(EngineError::model(format!(
                "model.embed_tokens.weight: shape {es:?}, want [{}, {hidden}]",
                cfg.vocab
            )));
        }
        let embed = Weight::Dense { rows: cfg.vocab, cols: hidden, data: ed };
        let tied = v.get("tie_word_embeddings").and_then(|x| x.as_bool()).unwrap_or(false) || !ck.has("lm_head.weight");
        let output = if tied { None } else { Some(ck.linear("lm_head", cfg.vocab, hidden)?) };
        let vb = Vb::new(&ck).pp("model.layers");
        let layers = (0..cfg.layers).map(|l| load_layer(&vb.pp(l), &cfg, true)).collect::<Result<Vec<_>, _>>()?;
        let output_norm = ck.vector("model.norm.weight", hidden)?;
        let name = dir.file_name().map_or("llama".into(), |n| n.to_string_lossy().into_owned());
        Self::assemble(cfg, "llama".into(), name, embed, output, output_norm, layers, threads)
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
        let ff = cfg.variant.rope_freq_factors.as_deref();
        let rope = RopeTable::llama_cpp_scaled(cfg.rope_base as f64, cfg.head_dim, cfg.context_length, ff);
        let local = cfg.variant.windows.iter().any(Option::is_some) && cfg.variant.rope_local_base != cfg.rope_base;
        let rope_local = local.then(|| {
            RopeTable::llama_cpp_scaled(cfg.variant.rope_local_base as f64, cfg.head_dim, cfg.context_length, ff)
        });
        let mut wbytes = embed.bytes() + output.as_ref().map_or(0, Weight::bytes) + 4 * output_norm.len();
        let vec_bytes = |v: &Option<(Vec<f32>, Vec<f32>)>| v.as_ref().map_or(0, |(a, b)| 4 * (a.len() + b.len()));
        for l in &layers {
            wbytes += [&l.qkv, &l.wo, &l.gate_up, &l.down].iter().map(|x| x.weight.bytes()).sum::<usize>();
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
            observer: None,
            profile: false,
            parts: PartTimes::default(),
            kv_dtype: KvDtype::F16,
        })
    }
}
