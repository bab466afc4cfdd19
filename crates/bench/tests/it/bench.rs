//! `sparrow bench` against the scripted mock server: one test per case of
//! `shared/cases/bench.md` (named after its id), plus datasets and the JSONL output.
//!
//! Prompts come from the `random-ids` or `custom` datasets over a word-level test tokenizer
//! (`fixtures/words.tokenizer.json`), so every token count here is exact and needs no model.

use std::path::{Path, PathBuf};

use clap::Parser;
use sparrow_bench::args::BenchArgs;
use sparrow_bench::mock::{self, FailMode, MockScript, UsageMode};
use sparrow_bench::record::{FailureKind, TokenCountSource};
use sparrow_bench::run::{self, exit, RunOutcome};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

async fn start(script: MockScript) -> mock::MockServer {
    mock::start("127.0.0.1:0".parse().expect("addr"), script).await.expect("mock server starts")
}

/// Runs a bench against `server` with `extra` flags on top of quiet, fast defaults.
async fn bench(server: &mock::MockServer, dir: &Path, extra: &[&str]) -> Result<RunOutcome, run::BenchError> {
    bench_at(&server.url(), dir, extra).await
}

/// [`bench`] against any server at `url`.
pub(crate) async fn bench_at(url: &str, dir: &Path, extra: &[&str]) -> Result<RunOutcome, run::BenchError> {
    let out = dir.join("out.jsonl");
    let tok = fixture("words.tokenizer.json");
    let mut argv: Vec<String> = [
        "bench",
        "--base-url",
        url,
        "--tokenizer",
        tok.to_str().expect("utf8"),
        "--dataset-name",
        "random-ids",
        "--random-input-len",
        "6",
        "--random-output-len",
        "5",
        "--random-range-ratio",
        "1",
        "--num-prompts",
        "10",
        "--warmup-requests",
        "0",
        "--disable-tqdm",
        "--health-interval",
        "0.2",
        "--output-file",
        out.to_str().expect("utf8"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.extend(extra.iter().map(|s| s.to_string()));
    let cfg = BenchArgs::try_parse_from(argv).expect("flags parse").validate().expect("flags valid");
    run::run(cfg).await
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[tokio::test]
async fn b01_ttft_and_itl_partition_the_stream() {
    let server = start(MockScript { usage: UsageMode::Final, chunk_delay_ms: 20, ..Default::default() }).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let o = bench(&server, dir.path(), &["--backend", "sglang-oai"]).await.expect("run");
    assert_eq!(o.exit_code, exit::OK);
    assert_eq!(o.metrics.completed, 10);
    for r in &o.records {
        assert_eq!(r.chunks.len(), 5, "one content chunk per token");
        let (itl, per_token) = r.itl();
        assert!(!per_token, "usage only at the end: ITL is per chunk");
        assert_eq!(itl.len(), r.chunks.len() - 1);
        let last = r.chunks.last().expect("chunks").t;
        let ttft = r.ttft().expect("ttft");
        assert!(close(ttft + itl.iter().sum::<f64>(), last - r.sent_s));
        assert!(itl.iter().all(|g| *g >= 0.019), "the mock waits 20 ms between chunks: {itl:?}");
    }
    assert!(!o.metrics.itl_per_token);
}

#[tokio::test]
async fn b02_usage_in_final_empty_chunk_gives_real_output_len() {
    // The model "stops at EOS" after 3 tokens of the 5 asked for; usage comes only in a
    // final chunk with `choices: []`.
    let server = start(MockScript { usage: UsageMode::Final, output_tokens: Some(3), ..Default::default() }).await;
    let dir = tempfile::tempdir().expect("tempdir");
    for backend in ["sglang-oai", "sglang-oai-chat"] {
        let o = bench(&server, dir.path(), &["--backend", backend]).await.expect("run");
        assert_eq!(o.metrics.completed, 10, "{backend}");
        for r in &o.records {
            assert_eq!(r.requested_output_len, 5);
            assert_eq!(r.output_tokens, 3, "{backend}: counted from usage, not the requested length");
            assert_eq!(r.output_tokens_source, TokenCountSource::Server);
            assert_eq!(r.finish_reason.as_deref(), Some("stop"));
        }
        assert_eq!(o.metrics.total_output, 30);
        assert_eq!(o.metrics.estimated_output_requests, 0);
    }
}

#[tokio::test]
async fn b02_no_usage_counts_received_text_and_flags_it() {
    let server = start(MockScript { usage: UsageMode::None, output_tokens: Some(3), ..Default::default() }).await;
    let dir = tempfile::tempdir().expect("tempdir");
    for backend in ["sglang-oai", "sglang-oai-chat", "sglang"] {
        let o = bench(&server, dir.path(), &["--backend", backend]).await.expect("run");
        for r in &o.records {
            assert_eq!(r.output_tokens, 3, "{backend}: three words came back");
            assert_eq!(r.output_tokens_source, TokenCountSource::Estimated);
        }
        assert_eq!(o.metrics.estimated_output_requests, 10);
        let block = sparrow_bench::report::render_block(&o.summary, &o.metrics);
        assert!(block.contains("Requests with estimated output tokens:   10"), "{block}");
    }
}

#[tokio::test]
async fn native_generate_multi_token_chunks_give_per_token_itl() {
    let server = start(MockScript { tokens_per_chunk: 2, chunk_delay_ms: 10, ..Default::default() }).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let o = bench(&server, dir.path(), &["--backend", "sglang"]).await.expect("run");
    assert!(o.metrics.itl_per_token);
    for r in &o.records {
        // 5 tokens in chunks of 2, 2, 1: the first chunk gives TTFT, the others 2 + 1 entries.
        let toks: Vec<_> = r.chunks.iter().map(|c| c.tokens).collect();
        assert_eq!(toks, vec![Some(2), Some(2), Some(1)]);
        let (itl, _) = r.itl();
        assert_eq!(itl.len(), 3);
        assert!(close(itl[0], itl[1]), "a 2-token chunk splits its gap evenly");
        assert!(close(r.ttft().expect("ttft") + itl.iter().sum::<f64>(), r.chunks[2].t - r.sent_s));
        assert_eq!(r.output_tokens, 5);
        assert_eq!(r.text, " hello world sparrow bench hello");
    }
}

#[tokio::test]
async fn b03_input_len_one_with_bos_tokenizer_fails_before_the_run() {
    let server = start(MockScript::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let tok = fixture("words_bos.tokenizer.json");
    for dataset in ["random", "random-ids"] {
        let err = bench(
            &server,
            dir.path(),
            &["--dataset-name", dataset, "--random-input-len", "1", "--tokenizer", tok.to_str().expect("utf8")],
        )
        .await
        .expect_err("refused");
        let msg = err.to_string();
        assert!(msg.contains("--random-input-len"), "{msg}");
        assert_eq!(err.exit_code(), exit::SETUP);
    }
    assert_eq!(server.received(), 0, "nothing was sent");
    // With room for one content token the real prompt length (BOS included) is reported.
    let o = bench(&server, dir.path(), &["--random-input-len", "2", "--tokenizer", tok.to_str().expect("utf8")])
        .await
        .expect("run");
    assert!(o.records.iter().all(|r| r.prompt_len == 2));
}

#[tokio::test]
async fn b04_failures_are_counted_by_cause_and_left_out_of_figures() {
    let server = start(MockScript {
        fail_every: Some(5),
        fail_modes: vec![FailMode::Http500, FailMode::InBandError, FailMode::NoDone],
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let o = bench(&server, dir.path(), &["--backend", "sglang-oai", "--num-prompts", "30"]).await.expect("run");
    assert_eq!(o.metrics.completed, 24);
    assert_eq!(o.metrics.failed, 6);
    let by: Vec<(String, usize)> = o.metrics.errors_by_cause.clone().into_iter().collect();
    assert_eq!(by, vec![("HTTP 500".into(), 2), ("in-band error".into(), 2), ("stream ended early".into(), 2)]);
    assert_eq!(o.metrics.total_output, 24 * 5, "failed requests add no tokens");
    assert_eq!(o.metrics.total_input, 24 * 6);
    assert_eq!(o.exit_code, exit::FAILURES, "default --max-failure-rate is 0");
    let block = sparrow_bench::report::render_block(&o.summary, &o.metrics);
    assert!(block.contains("Failed requests:                         6"), "{block}");
    assert!(block.contains(&format!("{:<40} {:<10}\n", "  HTTP 500:", 2)), "{block}");
    assert!(block.contains(&format!("{:<40} {:<10}\n", "  in-band error:", 2)), "{block}");

    let o =
        bench(&server, dir.path(), &["--backend", "sglang-oai", "--num-prompts", "30", "--max-failure-rate", "0.25"])
            .await
            .expect("run");
    assert_eq!(o.metrics.failed, 6);
    assert_eq!(o.exit_code, exit::OK, "20% failed, 25% allowed");
}

#[tokio::test]
async fn b05_a_stalled_stream_times_out_and_the_rest_is_reported() {
    let server =
        start(MockScript { fail_every: Some(4), fail_modes: vec![FailMode::Stall], ..Default::default() }).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let o = bench(&server, dir.path(), &["--num-prompts", "8", "--read-timeout", "0.5"]).await.expect("run");
    assert_eq!(o.metrics.completed, 6);
    assert_eq!(o.metrics.errors_by_cause.get("timeout"), Some(&2));
    let stalled = o.records.iter().find(|r| !r.success()).expect("a stalled request");
    assert_eq!(stalled.chunks.len(), 1, "one chunk before the stall");
    assert!(stalled.end_s - stalled.chunks[0].t >= 0.5);
    assert_eq!(o.exit_code, exit::FAILURES);
    assert!(o.summary.server_down.is_none(), "a stalled stream is not a dead server");
}

#[tokio::test]
async fn b05_server_death_with_200_in_flight_is_reported_and_saved() {
    // 200 requests all sent at once; each streams 30 chunks 200 ms apart (6 s); the server
    // dies when the 200th request arrives, so every one of them is in flight.
    let server = start(MockScript { chunk_delay_ms: 200, die_after: Some(199), ..Default::default() }).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let o = bench(&server, dir.path(), &["--num-prompts", "200", "--random-output-len", "30"]).await.expect("run");
    assert_eq!(o.exit_code, exit::SERVER_DOWN);
    let down = o.summary.server_down.clone().expect("server death noticed");
    assert_eq!(down.in_flight, 200, "{down:?}");
    assert_eq!(down.not_sent, 0);
    assert!(down.at_s > 0.0 && down.at_s < 5.0, "{down:?}");
    assert!(o.summary.duration_s < 5.9, "the run ends when the streams are cut, not when they would have ended");
    assert_eq!(o.metrics.completed, 0);
    assert_eq!(o.metrics.failed, 200);
    for r in &o.records {
        let kind = r.failure.as_ref().map(|f| f.kind);
        assert!(matches!(kind, Some(FailureKind::ConnectionReset | FailureKind::StreamEndedEarly)), "{kind:?}");
    }
    // Every request is in the details file, and the result line was written.
    let details = std::fs::read_to_string(&o.details_file).expect("details file");
    assert_eq!(details.lines().count(), 200);
    let line = std::fs::read_to_string(&o.output_file).expect("output file");
    let v: serde_json::Value =
        serde_json::from_str(line.lines().last().expect("a line").replace("Infinity", "null").as_str()).expect("json");
    assert_eq!(v["failed"], 200);
    assert!(v["server_down_at_s"].as_f64().is_some());
    assert_eq!(v["in_flight_at_server_down"], 200);
}

#[tokio::test]
async fn requests_after_death_are_not_sent() {
    // Requests arrive 20 ms apart; the server dies at the 5th. The monitor sees refused
    // connections and the rest are never sent.
    let server = start(MockScript { die_after: Some(4), ..Default::default() }).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let o = bench(&server, dir.path(), &["--num-prompts", "40", "--request-rate", "50", "--burstiness", "1000"])
        .await
        .expect("run");
    assert_eq!(o.exit_code, exit::SERVER_DOWN);
    assert_eq!(o.metrics.completed, 4);
    let down = o.summary.server_down.clone().expect("down");
    assert!(down.not_sent > 20, "{down:?}");
    assert_eq!(o.metrics.errors_by_cause.get("not sent (server down)"), Some(&down.not_sent));
    assert!(server.received() < 10);
}

#[tokio::test]
async fn jsonl_line_has_sglang_keys_in_order_then_ours() {
    let server = start(MockScript::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let o = bench(&server, dir.path(), &["--tag", "t1", "--output-details"]).await.expect("run");
    let text = std::fs::read_to_string(&o.output_file).expect("output");
    let line = text.lines().last().expect("line");
    assert!(line.contains("\"request_rate\": Infinity"), "Python's json.dumps spelling");
    let v: serde_json::Value = serde_json::from_str(&line.replace("Infinity", "null")).expect("json");
    let obj = v.as_object().expect("object");
    let names: Vec<&str> = obj.keys().map(String::as_str).collect();
    let sglang = [
        "tag",
        "backend",
        "dataset_name",
        "request_rate",
        "max_concurrency",
        "sharegpt_output_len",
        "random_input_len",
        "random_output_len",
        "random_range_ratio",
        "server_info",
        "duration",
        "completed",
        "total_input_tokens",
        "total_input_text_tokens",
        "total_input_vision_tokens",
        "total_output_tokens",
        "total_output_tokens_retokenized",
        "request_throughput",
        "input_throughput",
        "output_throughput",
        "total_throughput",
        "mean_e2e_latency_ms",
        "median_e2e_latency_ms",
        "std_e2e_latency_ms",
        "p90_e2e_latency_ms",
        "p95_e2e_latency_ms",
        "p99_e2e_latency_ms",
        "mean_ttft_ms",
        "median_ttft_ms",
        "std_ttft_ms",
        "p90_ttft_ms",
        "p95_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "median_tpot_ms",
        "std_tpot_ms",
        "p90_tpot_ms",
        "p95_tpot_ms",
        "p99_tpot_ms",
        "mean_itl_ms",
        "median_itl_ms",
        "std_itl_ms",
        "p90_itl_ms",
        "p95_itl_ms",
        "p99_itl_ms",
        "concurrency",
        "accept_length",
        "max_output_tokens_per_s",
        "max_concurrent_requests",
    ];
    assert_eq!(&names[..sglang.len()], &sglang[..]);
    for k in [
        "failed",
        "errors_by_cause",
        "send_lag_ms_p50",
        "input_lens",
        "output_lens",
        "ttfts",
        "itls",
        "generated_texts",
        "errors",
    ] {
        assert!(obj.contains_key(k), "{k}");
    }
    assert_eq!(v["tag"], "t1");
    assert_eq!(v["completed"], 10);
    assert_eq!(v["server_info"]["mock"], true);
    assert_eq!(v["output_lens"].as_array().map(Vec::len), Some(10));

    let o = bench(&server, dir.path(), &["--strict-json"]).await.expect("run");
    let text = std::fs::read_to_string(&o.output_file).expect("output");
    let last = text.lines().last().expect("line");
    let v: serde_json::Value = serde_json::from_str(last).expect("--strict-json writes valid JSON");
    assert!(v["request_rate"].is_null());
}

#[tokio::test]
async fn custom_dataset_and_concurrency_limit() {
    let server = start(MockScript { chunk_delay_ms: 10, ..Default::default() }).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = fixture("prompts.jsonl");
    let o = bench(
        &server,
        dir.path(),
        &[
            "--dataset-name",
            "custom",
            "--dataset-path",
            path.to_str().expect("utf8"),
            "--num-prompts",
            "8",
            "--max-concurrency",
            "2",
        ],
    )
    .await
    .expect("run");
    assert_eq!(o.metrics.completed, 8);
    let lens: Vec<u64> = o.records.iter().map(|r| r.prompt_len).collect();
    assert_eq!(lens, vec![9, 18, 27, 36, 45, 54, 63, 72]);
    let outs: Vec<u64> = o.records.iter().map(|r| r.output_tokens).collect();
    assert_eq!(outs, vec![4, 5, 6, 4, 5, 6, 4, 5]);
    assert_eq!(o.metrics.max_concurrent_requests, 2);
    assert!(o.metrics.queue_wait_ms.max > 0.0, "later requests waited for a slot");
}
