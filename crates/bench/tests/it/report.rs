//! Metric math on a fixed trace, against values computed by hand, and the printed block
//! against the golden that `scripts/goldens/bench_block_golden.py` prints with numpy and SGLang's
//! own format strings.

use sparrow_bench::metrics;
use sparrow_bench::record::{Chunk, Failure, FailureKind, RequestRecord, TokenCountSource};
use sparrow_bench::report::{render_block, RunSummary};

/// The trace of `scripts/goldens/bench_block_golden.py`: (sent, chunks (t, tokens), end, prompt_len,
/// failed). Run duration 10 s.
fn fixed_trace() -> Vec<RequestRecord> {
    let rec = |index, sent: f64, chunks: &[(f64, u64)], end, prompt_len, failed: bool| RequestRecord {
        index,
        turn: None,
        prompt_len,
        requested_output_len: 128,
        scheduled_s: sent,
        dispatched_s: sent,
        sent_s: sent,
        first_byte_s: Some(sent),
        chunks: chunks.iter().map(|&(t, n)| Chunk { t, tokens: Some(n) }).collect(),
        end_s: end,
        output_tokens: if failed { 0 } else { chunks.iter().map(|c| c.1).sum() },
        output_tokens_source: TokenCountSource::Server,
        finish_reason: None,
        text: String::new(),
        failure: failed.then(|| Failure { kind: FailureKind::Http(500), message: "boom".into() }),
        retries: 0,
    };
    vec![
        rec(0, 0.0, &[(0.5, 1), (0.7, 1), (1.0, 1)], 1.1, 10, false),
        rec(1, 1.0, &[(1.2, 1), (1.6, 2)], 1.6, 20, false),
        rec(2, 0.5, &[], 0.6, 30, true),
        rec(3, 2.0, &[(2.3, 1)], 2.4, 5, false),
    ]
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

#[test]
fn hand_computed_metrics() {
    let trace = fixed_trace();
    // Retokenizing is not what this trace is about: count one token per request.
    let m = metrics::calculate(&trace, 10.0, |_| 1);
    assert_eq!((m.completed, m.failed), (3, 1));
    assert_eq!(m.errors_by_cause.get("HTTP 500"), Some(&1));
    assert_eq!((m.total_input, m.total_output, m.total_output_retokenized), (35, 7, 3));
    assert!(close(m.request_throughput, 0.3));
    assert!(close(m.output_throughput, 0.7));
    assert!(close(m.total_throughput, 4.2));
    // Σ E2E = 1.1 + 0.6 + 0.4 s over 10 s.
    assert!(close(m.concurrency, 0.21));
    // TTFT 500, 200, 300 ms: mean 333.33; sorted [200, 300, 500]; P99 rank 1.98 → 300 + 0.98·200.
    assert!(close(m.ttft_ms.mean, 1000.0 / 3.0));
    assert!(close(m.ttft_ms.median, 300.0));
    assert!(close(m.ttft_ms.p99, 496.0));
    assert!(close(m.ttft_ms.p90, 460.0));
    // Population std: deviations 166.67, −133.33, −33.33 → sqrt(46666.67 / 3).
    assert!(close(m.ttft_ms.std, (140_000.0f64 / 9.0).sqrt()));
    // TPOT (1.1 − 0.5)/2 = 300 ms, (0.6 − 0.2)/2 = 200 ms; the 1-token request has none.
    assert!(close(m.tpot_ms.mean, 250.0));
    assert!(close(m.tpot_ms.p99, 299.0));
    // ITL: 200, 300 (request 0); the 2-token chunk of request 1 splits 400 ms into 200, 200.
    assert!(close(m.itl_ms.mean, 225.0));
    assert!(close(m.itl_ms.median, 200.0));
    assert!(close(m.itl_ms.p95, 285.0));
    assert!(close(m.itl_ms.max, 300.0));
    assert!(m.itl_per_token);
    // Second 1 holds 1 token of request 0 and 1 + 2 of request 1.
    assert!(close(m.max_output_tokens_per_s, 4.0));
    // Requests 0 [0, 1.1] and 1 [1.0, 1.6] overlap; the failed one is not counted.
    assert_eq!(m.max_concurrent_requests, 2);
    for r in trace.iter().filter(|r| r.success()) {
        let (itl, _) = r.itl();
        let last = r.chunks.last().map_or(0.0, |c| c.t);
        assert!(close(r.ttft().unwrap_or(0.0) + itl.iter().sum::<f64>(), last - r.sent_s));
    }
}

#[test]
fn back_to_back_requests_do_not_overlap() {
    let mut t = fixed_trace();
    t.truncate(2);
    t[1].sent_s = 1.1;
    let m = metrics::calculate(&t, 10.0, |_| 0);
    assert_eq!(m.max_concurrent_requests, 1);
}

#[test]
fn block_matches_sglang_format_byte_for_byte() {
    let trace = fixed_trace();
    let m = metrics::calculate(&trace, 10.0, |_| 0);
    // The golden's retokenized count equals the server count (7).
    let m = metrics::BenchmarkMetrics { total_output_retokenized: 7, ..m };
    let summary = RunSummary {
        backend: "sglang".into(),
        dataset_name: "random".into(),
        request_rate: f64::INFINITY,
        request_rate_trace: false,
        goodput: None,
        max_concurrency: None,
        sharegpt_output_len: None,
        random_input_len: 256,
        random_output_len: 128,
        random_range_ratio: 0.0,
        tag: None,
        duration_s: 10.0,
        server_info: None,
        server_down: None,
        interrupted: None,
        client: None,
    };
    let golden = include_str!("../fixtures/report_block.txt");
    assert_eq!(render_block(&summary, &m), golden);
    // A speculating server's accept length (SGLang's `internal_states[0].avg_spec_accept_length`)
    // is printed after `Concurrency:`, as SGLang's bench_serving prints it; 0 is not printed.
    for (v, line) in [(2.345, Some("Accept length:                           2.35      \n")), (0.0, None)] {
        let info = serde_json::json!({"internal_states": [{"avg_spec_accept_length": v}]});
        let s = RunSummary { server_info: Some(info), ..summary.clone() };
        let block = render_block(&s, &m);
        match line {
            Some(l) => {
                let at =
                    golden.find("Concurrency:").and_then(|i| golden[i..].find('\n').map(|j| i + j + 1)).expect("line");
                assert_eq!(block, format!("{}{l}{}", &golden[..at], &golden[at..]));
            }
            None => assert_eq!(block, golden),
        }
        // The result line has it once, where SGLang's has `accept_length` (null without).
        let pairs = sparrow_bench::report::result_pairs(&s, &m);
        let got: Vec<_> = pairs.iter().filter(|(k, _)| k == "accept_length").map(|(_, v)| v.clone()).collect();
        let want = if v > 0.0 { sparrow_bench::report::JVal::Float(v) } else { serde_json::Value::Null.into() };
        assert_eq!(got, vec![want]);
    }
}

#[test]
fn trailing_chunk_without_new_tokens_keeps_ttft_plus_itl_whole() {
    let mut r = fixed_trace().remove(0);
    r.chunks =
        vec![Chunk { t: 0.5, tokens: Some(1) }, Chunk { t: 0.8, tokens: Some(1) }, Chunk { t: 1.0, tokens: Some(0) }];
    let (itl, per_token) = r.itl();
    assert!(per_token);
    assert_eq!(itl.len(), 1, "one token after the first");
    assert!(close(itl[0], 0.5), "the flush's 0.2 s goes to the last token: {itl:?}");
    assert!(close(r.ttft().unwrap_or(0.0) + itl[0], 1.0 - r.sent_s));
}
