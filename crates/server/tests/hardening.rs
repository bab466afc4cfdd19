//! The connection layer under hostile and slow clients (issue 18): half-sent headers, idle
//! keep-alive sockets, stalled bodies, more connections than `--max-connections`, long streams
//! that must not be cut, and raw malformed HTTP/1.x that must get a 4xx or a closed socket.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use sparrow_engine::batch::ForwardBatch;
use sparrow_engine::kv::KvStore;
use sparrow_engine::model::{AttentionNeeds, Model, ModelInfo};
use sparrow_engine::EngineError;
use sparrow_server::conn::ConnLimits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn limits(header: f64, keep_alive: f64, body: f64, max: usize) -> ConnLimits {
    let t = |s: f64| (s > 0.0).then(|| Duration::from_secs_f64(s));
    ConnLimits {
        header_read_timeout: t(header),
        keep_alive_timeout: t(keep_alive),
        body_read_timeout: t(body),
        max_connections: max,
    }
}

fn addr(s: &TestServer) -> String {
    s.url("").trim_start_matches("http://").to_owned()
}

/// Reads until the server closes (EOF or reset); returns what arrived and when it closed.
async fn read_to_close(sock: &mut TcpStream, limit: Duration) -> (Vec<u8>, Option<Instant>) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, sock.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (got, Some(Instant::now())),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (got, None),
        }
    }
}

/// One short greedy generation; panics unless it is a 200 with text.
async fn generate_ok(s: &TestServer) {
    let (st, v) = post(
        s,
        "/generate",
        json!({"text": "The capital of France is", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert!(v["text"].is_string(), "{v}");
}

/// 2,000 sockets that send half a request head and stop are all closed by the server within
/// the header-read timeout plus a second, while normal requests keep being answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_header_sockets_are_closed_within_the_header_timeout() {
    const N: usize = 2000;
    let fds = sparrow_server::conn::raise_fd_limit().unwrap_or(0);
    assert!(fds >= 2 * N as u64 + 512, "this test needs an open-file limit of {} (have {fds})", 2 * N + 512);
    let header = 2.0;
    let s = TestServer::start(Opts { limits: limits(header, 5.0, 60.0, N + 256), ..Opts::default() });
    generate_ok(&s).await;
    let a = addr(&s);
    let mut tasks = Vec::with_capacity(N);
    for i in 0..N {
        let mut sock = TcpStream::connect(&a).await.expect("connect");
        let half: &[u8] = if i % 2 == 0 { b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Le" } else { b"GET /heal" };
        sock.write_all(half).await.expect("half a header");
        let sent = Instant::now();
        tasks.push(tokio::spawn(async move {
            let (got, closed) = read_to_close(&mut sock, Duration::from_secs(30)).await;
            (sent, closed, got)
        }));
    }
    // Normal traffic on fresh connections while the half-headers hang.
    let t0 = Instant::now();
    let mut answered = 0;
    while t0.elapsed() < Duration::from_secs_f64(header + 1.5) {
        let r = client().get(s.url("/health")).send().await.expect("health while sockets hang");
        assert_eq!(r.status().as_u16(), 200);
        generate_ok(&s).await;
        answered += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answered >= 3, "only {answered} normal rounds answered");
    let mut worst = Duration::ZERO;
    for t in tasks {
        let (sent, closed, got) = t.await.expect("reader task");
        let closed = closed.expect("a half-header socket was still open after 30 s");
        worst = worst.max(closed - sent);
        // hyper closes a timed-out head without a response, or with a 408; never a 2xx.
        assert!(got.is_empty() || got.starts_with(b"HTTP/1.1 4"), "{:?}", String::from_utf8_lossy(&got));
    }
    assert!(
        worst <= Duration::from_secs_f64(header + 1.0),
        "slowest close {worst:?}, past the {header} s header timeout plus a second"
    );
    let m = client().get(s.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    let open = metric(&m, "sparrow:http_connections_open");
    assert!(open < 10.0, "{open} connections still counted open");
    assert_drained(&s).await;
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
}

/// Past `--max-connections` a new connection gets a 503 with OpenAI error JSON and
/// `Retry-After`; once the held connections close, requests are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_connections_a_503_then_recovery() {
    const MAX: usize = 8;
    let s = TestServer::start(Opts { limits: limits(30.0, 0.0, 60.0, MAX), ..Opts::default() });
    let a = addr(&s);
    // Fill every slot with a kept-alive connection that has been answered once.
    let mut held = Vec::new();
    for _ in 0..MAX {
        let mut sock = TcpStream::connect(&a).await.expect("connect");
        sock.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
        let mut buf = [0u8; 512];
        let n = sock.read(&mut buf).await.expect("read");
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&buf[..n]));
        held.push(sock);
    }
    let r = client().get(s.url("/v1/models")).send().await.expect("request past the cap");
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    let v: Value = r.json().await.expect("JSON error");
    assert_eq!(v["error"]["code"], 503, "{v}");
    assert_eq!(v["error"]["type"], "server_error", "{v}");
    assert!(v["error"]["message"].as_str().unwrap_or("").contains("--max-connections"), "{v}");
    // A POST with a body past the cap gets the same answer, not a reset.
    let (st, v) = post(&s, "/generate", json!({"text": "hi", "sampling_params": {"max_new_tokens": 1}})).await;
    assert_eq!(st, 503, "{v}");
    drop(held);
    let t0 = Instant::now();
    loop {
        let r = client().get(s.url("/health")).send().await.expect("request after the held ones left");
        if r.status().as_u16() == 200 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(2), "still {} 2 s after the held connections closed", r.status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    generate_ok(&s).await;
    let m = client().get(s.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    assert!(metric(&m, "sparrow:http_connections_refused_total") >= 2.0, "{m}");
}

/// An answered keep-alive connection that stays silent is closed after the keep-alive timeout;
/// one that sends nothing at all after the header-read timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_are_closed() {
    let s = TestServer::start(Opts { limits: limits(3.0, 0.5, 60.0, 64), ..Opts::default() });
    let a = addr(&s);
    let mut sock = TcpStream::connect(&a).await.expect("connect");
    sock.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
    let answered = Instant::now();
    let (got, closed) = read_to_close(&mut sock, Duration::from_secs(10)).await;
    let idle = closed.expect("idle keep-alive connection still open after 10 s") - answered;
    assert!(got.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&got));
    assert!(idle >= Duration::from_millis(400) && idle <= Duration::from_millis(1500), "closed after {idle:?}");
    // Requests in a row on one connection, each within the keep-alive, are all served.
    let mut sock = TcpStream::connect(&a).await.expect("connect");
    for _ in 0..3 {
        sock.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
        let mut buf = [0u8; 512];
        let n = sock.read(&mut buf).await.expect("read");
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&buf[..n]));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A silent new connection is the header timeout's.
    let mut silent = TcpStream::connect(&a).await.expect("connect");
    let opened = Instant::now();
    let (_, closed) = read_to_close(&mut silent, Duration::from_secs(10)).await;
    let waited = closed.expect("silent connection still open after 10 s") - opened;
    assert!(waited >= Duration::from_millis(2500) && waited <= Duration::from_secs(4), "closed after {waited:?}");
}

