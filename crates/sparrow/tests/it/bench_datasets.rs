//! `sparrow bench`'s SGLang 0.5.23 datasets and request options end to end, against
//! `sparrow mock-server --log-requests`, checking what went over the wire (bodies, headers,
//! send times) and what the result line says.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};

use crate::common::{free_port, sparrow, wait_listening, words_tokenizer};
use serde_json::Value;

/// A mock server whose request log goes to a file; killed on drop.
struct Mock {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Mock {
    fn start(dir: &Path, extra: &[&str]) -> Mock {
        let port = free_port();
        let log = dir.join(format!("mock-{port}.log"));
        let child = sparrow()
            .args(["mock-server", "--listen", &format!("127.0.0.1:{port}"), "--log-requests"])
            .args(extra)
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("mock-server starts");
        wait_listening(port, "mock server");
        Mock { child, port, log }
    }

    /// (routing key, body) of every request the mock received, in arrival order.
    fn requests(&self) -> Vec<(String, Value)> {
        let text = std::fs::read_to_string(&self.log).expect("mock log");
        text.lines()
            .filter(|l| l.starts_with("mock request "))
            .map(|l| {
                let key = l.split(" routing_key=").nth(1).and_then(|r| r.split(' ').next()).unwrap_or("").to_owned();
                let body = l.split(" body=").nth(1).expect("body");
                (key, serde_json::from_str(body).expect("body json"))
            })
            .collect()
    }
}

fn bench(m: &Mock, dir: &Path, args: &[&str]) -> (Output, Value, Vec<Value>) {
    let out = dir.join(format!("r-{}.jsonl", m.port));
    let _ = std::fs::remove_file(&out);
    let o = sparrow()
        .args(["bench", "--host", "127.0.0.1", "--port", &m.port.to_string(), "--tokenizer", &words_tokenizer()])
        .args(["--disable-tqdm", "--warmup-requests", "0", "--health-interval", "0"])
        .args(args)
        .arg("--output-file")
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("bench runs");
    let line = std::fs::read_to_string(&out).unwrap_or_else(|_| {
        panic!(
            "no result line; stdout {} stderr {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    });
    let result: Value = serde_json::from_str(&line.replace("Infinity", "null")).expect("result json");
    let details = out.with_file_name(format!("r-{}.requests.jsonl", m.port));
    let records = std::fs::read_to_string(details)
        .expect("details")
        .lines()
        .map(|l| serde_json::from_str(l).expect("record json"))
        .collect();
    (o, result, records)
}

#[test]
fn multi_turn_zipf_shared_prefix_with_routing_keys_and_goodput() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = Mock::start(dir.path(), &[]);
    let (o, r, recs) = bench(
        &m,
        dir.path(),
        &[
            "--backend",
            "sglang-oai-chat",
            "--dataset-name",
            "generated-shared-prefix",
            "--gsp-num-groups",
            "4",
            "--gsp-prompts-per-group",
            "3",
            "--gsp-system-prompt-len",
            "20",
            "--gsp-question-len",
            "5",
            "--gsp-output-len",
            "4",
            "--gsp-num-turns",
            "3",
            "--gsp-group-distribution",
            "zipf",
            "--gsp-zipf-alpha",
            "1.5",
            "--gsp-send-routing-key",
            "--goodput",
            "e2el:60000",
            "ttft:60000",
            "--max-concurrency",
            "4",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    // 4 groups × 3 prompts × 3 rounds, each round a request and a record.
    assert_eq!(r["completed"], 36);
    assert_eq!(recs.len(), 36);
    let reqs = m.requests();
    assert_eq!(reqs.len(), 36);
    // Round k of a conversation carries 2k+1 messages: the history with the real answers.
    let mut by_len: BTreeMap<usize, usize> = BTreeMap::new();
    for (_, b) in &reqs {
        let msgs = b["messages"].as_array().expect("messages");
        *by_len.entry(msgs.len()).or_default() += 1;
        for (i, msg) in msgs.iter().enumerate() {
            assert_eq!(msg["role"], if i % 2 == 0 { "user" } else { "assistant" });
            assert!(!msg["content"].as_str().expect("content").is_empty(), "{b}");
        }
    }
    assert_eq!(by_len, BTreeMap::from([(1, 12), (3, 12), (5, 12)]));
    // The records say which round of which conversation they were; a later round's input
    // (the mock reports none, so the client's count of the history) is longer.
    let mut rounds: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for x in &recs {
        let c = x["turn"]["conversation"].as_u64().expect("conversation");
        rounds
            .entry(c)
            .or_default()
            .push((x["turn"]["round"].as_u64().expect("round"), x["prompt_len"].as_u64().expect("len")));
    }
    assert_eq!(rounds.len(), 12);
    for (c, mut v) in rounds {
        v.sort_unstable();
        assert_eq!(v.iter().map(|r| r.0).collect::<Vec<_>>(), vec![0, 1, 2], "conversation {c}");
        assert!(v[0].1 < v[1].1 && v[1].1 < v[2].1, "conversation {c}: {v:?}");
    }
    // Every conversation keeps its routing key through all rounds; a key names a group, and
    // first rounds with one key share one system prompt.
    let mut prefix_of_key: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (k, b) in &reqs {
        assert!(!k.is_empty(), "routing key sent");
        let first = b["messages"][0]["content"].as_str().expect("content");
        let system = first.split("\n\n").next().expect("system prompt").to_owned();
        prefix_of_key.entry(k.clone()).or_default().insert(system);
    }
    assert!(prefix_of_key.values().all(|s| s.len() == 1), "one system prompt per routing key");
    assert!(prefix_of_key.len() <= 4);
    // Goodput: generous SLOs are all met.
    assert_eq!(r["goodput_slos_ms"], serde_json::json!({"e2el": 60000.0, "ttft": 60000.0}));
    assert_eq!(r["slo_attainment"], 1.0);
    assert_eq!(r["slo_attainment_by_metric"]["ttft"], 1.0);
    let good = r["request_goodput"].as_f64().expect("goodput");
    let rate = r["request_throughput"].as_f64().expect("rate");
    assert!((good - rate).abs() < 1e-9 * rate.max(1.0), "all requests good: {good} vs {rate}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains(&format!("{:<40} {:<10}\n", "SLOs (ms):", "e2el:60000 ttft:60000")), "{stdout}");

    // An SLO nobody meets: attainment 0, and the result says so per metric.
    let (_, r, _) = bench(
        &m,
        dir.path(),
        &[
            "--backend",
            "sglang-oai",
            "--dataset-name",
            "random-ids",
            "--random-input-len",
            "8",
            "--random-output-len",
            "4",
            "--num-prompts",
            "5",
            "--goodput",
            "ttft:0.000001",
            "e2el:60000",
        ],
    );
    assert_eq!(r["slo_attainment"], 0.0);
    assert_eq!(r["request_goodput"], 0.0);
    assert_eq!(r["slo_attainment_by_metric"], serde_json::json!({"ttft": 0.0, "e2el": 1.0}));
}

#[test]
fn openai_dataset_sends_each_lines_messages_and_fields() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("chat.jsonl");
    std::fs::write(
        &data,
        concat!(
            r#"{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}], "max_tokens": 3, "top_k": 7, "model": "other"}"#, "\n",
            "not json\n",
            r#"{"messages": [{"role": "user", "content": "second one"}], "tools": [{"type": "function", "function": {"name": "f"}}]}"#, "\n",
            r#"{"messages": []}"#, "\n",
        ),
    )
    .expect("write");
    let m = Mock::start(dir.path(), &[]);
    let (o, r, recs) = bench(
        &m,
        dir.path(),
        &[
            "--backend",
            "sglang-oai-chat",
            "--dataset-name",
            "openai",
            "--dataset-path",
            data.to_str().expect("utf8"),
            "--num-prompts",
            "2",
            "--temperature",
            "0.5",
            "--top-p",
            "0.8",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(r["completed"], 2);
    assert_eq!(recs.len(), 2);
    let reqs = m.requests();
    let first = reqs.iter().map(|(_, b)| b).find(|b| b["max_tokens"] == 3).expect("first line's request");
    assert_eq!(first["messages"][0]["content"], "be brief", "messages sent as they are");
    assert_eq!(first["top_k"], 7, "the line's own fields are sent");
    assert_eq!(first["model"], "mock-model", "the line's model is not");
    assert_eq!(first["temperature"], 0.5);
    assert_eq!(first["top_p"], 0.8);
    let second = reqs.iter().map(|(_, b)| b).find(|b| b.get("tools").is_some()).expect("second line's request");
    assert_eq!(second["max_tokens"], 256, "SGLang's default output length");
}

#[test]
fn mooncake_trace_replays_at_its_timestamps_with_rounds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("trace.jsonl");
    std::fs::write(
        &trace,
        concat!(
            r#"{"timestamp": 2000, "input_length": 10, "output_length": 3, "hash_ids": [5]}"#,
            "\n",
            r#"{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1, 2]}"#,
            "\n",
            r#"{"timestamp": 1000, "input_length": 10, "output_length": 4, "hash_ids": [3]}"#,
            "\n",
            r#"{"timestamp": 9000, "input_length": 10, "output_length": 4, "hash_ids": [9]}"#,
            "\n",
        ),
    )
    .expect("write");
    let m = Mock::start(dir.path(), &[]);
    let (o, r, recs) = bench(
        &m,
        dir.path(),
        &[
            "--backend",
            "sglang",
            "--dataset-name",
            "mooncake",
            "--dataset-path",
            trace.to_str().expect("utf8"),
            "--num-prompts",
            "3",
            "--mooncake-num-rounds",
            "2",
            "--mooncake-slowdown-factor",
            "0.5",
            "--use-trace-timestamps",
            "--request-rate",
            "1000",
            "--print-requests",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(r["request_rate"], "trace");
    assert_eq!(r["completed"], 6, "first 3 sessions of the file × 2 rounds");
    // Sessions at 0, 1, 2 s of the trace, replayed twice as fast, both rounds at once.
    let mut sched: Vec<(f64, u64)> = recs
        .iter()
        .map(|x| (x["scheduled_s"].as_f64().expect("scheduled"), x["requested_output_len"].as_u64().expect("len")))
        .collect();
    sched.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert_eq!(sched, vec![(0.0, 2), (0.0, 2), (0.5, 4), (0.5, 4), (1.0, 3), (1.0, 3)]);
    assert!(r["duration"].as_f64().expect("duration") >= 1.0);
    // The prompts: each hash id then 128 `hi`, round 2 holding round 1 and a placeholder answer.
    let texts: Vec<String> = m.requests().iter().map(|(_, b)| b["text"].as_str().expect("text").to_owned()).collect();
    let two = texts.iter().find(|t| t.contains("Round 2: ") && t.contains("1hi hi")).expect("session 1 round 2");
    assert!(two.contains("Round 1: 1hi hi"), "{two}");
    assert!(two.contains("2hi hi"), "{two}");
    assert!(two.contains("story story"), "placeholder answer: {two}");
    assert!(two.contains("Tell me a story based on this context."));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(stdout.matches("message=\"request start\"").count(), 6, "{stdout}");
    assert_eq!(stdout.matches("message=\"request end\"").count(), 6, "{stdout}");
    assert!(stdout.contains(&format!("{:<40} {:<10}\n", "Traffic request rate:", "trace")), "{stdout}");
}

#[test]
fn tokenize_prompt_sends_input_ids_and_sampling_flags_reach_generate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = Mock::start(dir.path(), &[]);
    let (o, r, recs) = bench(
        &m,
        dir.path(),
        &[
            "--backend",
            "sglang",
            "--dataset-name",
            "random-ids",
            "--random-input-len",
            "12",
            "--random-output-len",
            "3",
            "--random-range-ratio",
            "1",
            "--num-prompts",
            "4",
            "--tokenize-prompt",
            "--temperature",
            "0.3",
            "--top-p",
            "0.5",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(r["completed"], 4);
    for (_, b) in m.requests() {
        assert!(b.get("text").is_none(), "{b}");
        let ids = b["input_ids"].as_array().expect("input_ids");
        assert_eq!(ids.len(), 12, "the prompt's tokens, special ones included");
        assert_eq!(b["sampling_params"]["temperature"], 0.3);
        assert_eq!(b["sampling_params"]["top_p"], 0.5);
    }
    assert!(recs.iter().all(|x| x["prompt_len"] == 12));
}

#[test]
fn trt_backend_streams_text_output_until_the_body_ends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = Mock::start(dir.path(), &["--tokens-per-chunk", "2"]);
    // The guide's TensorRT-LLM command line, on the mock.
    let (o, r, recs) = bench(
        &m,
        dir.path(),
        &[
            "--backend",
            "trt",
            "--model",
            "your-trt-llm-model",
            "--dataset-name",
            "random-ids",
            "--random-input-len",
            "8",
            "--random-output-len",
            "6",
            "--random-range-ratio",
            "1",
            "--num-prompts",
            "3",
            "--disable-ignore-eos",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(r["completed"], 3);
    for (_, b) in m.requests() {
        assert!(b["text_input"].as_str().is_some_and(|t| !t.is_empty()), "{b}");
        assert_eq!(b["max_tokens"], 6);
        assert_eq!(b["stream"], true);
        assert!(b.get("min_length").is_none(), "--disable-ignore-eos drops min_length: {b}");
    }
    // No token counts on this API: each answer's text is tokenized, and the records say so.
    for x in &recs {
        assert_eq!(x["output_tokens_source"], "estimated", "{x}");
        assert_eq!(x["chunks"].as_array().expect("chunks").len(), 3, "6 tokens, 2 a chunk");
    }
}

#[test]
fn a_closed_stdout_does_not_lose_the_run() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("tempdir");
    let m = Mock::start(dir.path(), &["--chunk-delay-ms", "20"]);
    let out = dir.path().join("piped.jsonl");
    // As `sparrow bench ... | head -1`: the reader goes away after the first line.
    let mut child = sparrow()
        .args(["bench", "--host", "127.0.0.1", "--port", &m.port.to_string(), "--tokenizer", &words_tokenizer()])
        .args(["--disable-tqdm", "--health-interval", "0", "--dataset-name", "random-ids", "--random-input-len", "8"])
        .args(["--random-output-len", "4", "--num-prompts", "6", "--print-requests", "--output-file"])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bench starts");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut first).expect("one line");
    // The pipe's read end is closed here (the reader was dropped).
    let status = child.wait().expect("bench exits");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err).expect("stderr");
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let line = std::fs::read_to_string(&out).expect("the result line is saved");
    assert!(line.contains("\"completed\": 6"), "{line}");
}

#[test]
fn sglang_guide_command_lines_run_against_the_mock() {
    // Each command of SGLang's benchmark guide on a dataset and backend we support, as written,
    // then flags appended (argparse's last value wins, in SGLang as here) that point it at the
    // mock and shrink it to a few short requests.
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("trace.jsonl");
    std::fs::write(&trace, "{\"timestamp\": 0, \"output_length\": 4, \"hash_ids\": [1]}\n{\"timestamp\": 100, \"output_length\": 4, \"hash_ids\": [2]}\n")
        .expect("trace");
    let m = Mock::start(dir.path(), &[]);
    let guide = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/tests/fixtures/sglang_docs_commands.txt"),
    )
    .expect("fixture");
    let mut ran = 0;
    for (n, line) in guide.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).enumerate() {
        if line.contains("--dataset-name image") {
            continue;
        }
        let out = dir.path().join(format!("guide-{n}.jsonl"));
        let mut argv: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        let shrink = format!(
            "--base-url http://127.0.0.1:{} --tokenizer {} --num-prompts 3 --random-input-len 16 --random-output-len 4 \
             --sharegpt-output-len 4 --gsp-num-groups 2 --gsp-prompts-per-group 2 --gsp-system-prompt-len 16 \
             --gsp-question-len 4 --gsp-output-len 4 --mooncake-num-rounds 2 --request-rate inf --disable-tqdm \
             --health-interval 0",
            m.port,
            words_tokenizer()
        );
        argv.extend(shrink.split_whitespace().map(str::to_owned));
        if line.contains("mooncake") {
            argv.extend(["--dataset-path".to_owned(), trace.to_str().expect("utf8").to_owned()]);
        }
        argv.extend(["--output-file".to_owned(), out.to_str().expect("utf8").to_owned()]);
        let o = sparrow().arg("bench").args(&argv).output().expect("bench runs");
        assert_eq!(o.status.code(), Some(0), "{line}\n{}", String::from_utf8_lossy(&o.stderr));
        let r: Value =
            serde_json::from_str(&std::fs::read_to_string(&out).expect("result").replace("Infinity", "null"))
                .expect("json");
        assert!(r["completed"].as_u64().is_some_and(|c| c >= 3), "{line}: {r}");
        ran += 1;
    }
    assert_eq!(ran, 11);
}
