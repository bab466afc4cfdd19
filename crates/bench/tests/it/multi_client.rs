//! Multi-client runs (`--client-index/--client-count/--start-at`) and `sparrow bench merge`,
//! against the scripted mock server with the word-level test tokenizer, so every count is
//! exact and the only free variable is timing.

use std::path::{Path, PathBuf};

use clap::Parser;
use sparrow_bench::args::BenchArgs;
use sparrow_bench::merge::{self, read_records};
use sparrow_bench::mock::{self, MockScript};
use sparrow_bench::run::{self, exit, unix_now, RunOutcome};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// The flags of every run here: 24 random-ids prompts of 3..=8 tokens asking for 2..=6
/// tokens, arriving as a Poisson process at 40 req/s, at most 4 in flight run-wide.
fn argv(url: &str, out: &Path, extra: &[String]) -> Vec<String> {
    let tok = fixture("words.tokenizer.json");
    let mut v: Vec<String> = [
        "bench",
        "--base-url",
        url,
        "--tokenizer",
        tok.to_str().expect("utf8"),
        "--dataset-name",
        "random-ids",
        "--random-input-len",
        "8",
        "--random-output-len",
        "6",
        "--random-range-ratio",
        "0.3",
        "--num-prompts",
        "24",
        "--request-rate",
        "40",
        "--max-concurrency",
        "4",
        "--warmup-requests",
        "1",
        "--disable-tqdm",
        "--health-interval",
        "0.5",
        "--output-file",
        out.to_str().expect("utf8"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(extra.iter().cloned());
    v
}

async fn bench(args: Vec<String>) -> RunOutcome {
    let cfg = BenchArgs::try_parse_from(args).expect("flags parse").validate().expect("flags valid");
    run::run(cfg).await.expect("run")
}

fn script() -> MockScript {
    MockScript { first_chunk_delay_ms: 20, chunk_delay_ms: 5, ..Default::default() }
}

#[tokio::test]
async fn two_clients_merged_equal_one_client() {
    let server = mock::start("127.0.0.1:0".parse().expect("addr"), script()).await.expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let url = server.url();

    let one = bench(argv(&url, &dir.path().join("one.jsonl"), &[])).await;
    assert_eq!(one.exit_code, exit::OK);
    assert_eq!(one.records.len(), 24);

    // Two clients of one run, started together as two processes would be.
    let start = format!("{:.3}", unix_now() + 1.0);
    let client = |i: usize| {
        let extra: Vec<String> =
            ["--client-index", &i.to_string(), "--client-count", "2", "--start-at", &start].map(String::from).into();
        argv(&url, &dir.path().join(format!("two.client{i}of2.jsonl")), &extra)
    };
    let (a, b) = tokio::join!(bench(client(0)), bench(client(1)));
    assert_eq!((a.exit_code, b.exit_code), (exit::OK, exit::OK));
    // An interleaved split: client i holds the dataset positions p with p % 2 == i.
    assert_eq!(a.records.iter().map(|r| r.index).collect::<Vec<_>>(), (0..24).step_by(2).collect::<Vec<_>>());
    assert_eq!(b.records.iter().map(|r| r.index).collect::<Vec<_>>(), (1..24).step_by(2).collect::<Vec<_>>());
    assert_eq!(a.summary.max_concurrency, Some(4), "the line keeps the run's --max-concurrency");
    let share = |o: &RunOutcome| o.summary.client.as_ref().and_then(|c| c.max_concurrency);
    assert_eq!((share(&a), share(&b)), (Some(2), Some(2)), "and each client holds half of it");

    // The tokenizer comes from the clients' result lines.
    let m = merge::merge(&[a.details_file.clone(), b.details_file.clone()], None).expect("merge");
    assert!(m.warnings.is_empty(), "{:?}", m.warnings);
    assert_eq!(m.records.len(), 24);
    for (x, y) in m.records.iter().zip(&one.records) {
        // What the dataset and the schedule decide is equal, request for request.
        assert_eq!(x.index, y.index);
        assert_eq!(x.prompt_len, y.prompt_len, "request {}", x.index);
        assert_eq!(x.requested_output_len, y.requested_output_len, "request {}", x.index);
        assert_eq!(x.scheduled_s, y.scheduled_s, "request {}: one arrival schedule", x.index);
        assert_eq!(x.output_tokens, y.output_tokens, "request {}", x.index);
        assert_eq!(x.text, y.text, "request {}", x.index);
        assert!(x.success() && y.success());
        // Both clients' clocks start at --start-at: nothing is sent before it is due.
        assert!(x.dispatched_s >= x.scheduled_s - 1e-3, "request {} sent early: {x:?}", x.index);
        // The mock's 20 ms first chunk bounds TTFT from below on every clock.
        assert!(x.ttft().expect("ttft") >= 0.019, "request {}", x.index);
    }
    let (mm, om) = (&m.metrics, &one.metrics);
    assert_eq!((mm.completed, mm.failed), (om.completed, om.failed));
    assert_eq!((mm.total_input, mm.total_output), (om.total_input, om.total_output));
    assert_eq!(mm.total_output_retokenized, om.total_output_retokenized);
    assert!(mm.total_output_retokenized > 0);
    assert_eq!(m.summary.max_concurrency, Some(4));
    assert_eq!(m.summary.backend, "sglang");
    let last_due = one.records.iter().map(|r| r.scheduled_s).fold(0.0, f64::max);
    assert!(m.summary.duration_s > last_due, "{} vs last arrival {last_due}", m.summary.duration_s);
}

#[tokio::test]
async fn merge_is_the_one_run_metric_code_not_an_average() {
    // One client's records, split into two files by index parity with the client's result
    // line beside each: the merge must give that client's figures exactly.
    let server = mock::start("127.0.0.1:0".parse().expect("addr"), script()).await.expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let one = bench(argv(&server.url(), &dir.path().join("one.jsonl"), &[])).await;
    let text = std::fs::read_to_string(&one.details_file).expect("details");
    let result_line = std::fs::read_to_string(&one.output_file).expect("result");
    let mut parts = [String::new(), String::new()];
    for line in text.lines() {
        let idx = serde_json::from_str::<serde_json::Value>(line).expect("json")["index"].as_u64().expect("index");
        parts[idx as usize % 2].push_str(line);
        parts[idx as usize % 2].push('\n');
    }
    let mut files = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let f = dir.path().join(format!("part{i}.requests.jsonl"));
        std::fs::write(&f, p).expect("write");
        // The client's line, with the counts of its half (as a client's own line has them).
        let mut line: serde_json::Value = serde_json::from_str(result_line.trim()).expect("result json");
        line["completed"] = p.lines().count().into();
        line["failed"] = 0.into();
        std::fs::write(dir.path().join(format!("part{i}.jsonl")), format!("{line}\n")).expect("write");
        files.push(f);
    }
    // The halves are uneven in latency, so an average of per-file medians would differ.
    let tok = fixture("words.tokenizer.json");
    let m = merge::merge(&files, Some(&tok)).expect("merge");
    assert_eq!(m.records, one.records, "records read back exactly");
    assert_eq!(m.summary.duration_s, one.summary.duration_s);
    assert_eq!(m.metrics, one.metrics);
    // A result line that does not describe its file (here: an earlier, longer run's) is
    // set aside, and said so; the records still count.
    std::fs::write(dir.path().join("part1.jsonl"), &result_line).expect("write");
    std::fs::write(&files[1], parts[1].lines().take(2).map(|l| format!("{l}\n")).collect::<String>()).expect("write");
    let m = merge::merge(&files, Some(&tok)).expect("merge");
    assert_eq!(m.records.len(), 12 + 2);
    assert!(m.warnings.iter().any(|w| w.contains("part1.jsonl") && w.contains("ignored")), "{:?}", m.warnings);
}

#[test]
fn a_torn_last_line_is_skipped_and_a_bad_middle_line_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rec = r#"{"index":0,"prompt_len":3,"requested_output_len":2,"scheduled_s":0.0,"dispatched_s":0.0,"sent_s":0.0,"first_byte_s":0.01,"chunks":[{"t":0.02,"tokens":1},{"t":0.03,"tokens":1}],"end_s":0.03,"output_tokens":2,"output_tokens_source":"server","finish_reason":"length","text":" hello world","failure":null}"#;
    let torn = dir.path().join("t.requests.jsonl");
    std::fs::write(&torn, format!("{rec}\n{}", &rec[..40])).expect("write");
    let r = read_records(&torn).expect("lenient");
    assert_eq!(r.records.len(), 1);
    assert_eq!(r.torn_line, Some(2));
    assert_eq!(r.records[0].ttft(), Some(0.02));

    let bad = dir.path().join("b.requests.jsonl");
    std::fs::write(&bad, format!("{}\n{rec}\n", &rec[..40])).expect("write");
    let e = read_records(&bad).expect_err("a bad line that is not the last");
    assert!(e.to_string().contains(":1:"), "{e}");

    // A record twice (one client's file given twice) is refused.
    let e = merge::merge(&[torn.clone(), torn], None).expect_err("duplicate");
    assert!(e.to_string().contains("request 0 is in both"), "{e}");
}

