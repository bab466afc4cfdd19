//! The client against a server's connection housekeeping. Against llama-server, `sparrow bench`
//! (c=8, 16 requests) once counted 2 failures `connection closed before message completed`: the
//! server had closed an idle keep-alive connection that the client's pool then reused. Here a
//! hand-written HTTP/1.1 server keeps connections open, closes idle ones, or reads every
//! completion that comes on a reused connection and closes it without a byte of answer (the
//! race made certain). None may cost a request; the last is retried once on a fresh connection
//! and counted as a retry.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sparrow_bench::run;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

#[derive(Clone, Copy)]
enum Habit {
    /// Keeps every connection open as long as the client does.
    KeepAlive,
    /// Closes a connection that has waited this long for its next request.
    IdleClose(Duration),
    /// Reads a completion request that arrives on a connection already used, waits this long,
    /// then closes the connection without answering.
    DropReused(Duration),
}

#[derive(Default)]
struct Counts {
    idle_closes: AtomicU64,
    dropped: AtomicU64,
    answered: AtomicU64,
    /// Completions answered on a connection that had answered a completion before.
    answered_reused: AtomicU64,
}

/// One request's path (its head and `Content-Length` body read); `None` at EOF.
async fn read_request(r: &mut BufReader<TcpStream>) -> Option<String> {
    let mut line = String::new();
    if r.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let path = line.split_whitespace().nth(1)?.to_owned();
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).await.ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).await.ok()?;
    Some(path)
}

fn answer(path: &str) -> String {
    let (status, body) = if path.starts_with("/v1/models") {
        ("200 OK", r#"{"object":"list","data":[{"id":"test","object":"model"}]}"#)
    } else if path.starts_with("/v1/completions") {
        (
            "200 OK",
            r#"{"id":"c","object":"text_completion","choices":[{"index":0,"text":"a b c","finish_reason":"length"}],"usage":{"prompt_tokens":6,"completion_tokens":3,"total_tokens":9}}"#,
        )
    } else if path.starts_with("/health") {
        ("200 OK", "")
    } else {
        ("404 Not Found", "")
    };
    format!("HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len())
}

async fn connection(stream: TcpStream, habit: Habit, counts: Arc<Counts>) {
    let mut r = BufReader::new(stream);
    let (mut served, mut completions) = (0, 0);
    loop {
        let path = match habit {
            Habit::IdleClose(idle) => match tokio::time::timeout(idle, read_request(&mut r)).await {
                Ok(p) => p,
                Err(_) => {
                    counts.idle_closes.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            },
            Habit::KeepAlive | Habit::DropReused(_) => read_request(&mut r).await,
        };
        let Some(path) = path else { return };
        let completion = path.starts_with("/v1/completions");
        if let (Habit::DropReused(wait), true, true) = (habit, completion, served > 0) {
            counts.dropped.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(wait).await;
            return;
        }
        served += 1;
        if r.get_mut().write_all(answer(&path).as_bytes()).await.is_err() {
            return;
        }
        if completion {
            counts.answered.fetch_add(1, Ordering::Relaxed);
            if completions > 0 {
                counts.answered_reused.fetch_add(1, Ordering::Relaxed);
            }
            completions += 1;
        }
    }
}

async fn start(habit: Habit) -> (String, Arc<Counts>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let counts = Arc::new(Counts::default());
    let c = counts.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(connection(s, habit, c.clone()));
        }
    });
    (url, counts)
}

/// A quiet bench (`bench.rs`'s defaults) of non-streamed completions, one at a time, without
/// health probes (which would keep pooled connections busy).
async fn bench(url: &str, dir: &std::path::Path, extra: &[&str]) -> run::RunOutcome {
    let mut flags = vec![
        "--backend",
        "sglang-oai",
        "--disable-stream",
        "--strict-json",
        "--max-concurrency",
        "1",
        "--health-interval",
        "0",
    ];
    flags.extend_from_slice(extra);
    crate::bench::bench_at(url, dir, &flags).await.expect("run")
}

