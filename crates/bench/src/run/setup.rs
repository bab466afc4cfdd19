//! Set-up before the clock starts, against the server: the HTTP client and headers, the
//! tokenizer, the readiness wait, the warmup, and the control POSTs (`/flush_cache`,
//! profiling). Kept apart from the timed run so nothing here can slow or fail a request once
//! the run has begun: every call has its own short timeout, and control calls only warn.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;
use sparrow_tokenizer::Tokenizer;
use tokio_util::sync::CancellationToken;

use super::request::new_record;
use super::BenchError;
use crate::args::BenchConfig;
use crate::client::{self, ClientCtx, PromptInput, RequestOptions};
use crate::dataset::DatasetRow;

/// How long a pooled connection may sit idle and still be reused. Servers close idle
/// keep-alive connections on their own clock (llama-server after 5 s); a request written into a
/// connection the server is closing gets no answer (`connection closed before message
/// completed`). Well under any server's bound, and a reconnect costs far less than a request.
pub const POOL_IDLE: Duration = Duration::from_millis(500);

/// The run's HTTP clients: the pooled one every request uses, and one that opens a fresh
/// connection for every request (the retry of a request a pooled connection lost; see
/// [`crate::client::send`]).
pub(super) fn http_clients() -> Result<(reqwest::Client, reqwest::Client), BenchError> {
    let build = |pooled: bool| {
        reqwest::Client::builder()
            .pool_max_idle_per_host(if pooled { usize::MAX } else { 0 })
            .pool_idle_timeout(POOL_IDLE)
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(10))
            .no_proxy()
            .build()
            .map_err(|e| BenchError::Setup(format!("cannot build HTTP client: {e}")))
    };
    Ok((build(true)?, build(false)?))
}

/// GET `url` as JSON with a short timeout; `None` on any failure (calls made outside the timed
/// run must never abort it).
pub(super) async fn get_json(
    http: &reqwest::Client,
    url: &str,
    headers: &reqwest::header::HeaderMap,
) -> Result<Value, String> {
    let resp = http
        .get(url)
        .headers(headers.clone())
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("HTTP {}", resp.status()));
    }
    resp.json::<Value>().await.map_err(|e| e.to_string())
}

pub(super) fn header_map(cfg: &BenchConfig) -> Result<reqwest::header::HeaderMap, BenchError> {
    use reqwest::header::{HeaderName, HeaderValue};
    let mut h = reqwest::header::HeaderMap::new();
    if let Ok(key) = std::env::var("OPENAI_API_KEY") {
        if let Ok(v) = HeaderValue::from_str(&format!("Bearer {key}")) {
            h.insert(reqwest::header::AUTHORIZATION, v);
        }
    }
    for (k, v) in &cfg.headers {
        let name = HeaderName::from_bytes(k.as_bytes()).map_err(|e| BenchError::Setup(format!("--header {k}: {e}")))?;
        let value = HeaderValue::from_str(v).map_err(|e| BenchError::Setup(format!("--header {k}: {e}")))?;
        h.insert(name, value);
    }
    Ok(h)
}

/// Picks the tokenizer: `--tokenizer`, else `--model` when it is a local path, else the path
/// the server reports in `/get_model_info` when this machine can read it.
pub(super) async fn resolve_tokenizer(
    cfg: &BenchConfig,
    http: &reqwest::Client,
    headers: &reqwest::header::HeaderMap,
) -> Result<Tokenizer, BenchError> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(t) = &cfg.args.tokenizer {
        candidates.push(t.clone());
    } else {
        if let Some(m) = cfg.args.model.as_deref().map(PathBuf::from).filter(|p| p.exists()) {
            candidates.push(m);
        }
        if let Ok(info) = get_json(http, &format!("{}/get_model_info", cfg.base_url), headers).await {
            for key in ["tokenizer_path", "model_path"] {
                if let Some(p) = info.get(key).and_then(Value::as_str).map(PathBuf::from).filter(|p| p.exists()) {
                    candidates.push(p);
                }
            }
        }
    }
    let Some(path) = candidates.first() else {
        return Err(BenchError::Setup(
            "no tokenizer: pass --tokenizer (a tokenizer.json, a directory holding one, or a GGUF file)".into(),
        ));
    };
    Tokenizer::load(path).map_err(|e| BenchError::Setup(format!("--tokenizer {}: {e}", path.display())))
}

