//! Snapshots of the exact bytes the server renders: every JSON body and SSE stream, with its
//! status and content type, pinned in `fixtures/snapshots/<name>.txt`.
//!
//! They pin what parsing tests cannot see: key order, `null` against absent fields, number
//! formatting, frame boundaries. Volatile values are scrubbed from the text before comparing
//! (response ids keep their prefix and suffix, `created` and local paths become placeholders);
//! everything else is compared byte for byte. `UPDATE_SNAPSHOTS=1 cargo test -p sparrow-server
//! --test it snapshots` rewrites the files from what the server sends.
//!
//! Each server answers one request at a time so that outputs, batches and cache hits are
//! deterministic. Streams of `n > 1` choices interleave their frames in whatever order the
//! choices' tokens arrive; their frames are regrouped by choice (stably) before comparing.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{client, Opts, TestServer};
use serde_json::{json, Value};
use sparrow_engine::batch::ForwardBatch;
use sparrow_engine::kv::KvStore;
use sparrow_engine::model::{AttentionNeeds, Model, ModelInfo};
use sparrow_engine::EngineError;

const PARIS: &str = "The capital of France is";

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/snapshots")
}

/// One response as the snapshot file holds it.
struct Answer {
    status: u16,
    content_type: String,
    cache_control: Option<String>,
    body: String,
}

impl Answer {
    fn render(&self) -> String {
        let mut s = format!("status: {}\ncontent-type: {}\n", self.status, self.content_type);
        if let Some(c) = &self.cache_control {
            s += &format!("cache-control: {c}\n");
        }
        s + "\n" + &scrub(&self.body)
    }
}

async fn send(s: &TestServer, method: &str, path: &str, body: Option<&str>) -> Answer {
    let c = client();
    let req = match method {
        "GET" => c.get(s.url(path)),
        _ => c.post(s.url(path)),
    };
    let req = match body {
        Some(b) => req.header("content-type", "application/json").body(b.to_owned()),
        None => req,
    };
    let r = req.send().await.expect("request");
    let header = |k: &str| r.headers().get(k).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let (content_type, cache_control) = (header("content-type").unwrap_or_default(), header("cache-control"));
    let status = r.status().as_u16();
    let body = r.text().await.expect("body");
    Answer { status, content_type, cache_control, body }
}

async fn get(s: &TestServer, path: &str) -> Answer {
    send(s, "GET", path, None).await
}

async fn post(s: &TestServer, path: &str, body: Value) -> Answer {
    send(s, "POST", path, Some(&body.to_string())).await
}

/// Replaces the value after each `"key":` in compact JSON text, leaving every other byte alone.
fn scrub_key(text: &str, key: &str, with: impl Fn(&str) -> String) -> String {
    let pat = format!("\"{key}\":");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(&pat) {
        let (head, tail) = rest.split_at(at + pat.len());
        out += head;
        let end = if let Some(inner) = tail.strip_prefix('"') {
            inner.find('"').map_or(tail.len(), |e| e + 2)
        } else {
            tail.find(|c: char| !c.is_ascii_digit()).unwrap_or(tail.len())
        };
        out += &with(&tail[..end]);
        rest = &tail[end..];
    }
    out + rest
}

/// Runs of 16 or more hex digits (our ids are counters printed as 16 or 32 hex digits).
fn scrub_hex(v: &str) -> String {
    let mut out = String::new();
    let mut run = String::new();
    for c in v.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_hexdigit() {
            run.push(c);
            continue;
        }
        out += if run.len() >= 16 { "<hex>" } else { &run };
        run.clear();
        out.push(c);
    }
    out.pop();
    out
}

fn scrub(text: &str) -> String {
    let t = scrub_key(text, "id", scrub_hex);
    let t = scrub_key(&t, "created", |_| "<unix-seconds>".into());
    let t = scrub_key(&t, "model_path", |_| "\"<path>\"".into());
    scrub_key(&t, "tokenizer_path", |_| "\"<path>\"".into())
}

/// An SSE body with its frames stably regrouped by choice index (`choices[0].index`, or the
/// top-level `index` of `/generate`); frames without one (usage, errors, `[DONE]`) go last.
fn by_choice(a: Answer) -> Answer {
    let mut frames: Vec<(u64, &str)> = a
        .body
        .split_inclusive("\n\n")
        .map(|f| {
            let v: Value =
                f.strip_prefix("data: ").and_then(|d| serde_json::from_str(d.trim_end()).ok()).unwrap_or_default();
            let i = v["choices"][0]["index"].as_u64().or_else(|| v["index"].as_u64()).unwrap_or(u64::MAX);
            (i, f)
        })
        .collect();
    frames.sort_by_key(|(i, _)| *i);
    let body = frames.iter().map(|(_, f)| *f).collect();
    Answer { body, ..a }
}

