//! The hierarchical cache's file tier across restarts of `sparrow serve` (SmolLM2-135M): a
//! 2,000-token prompt's pages reach the tier; a server started again on the same directory
//! serves that prefix as a hit on its first request, with the same greedy text; a block cut
//! short on disk is skipped with a log line, and the text is still the same.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{free_port, sparrow};

struct Server(Child, u16);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(dir: &Path, log: &Path) -> Server {
    let port = free_port();
    let extra = json!({ "storage_dir": dir }).to_string();
    let child = sparrow()
        .args(["serve", "--port", &port.to_string(), "--max-total-tokens", "30000", "--disable-autotune"])
        .args(["--page-size", "16", "--enable-hierarchical-cache", "--hicache-storage-backend", "file"])
        .args(["--hicache-storage-backend-extra-config", &extra])
        .stderr(std::fs::File::create(log).expect("log file"))
        .stdout(Stdio::null())
        .spawn()
        .expect("sparrow serve starts");
    let s = Server(child, port);
    let deadline = Instant::now() + Duration::from_secs(300);
    while http(port, "GET", "/health", None).is_none() {
        assert!(Instant::now() < deadline, "sparrow serve never answered");
        std::thread::sleep(Duration::from_millis(100));
    }
    s
}

/// One HTTP/1.0 exchange; the body, or `None` when nothing answers.
fn http(port: u16, method: &str, path: &str, body: Option<&Value>) -> Option<String> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(300))).ok()?;
    let b = body.map(Value::to_string).unwrap_or_default();
    let head =
        format!("{method} {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", b.len());
    c.write_all(head.as_bytes()).ok()?;
    c.write_all(b.as_bytes()).ok()?;
    let mut text = String::new();
    c.read_to_string(&mut text).ok()?;
    text.starts_with("HTTP/").then(|| text.split_once("\r\n\r\n").map_or(String::new(), |(_, b)| b.to_owned()))
}

/// `/generate` greedy on `ids`: (text, cached tokens); checks that the cached tokens are split
/// by tier in `cached_tokens_details`, and returns the file tier's share as the second value.
fn generate(s: &Server, ids: &[u32]) -> (String, u64) {
    let body =
        json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": true}});
    let out = http(s.1, "POST", "/generate", Some(&body)).expect("answer");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("JSON: {out}"));
    let meta = &v["meta_info"];
    let d = &meta["cached_tokens_details"];
    let (device, storage) = (d["device"].as_u64().expect("device"), d["storage"].as_u64().expect("storage"));
    assert_eq!(Some(device + storage), meta["cached_tokens"].as_u64(), "{meta}");
    (v["text"].as_str().unwrap_or_else(|| panic!("{v}")).to_owned(), storage)
}

fn blocks(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "kvb")).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn a_restarted_server_serves_a_long_prefix_from_the_file_tier() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("tier");
    let log = tmp.path().join("serve.log");
    let ids: Vec<u32> = (0..2000u32).map(|i| 100 + (i * 7919) % 40_000).collect();
    let first = {
        let s = serve(&dir, &log);
        let (text, cached) = generate(&s, &ids);
        assert_eq!(cached, 0);
        // 2,007 computed positions: 125 whole pages of 16, written through as they are cached.
        let deadline = Instant::now() + Duration::from_secs(60);
        while blocks(&dir).len() < 125 {
            assert!(Instant::now() < deadline, "only {} blocks written", blocks(&dir).len());
            std::thread::sleep(Duration::from_millis(50));
        }
        text
    };
    let s = serve(&dir, &log);
    let (text, cached) = generate(&s, &ids);
    assert_eq!(text, first);
    assert!(cached >= 1984, "cached_tokens {cached} from the file tier after the restart");
    let metrics = http(s.1, "GET", "/metrics", None).expect("metrics");
    assert!(metrics.contains("sparrow:hicache_storage_hit_tokens_total 1984"), "{metrics}");
    drop(s);
    // Cut one block short: the next server skips it (a log line) and still answers right.
    let victim = blocks(&dir)[40].clone();
    let b = std::fs::read(&victim).expect("block");
    std::fs::write(&victim, &b[..b.len() / 2]).expect("truncate");
    let s = serve(&dir, &log);
    let (text, cached) = generate(&s, &ids);
    assert_eq!(text, first);
    assert!(cached < 1984, "the hit stops before the bad block: {cached}");
    drop(s);
    let log = std::fs::read_to_string(&log).expect("log");
    assert!(log.contains("hicache: block") && log.contains("skipped"), "{log}");
    assert!(log.contains("reopened"), "{log}");
}