/// Runs warmup requests (concurrently) with the first prompt, at most 32 output tokens.
pub(super) async fn warmup(
    ctx: &ClientCtx,
    body: Bytes,
    row: &DatasetRow,
    n: usize,
    stop: &CancellationToken,
) -> Result<(), BenchError> {
    if n == 0 {
        return Ok(());
    }
    crate::outln!("Starting warmup with {n} sequences...");
    let never = CancellationToken::new();
    let futs = (0..n).map(|i| {
        let body = body.clone();
        let never = never.clone();
        async move {
            let mut rec = new_record(i, row.prompt_len, row.output_len.min(32), 0.0);
            client::send(ctx, body, &mut rec, stop, &never, row.routing_key.as_deref()).await;
            rec
        }
    });
    let recs = futures_util::future::join_all(futs).await;
    if let Some(f) = recs.iter().find_map(|r| r.failure.clone()).filter(|_| recs.iter().all(|r| !r.success())) {
        return Err(BenchError::Warmup(f));
    }
    crate::outln!("Warmup completed with {n} sequences. Starting main benchmark run...");
    Ok(())
}

/// The body of the first (or only) round of `row`; `ids` with `--tokenize-prompt`.
pub(super) fn first_body(opts: &RequestOptions, row: &DatasetRow, ids: Option<&[u32]>, max_tokens: u64) -> Bytes {
    let input = match (ids, &row.messages) {
        (Some(ids), _) => PromptInput::Ids(ids),
        (None, Some(m)) => PromptInput::Messages(m),
        (None, None) => PromptInput::Text(&row.prompt),
    };
    Bytes::from(client::build_body(opts, input, max_tokens, &row.extra_body).to_string())
}

/// Waits until `GET {base}/v1/models` (Triton: `/v2/health/ready`) answers 200 (SGLang's
/// `wait_for_endpoint`), polling once a second.
pub(super) async fn wait_ready(
    http: &reqwest::Client,
    base: &str,
    api: crate::client::Api,
    headers: &reqwest::header::HeaderMap,
    limit: Duration,
) -> Result<(), BenchError> {
    // Triton (TensorRT-LLM) has no OpenAI routes; its readiness route is /v2/health/ready.
    let path = if api == crate::client::Api::Trt { "/v2/health/ready" } else { "/v1/models" };
    let url = format!("{base}{path}");
    let start = Instant::now();
    crate::outln!("Waiting up to {}s for {url} to become ready...", limit.as_secs());
    loop {
        let ok = http
            .get(&url)
            .headers(headers.clone())
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .is_ok_and(|r| r.status() == reqwest::StatusCode::OK);
        if ok {
            crate::outln!("Server ready in {:.1}s.", start.elapsed().as_secs_f64());
            return Ok(());
        }
        if start.elapsed() >= limit {
            return Err(BenchError::Setup(format!(
                "server at {url} is not ready after {}s (--ready-check-timeout-sec)",
                limit.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_secs(1).min(limit.saturating_sub(start.elapsed()))).await;
    }
}

/// POSTs a control endpoint (`/flush_cache`, `/start_profile`, ...); a failure is a warning,
/// never the end of the run.
pub(super) async fn post_control(
    http: &reqwest::Client,
    url: &str,
    headers: &reqwest::header::HeaderMap,
    timeout: Duration,
) -> bool {
    match http.post(url).headers(headers.clone()).timeout(timeout).send().await {
        Ok(r) if r.status().is_success() => true,
        Ok(r) => {
            crate::errln!("warning: POST {url}: HTTP {}", r.status());
            false
        }
        Err(e) => {
            crate::errln!("warning: POST {url} failed: {e}");
            false
        }
    }
}