/// Compares (or, with `UPDATE_SNAPSHOTS`, writes) snapshots; reports every mismatch at once.
#[derive(Default)]
struct Snapshots {
    failed: Vec<String>,
}

impl Snapshots {
    fn check(&mut self, name: &str, a: &Answer) {
        let got = a.render();
        let path = fixtures().join(format!("{name}.txt"));
        if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
            std::fs::create_dir_all(fixtures()).expect("creating the snapshot directory");
            std::fs::write(&path, &got).expect("writing a snapshot");
            return;
        }
        match std::fs::read_to_string(&path) {
            Ok(want) if want == got => {}
            Ok(want) => self.failed.push(format!("{name}: differs\n--- want\n{want}\n--- got\n{got}")),
            Err(e) => self.failed.push(format!("{name}: cannot read {}: {e}\n--- got\n{got}", path.display())),
        }
    }

    fn finish(self) {
        assert!(self.failed.is_empty(), "{} snapshot(s) differ:\n{}", self.failed.len(), self.failed.join("\n\n"));
    }
}

fn chat_body(extra: Value) -> Value {
    let mut b =
        json!({"messages": [{"role": "user", "content": "Name three colors."}], "max_tokens": 6, "temperature": 0});
    if let (Some(b), Some(e)) = (b.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    b
}

fn cmpl_body(extra: Value) -> Value {
    let mut b = json!({"prompt": PARIS, "max_tokens": 5, "temperature": 0, "ignore_eos": true});
    if let (Some(b), Some(e)) = (b.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    b
}

fn gen_body(sampling: Value) -> Value {
    let mut sp = json!({"max_new_tokens": 5, "temperature": 0, "ignore_eos": true});
    if let (Some(b), Some(e)) = (sp.as_object_mut(), sampling.as_object()) {
        b.extend(e.clone());
    }
    json!({"text": PARIS, "sampling_params": sp})
}

/// Info routes, `/v1/completions`, `/v1/chat/completions`, `/generate` and error bodies, on a
/// server without the radix cache (no request's cache hits depend on an earlier one).
#[tokio::test]
async fn snapshots_of_every_route() {
    // A few flags of each JSON type, as the binary's own list has them.
    let server_info = json!({"version": "0.1.0", "page_size": 1, "kv_cache_gb": 1.0, "disable_radix_cache": true, "model_runner": null});
    let s = TestServer::start(Opts { disable_radix_cache: true, server_info, ..Opts::default() });
    let mut snap = Snapshots::default();
    // Before any request, so that the engine counters are all at their start values.
    snap.check("get_server_info", &get(&s, "/get_server_info").await);
    snap.check("v1_models", &get(&s, "/v1/models").await);
    snap.check("get_model_info", &get(&s, "/get_model_info").await);
    // sglang-router asks `/model_info` first: the same body.
    assert_eq!(get(&s, "/model_info").await.render(), get(&s, "/get_model_info").await.render());
    snap.check("get_load", &get(&s, "/get_load").await);
    snap.check("health", &get(&s, "/health").await);
    snap.check("health_generate", &get(&s, "/health_generate").await);
    snap.check("flush_cache", &post(&s, "/flush_cache", json!({})).await);
    let tok = post(&s, "/tokenize", json!({"text": PARIS})).await;
    snap.check("tokenize", &tok);
    let ids: Value = serde_json::from_str(&tok.body).expect("tokenize JSON");
    snap.check("detokenize", &post(&s, "/detokenize", json!({"tokens": ids["tokens"]})).await);

    for (name, extra) in [
        ("cmpl", json!({})),
        ("cmpl_stop_string", json!({"max_tokens": 20, "stop": ["s.\n"]})),
        ("cmpl_stop_token", json!({"max_tokens": 20, "stop_token_ids": [30]})),
        ("cmpl_echo", json!({"max_tokens": 3, "echo": true})),
        ("cmpl_echo_zero_tokens", json!({"max_tokens": 0, "echo": true})),
        ("cmpl_n2", json!({"max_tokens": 3, "n": 2})),
        ("cmpl_token_ids", json!({"prompt": ids["tokens"], "max_tokens": 2})),
        ("cmpl_stream", json!({"stream": true})),
        ("cmpl_stream_usage", json!({"stream": true, "stream_options": {"include_usage": true}})),
        (
            "cmpl_stream_continuous_usage",
            json!({"stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": true}}),
        ),
        ("cmpl_stream_stop_string", json!({"stream": true, "max_tokens": 20, "stop": ["s.\n"]})),
        ("cmpl_stream_stop_token", json!({"stream": true, "max_tokens": 20, "stop_token_ids": [30]})),
        ("cmpl_stream_echo", json!({"stream": true, "max_tokens": 3, "echo": true})),
        ("cmpl_stream_echo_zero_tokens", json!({"stream": true, "max_tokens": 0, "echo": true})),
    ] {
        snap.check(name, &post(&s, "/v1/completions", cmpl_body(extra)).await);
    }
    let n2 = json!({"stream": true, "max_tokens": 3, "n": 2, "stream_options": {"include_usage": true}});
    snap.check("cmpl_stream_n2_usage", &by_choice(post(&s, "/v1/completions", cmpl_body(n2.clone())).await));

    for (name, extra) in [
        ("chat", json!({})),
        ("chat_n2", json!({"max_tokens": 3, "n": 2})),
        ("chat_stop_string", json!({"stop": [" "]})),
        ("chat_stream", json!({"stream": true})),
        ("chat_stream_usage", json!({"stream": true, "stream_options": {"include_usage": true}})),
        (
            "chat_stream_continuous_usage",
            json!({"stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": true}}),
        ),
        ("chat_stream_stop_string", json!({"stream": true, "stop": [" "]})),
    ] {
        snap.check(name, &post(&s, "/v1/chat/completions", chat_body(extra)).await);
    }
    snap.check("chat_stream_n2_usage", &by_choice(post(&s, "/v1/chat/completions", chat_body(n2)).await));

    for (name, sampling) in [
        ("generate", json!({})),
        ("generate_n2", json!({"max_new_tokens": 3, "n": 2})),
        ("generate_stop_string", json!({"max_new_tokens": 20, "stop": ["s.\n"]})),
        ("generate_stop_token", json!({"max_new_tokens": 20, "stop_token_ids": [30]})),
    ] {
        snap.check(name, &post(&s, "/generate", gen_body(sampling)).await);
    }
    for (name, sampling) in [
        ("generate_stream", json!({})),
        ("generate_stream_stop_string", json!({"max_new_tokens": 20, "stop": ["s.\n"]})),
        ("generate_stream_n2", json!({"max_new_tokens": 3, "n": 2})),
    ] {
        let mut b = gen_body(sampling);
        b["stream"] = json!(true);
        snap.check(name, &by_choice(post(&s, "/generate", b).await));
    }
    let b = json!({"input_ids": ids["tokens"], "sampling_params": {"max_new_tokens": 2, "temperature": 0}});
    snap.check("generate_input_ids", &post(&s, "/generate", b).await);

    error_snapshots(&s, &mut snap).await;
    snap.finish();
}