/// Against a server that never closes a connection: requests 1.25 s apart each get a new one
/// (idle past the client's 500 ms bound), requests 200 ms apart reuse theirs.
#[tokio::test]
async fn pooled_connections_idle_past_the_bound_are_not_reused() {
    for (rate, n, reuse) in [("0.8", 3, false), ("5", 5, true)] {
        let (url, counts) = start(Habit::KeepAlive).await;
        let dir = tempfile::tempdir().expect("tmp");
        let num = n.to_string();
        let o = bench(&url, dir.path(), &["--num-prompts", &num, "--request-rate", rate, "--burstiness", "100"]).await;
        assert_eq!((o.metrics.completed, o.metrics.failed), (n, 0), "{:?}", o.metrics.errors_by_cause);
        let reused = counts.answered_reused.load(Ordering::Relaxed);
        assert_eq!(reused > 0, reuse, "rate {rate}: {reused} completions on a reused connection");
    }
}

/// Requests 400 ms apart against a server that closes connections idle for 200 ms, which the
/// client would still reuse: none is lost.
#[tokio::test]
async fn idle_connections_closed_by_the_server_cost_no_request() {
    let (url, counts) = start(Habit::IdleClose(Duration::from_millis(200))).await;
    let dir = tempfile::tempdir().expect("tmp");
    let o = bench(&url, dir.path(), &["--num-prompts", "5", "--request-rate", "2.5", "--burstiness", "100"]).await;
    assert_eq!((o.metrics.completed, o.metrics.failed), (5, 0), "{:?}", o.metrics.errors_by_cause);
    assert_eq!(counts.answered.load(Ordering::Relaxed), 5);
    assert!(counts.idle_closes.load(Ordering::Relaxed) > 0, "the server closed idle connections");
}

/// A request written into a connection the server then closes at once without answering is
/// sent once more on a fresh connection: nothing lost, every retry counted (the record, the
/// metrics, the result line and the printed block). A connection closed 400 ms after the
/// request (past the retry window) is that request's failure, not retried.
#[tokio::test]
async fn a_request_lost_on_a_reused_connection_is_retried_once_and_counted() {
    let (url, counts) = start(Habit::DropReused(Duration::ZERO)).await;
    let dir = tempfile::tempdir().expect("tmp");
    let o = bench(&url, dir.path(), &["--num-prompts", "8"]).await;
    assert_eq!((o.metrics.completed, o.metrics.failed), (8, 0), "{:?}", o.metrics.errors_by_cause);
    let dropped = counts.dropped.load(Ordering::Relaxed) as usize;
    assert!(dropped > 0, "the pool reused connections");
    assert_eq!(o.metrics.retried_requests, dropped);
    assert_eq!(o.records.iter().filter(|r| r.retries == 1).count(), dropped);
    assert!(o.records.iter().all(|r| r.retries <= 1));
    let line = std::fs::read_to_string(&o.output_file).expect("result line");
    let v: serde_json::Value = serde_json::from_str(line.lines().last().expect("a line")).expect("json");
    assert_eq!(v["retried_requests"], dropped);
    let block = sparrow_bench::report::render_block(&o.summary, &o.metrics);
    let shown =
        block.lines().find(|l| l.starts_with("Retried on a fresh connection:")).expect("the block shows retries");
    assert_eq!(shown.split_whitespace().last(), Some(dropped.to_string().as_str()));

    let (url, counts) = start(Habit::DropReused(Duration::from_millis(400))).await;
    let dir = tempfile::tempdir().expect("tmp");
    let o = bench(&url, dir.path(), &["--num-prompts", "4"]).await;
    let dropped = counts.dropped.load(Ordering::Relaxed) as usize;
    assert!(dropped > 0, "the pool reused connections");
    assert_eq!((o.metrics.failed, o.metrics.retried_requests), (dropped, 0), "{:?}", o.metrics.errors_by_cause);
}