#[test]
fn client_flags_are_checked() {
    let p = |extra: &[&str]| {
        let mut v = vec!["bench"];
        v.extend_from_slice(extra);
        BenchArgs::try_parse_from(v).expect("parse").validate().map_err(|e| e.0)
    };
    let at = format!("{:.0}", unix_now() + 60.0);
    assert!(p(&["--client-count", "2"]).expect_err("start").contains("--start-at"));
    assert!(p(&["--client-index", "2", "--client-count", "2", "--start-at", &at]).expect_err("idx").contains("below"));
    assert!(p(&["--client-count", "0"]).is_err());
    // Milliseconds, or a time long past, are slips, not start times.
    let ms = format!("{}", unix_now() * 1000.0);
    assert!(p(&["--client-count", "2", "--start-at", &ms]).expect_err("ms").contains("--start-at"));
    assert!(p(&["--client-count", "2", "--start-at", "1000000000"]).expect_err("past").contains("--start-at"));
    let e = p(&["--client-count", "3", "--start-at", &at, "--max-concurrency", "2"]).expect_err("share");
    assert!(e.contains("--max-concurrency"), "{e}");
    let shares: Vec<Option<usize>> = (0..3)
        .map(|i| {
            let i = i.to_string();
            p(&["--client-index", &i, "--client-count", "3", "--start-at", &at, "--max-concurrency", "8"])
                .expect("ok")
                .client_max_concurrency()
        })
        .collect();
    assert_eq!(shares, vec![Some(3), Some(3), Some(2)]);
    assert_eq!(
        merge::default_merged_file(Path::new("d/x.client1of2.requests.jsonl")),
        PathBuf::from("d/x.merged.jsonl")
    );
    assert_eq!(merge::default_merged_file(Path::new("x.requests.jsonl")), PathBuf::from("x.merged.jsonl"));
}