async fn error_snapshots(s: &TestServer, snap: &mut Snapshots) {
    snap.check("err_400_param", &post(s, "/v1/completions", cmpl_body(json!({"top_p": 1.5}))).await);
    snap.check(
        "err_400_param_stream",
        &post(s, "/v1/completions", cmpl_body(json!({"top_p": 1.5, "stream": true}))).await,
    );
    snap.check("err_400_stream_options", &post(s, "/v1/completions", cmpl_body(json!({"stream_options": {}}))).await);
    snap.check("err_400_context", &post(s, "/v1/completions", json!({"prompt": vec![100u32; 9000]})).await);
    snap.check("err_400_chat_messages", &post(s, "/v1/chat/completions", json!({"messages": []})).await);
    snap.check("err_400_generate_param", &post(s, "/generate", gen_body(json!({"foo": 1}))).await);
    snap.check("err_400_generate_both", &post(s, "/generate", json!({"text": "hi", "input_ids": [1]})).await);
    snap.check("err_400_malformed", &send(s, "POST", "/v1/chat/completions", Some("{\"messages\": [")).await);
    snap.check("err_400_not_object", &send(s, "POST", "/v1/completions", Some("[1]")).await);
    snap.check("err_400_detokenize", &post(s, "/detokenize", json!({"tokens": [999999]})).await);
    snap.check("err_404", &get(s, "/no/such/route").await);
    snap.check("err_405", &get(s, "/v1/completions").await);
    snap.check("err_413", &too_large(s).await);
}