/// SmolLM2 slowed to one forward per 30 ms, so a stream outlasts every timeout.
struct Slow(Box<dyn Model>);

impl Model for Slow {
    fn info(&self) -> &ModelInfo {
        self.0.info()
    }

    fn attention_needs(&self) -> AttentionNeeds {
        self.0.attention_needs()
    }

    fn forward(&mut self, batch: &ForwardBatch, kv: &mut KvStore) -> Result<Vec<f32>, EngineError> {
        std::thread::sleep(Duration::from_millis(30));
        self.0.forward(batch, kv)
    }
}

/// A stream several times longer than the header, keep-alive and body timeouts runs to its
/// last token; a stalled upload gets a 408 JSON error after the body timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_streams_are_not_cut_and_stalled_bodies_get_408() {
    let s = TestServer::start_wrapped(
        Opts { limits: limits(0.5, 0.5, 0.5, 64), disable_radix_cache: true, ..Opts::default() },
        |m| Box::new(Slow(m)),
    );
    let t0 = Instant::now();
    let body = json!({"text": "Once upon a time", "stream": true,
        "sampling_params": {"max_new_tokens": 80, "temperature": 0, "ignore_eos": true}});
    let (st, _, frames) = post_sse(&s, "/generate", body).await;
    let took = t0.elapsed();
    assert_eq!(st, 200);
    assert!(took > Duration::from_secs(2), "the stream took only {took:?}; it must outlast the timeouts");
    let last = frames.iter().rev().find(|f| f.is_object()).expect("a JSON frame");
    assert_eq!(last["meta_info"]["completion_tokens"], 80, "{last}");
    assert_eq!(frames.last(), Some(&Value::String("[DONE]".into())));

    let mut sock = TcpStream::connect(addr(&s)).await.expect("connect");
    sock.write_all(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"text\":")
        .await
        .expect("write");
    let sent = Instant::now();
    let (got, closed) = read_to_close(&mut sock, Duration::from_secs(10)).await;
    let waited = closed.map(|c| c - sent);
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("--timeout-body-read"), "{text}");
    assert!(waited.is_some_and(|w| w < Duration::from_millis(2500)), "closed after {waited:?}");
    assert_drained(&s).await;
}
