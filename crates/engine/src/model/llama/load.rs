//! Building a [`LlamaModel`] from a file: a GGUF of a dense family (hyper-parameters from its
//! metadata, tensors by llama.cpp's names, kept at the file's block type) or a Hugging Face
//! directory (BF16/F32 or ModelOpt NVFP4); Q/K/V and gate/up fused into one matrix each.

use std::path::Path;

use ggus::GGufMetaMapExt;

use super::*;
use crate::checkpoint::gguf::GgufFile;
use crate::model::common::RopeTable;

/// The HF module names (the calibration observer's keys) of each fused projection's parts, in
/// stack order.
const QKV: [&str; 3] = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"];
const O: [&str; 1] = ["self_attn.o_proj"];
const GATE_UP: [&str; 2] = ["mlp.gate_proj", "mlp.up_proj"];
const DOWN: [&str; 1] = ["mlp.down_proj"];

/// `model.layers.{l}.{part}` for each part.
fn hf_modules(l: usize, parts: &[&str]) -> Vec<String> {
    parts.iter().map(|n| format!("model.layers.{l}.{n}")).collect()
}

/// `general.architecture = llama`: `llama.*` keys as llama.cpp reads them.
fn llama_gguf_config(ld: &crate::checkpoint::gguf::Gguf<'_>) -> Result<LlamaConfig, EngineError> {
    let arch = "llama";
    let get = |k: &str| ld.meta().get_usize(&format!("{arch}.{k}")).map_err(|e| EngineError::model(format!("{arch}.{k}: {e:?}")));
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
        let arch = ld.meta().general_architecture().map_err(|e| EngineError::model(format!("general.architecture: {e:?}")))?.to_owned();
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
        let (hidden, qd, kvd) = (cfg.hidden, cfg.q_dim(), cfg.kv_heads * cfg.head_dim);
        let vocab = cfg.vocab;
        let mat = |n: &str, rows: usize, cols: usize| ld.matrix_threads(n, rows, cols, threads);
        let embed = mat("token_embd.weight", vocab, hidden)?;
        let output = match ld.has_tensor("output.weight") {
            true => Some(mat("output.weight", vocab, hidden)?),
            false => None,
        };
        let mut layers = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let p = |n: &str| format!("blk.{l}.{n}.weight");
            let pair = |a: &str, b: &str, len: usize| -> Result<(Vec<f32>, Vec<f32>), EngineError> {
                Ok((ld.vector(&p(a), len)?, ld.vector(&p(b), len)?))
            };
            layers.push(Layer {
                attn_norm: ld.vector(&p("attn_norm"), hidden)?,
                qkv: Linear::new(
                    Weight::stack(vec![mat(&p("attn_q"), qd, hidden)?, mat(&p("attn_k"), kvd, hidden)?, mat(&p("attn_v"), kvd, hidden)?]),
                    hf_modules(l, &QKV),
                ),
                wo: Linear::new(mat(&p("attn_output"), hidden, qd)?, hf_modules(l, &O)),
                ffn_norm: ld.vector(&p("ffn_norm"), hidden)?,
                gate_up: Linear::new(
                    Weight::stack(vec![mat(&p("ffn_gate"), cfg.ffn, hidden)?, mat(&p("ffn_up"), cfg.ffn, hidden)?]),
                    hf_modules(l, &GATE_UP),
                ),
                down: Linear::new(mat(&p("ffn_down"), hidden, cfg.ffn)?, hf_modules(l, &DOWN)),
                qk_norm: match cfg.variant.qk_norm {
                    true => Some(pair("attn_q_norm", "attn_k_norm", cfg.head_dim)?),
                    false => None,
                },
                post_norms: match cfg.variant.post_norms {
                    true => Some(pair("post_attention_norm", "post_ffw_norm", hidden)?),
                    false => None,
                },
            });
        }
        let output_norm = ld.vector("output_norm.weight", hidden)?;
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
        let kvd = kv_heads * head_dim;
        let rope_perm = |n_heads: usize| -> Vec<usize> {
            let half = head_dim / 2;
            (0..n_heads * head_dim)
                .map(|r| {
                    let (h, i) = (r / head_dim, r % head_dim);
                    h * head_dim + if i % 2 == 0 { i / 2 } else { half + i / 2 }
                })
                .collect()
        };
        let permuted = |w: Weight, n_heads: usize| {
            w.permute_rows(&rope_perm(n_heads)).ok_or_else(|| EngineError::model("cannot permute a GGUF-repacked weight"))
        };
        let (es, ed) = ck.f32("model.embed_tokens.weight")?;
        if es != [cfg.vocab, hidden] {
            return Err(EngineError::model(format!("model.embed_tokens.weight: shape {es:?}, want [{}, {hidden}]", cfg.vocab)));
        }
        let embed = Weight::Dense { rows: cfg.vocab, cols: hidden, data: ed };
        let tied = v.get("tie_word_embeddings").and_then(|x| x.as_bool()).unwrap_or(false) || !ck.has("lm_head.weight");
        let output = if tied { None } else { Some(ck.linear("lm_head", cfg.vocab, hidden)?) };
        let mut layers = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let p = format!("model.layers.{l}");
            layers.push(Layer {
                attn_norm: ck.vector(&format!("{p}.input_layernorm.weight"), hidden)?,
                qkv: Linear::new(
                    Weight::stack(vec![
                        permuted(ck.linear(&format!("{p}.self_attn.q_proj"), hidden, hidden)?, heads)?,
                        permuted(ck.linear(&format!("{p}.self_attn.k_proj"), kvd, hidden)?, kv_heads)?,
                        ck.linear(&format!("{p}.self_attn.v_proj"), kvd, hidden)?,
                    ]),
                    hf_modules(l, &QKV),
                ),
                wo: Linear::new(ck.linear(&format!("{p}.self_attn.o_proj"), hidden, hidden)?, hf_modules(l, &O)),
                ffn_norm: ck.vector(&format!("{p}.post_attention_layernorm.weight"), hidden)?,
                gate_up: Linear::new(
                    Weight::stack(vec![
                        ck.linear(&format!("{p}.mlp.gate_proj"), cfg.ffn, hidden)?,
                        ck.linear(&format!("{p}.mlp.up_proj"), cfg.ffn, hidden)?,
                    ]),
                    hf_modules(l, &GATE_UP),
                ),
                down: Linear::new(ck.linear(&format!("{p}.mlp.down_proj"), hidden, cfg.ffn)?, hf_modules(l, &DOWN)),
                qk_norm: None,
                post_norms: None,
            });
        }
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
        let rope_local =
            local.then(|| RopeTable::llama_cpp_scaled(cfg.variant.rope_local_base as f64, cfg.head_dim, cfg.context_length, ff));
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