/// A body one byte over the limit, sent raw so that the server has read all of it when it
/// answers (no half-written body, no broken pipe).
async fn too_large(s: &TestServer) -> Answer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = s.base.trim_start_matches("http://").to_owned();
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    let len = (16usize << 20) + 1;
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.expect("write");
    tcp.write_all(&vec![b' '; len]).await.expect("write body");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), tcp.read_to_end(&mut raw)).await.expect("an answer").expect("read");
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a head and a body");
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let header = |k: &str| {
        head.lines()
            .find_map(|l| l.split_once(": ").filter(|(n, _)| n.eq_ignore_ascii_case(k)).map(|(_, v)| v.to_owned()))
    };
    Answer {
        status,
        content_type: header("content-type").unwrap_or_default(),
        cache_control: None,
        body: body.to_owned(),
    }
}

/// SmolLM2 with a fuse: armed with `k`, its `k`-th forward from then on panics, which the
/// engine turns into an error finish for every live request.
struct Fused {
    inner: Box<dyn Model>,
    fuse: Arc<AtomicUsize>,
}

impl Model for Fused {
    fn info(&self) -> &ModelInfo {
        self.inner.info()
    }

    fn attention_needs(&self) -> AttentionNeeds {
        self.inner.attention_needs()
    }

    fn forward(&mut self, batch: &ForwardBatch, kv: &mut KvStore) -> Result<Vec<f32>, EngineError> {
        match self.fuse.load(Ordering::SeqCst) {
            0 => {}
            1 => {
                self.fuse.store(0, Ordering::SeqCst);
                panic!("snapshot test: the fuse blew");
            }
            k => self.fuse.store(k - 1, Ordering::SeqCst),
        }
        self.inner.forward(batch, kv)
    }
}

/// Engine failures: a 500 before the body, a 503 from `/health_generate`, and in-band error
/// frames once a stream has started (the prompt is one prefill forward, then one forward a token).
#[tokio::test]
async fn snapshots_of_engine_failures() {
    let fuse = Arc::new(AtomicUsize::new(0));
    let f = fuse.clone();
    let s = TestServer::start_wrapped(Opts { disable_radix_cache: true, ..Opts::default() }, move |inner| {
        Box::new(Fused { inner, fuse: f })
    });
    let mut snap = Snapshots::default();
    let arm = |k| fuse.store(k, Ordering::SeqCst);
    arm(1);
    snap.check("fail_health_generate", &get(&s, "/health_generate").await);
    arm(2);
    snap.check("fail_cmpl", &post(&s, "/v1/completions", cmpl_body(json!({}))).await);
    arm(3);
    let usage = json!({"stream": true, "stream_options": {"include_usage": true}});
    snap.check("fail_cmpl_stream_usage", &post(&s, "/v1/completions", cmpl_body(usage.clone())).await);
    arm(3);
    snap.check("fail_chat_stream_usage", &post(&s, "/v1/chat/completions", chat_body(usage)).await);
    arm(2);
    snap.check("fail_generate", &post(&s, "/generate", gen_body(json!({}))).await);
    arm(3);
    let mut b = gen_body(json!({}));
    b["stream"] = json!(true);
    snap.check("fail_generate_stream", &post(&s, "/generate", b).await);
    snap.finish();
}

/// Usage with prompt tokens served from the radix cache (`prompt_tokens_details`,
/// `meta_info.cached_tokens`): each request repeats one that ran to its length limit.
#[tokio::test]
async fn snapshots_of_cache_hits() {
    let s = TestServer::start(Opts::default());
    let mut snap = Snapshots::default();
    let first = post(&s, "/v1/completions", cmpl_body(json!({}))).await;
    snap.check("cached_cmpl_first", &first);
    snap.check("cached_cmpl", &post(&s, "/v1/completions", cmpl_body(json!({}))).await);
    let usage = json!({"stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": true}});
    snap.check("cached_cmpl_stream_usage", &post(&s, "/v1/completions", cmpl_body(usage)).await);
    snap.check("cached_generate", &post(&s, "/generate", gen_body(json!({}))).await);
    let mut b = gen_body(json!({}));
    b["stream"] = json!(true);
    snap.check("cached_generate_stream", &post(&s, "/generate", b).await);
    post(&s, "/v1/chat/completions", chat_body(json!({}))).await;
    snap.check("cached_chat", &post(&s, "/v1/chat/completions", chat_body(json!({}))).await);
    snap.finish();
}
