//! The printed result block and the JSONL result line.
//!
//! The block reproduces SGLang's (`python/sglang/benchmark/serving.py`, `benchmark()`): the
//! same labels in the same order, `"{:<40} {:<10}"` / `"{:<40} {:<10.2f}"` columns, 50-wide
//! separators. Sparrow adds `Failed requests:` after `Successful requests:` (and
//! `Retried on a fresh connection:` when a request was), a line when output counts had to be
//! estimated, and, when anything failed, a `Failures` section with
//! one line per cause and what is known of a server that stopped answering.
//!
//! The JSONL line has SGLang's keys in SGLang's order (written as Python's `json.dumps`
//! writes them: `", "` and `": "` separators, `Infinity` for an infinite request rate unless
//! `strict_json`), followed by Sparrow's own keys.

use std::fmt::Write as _;

use serde_json::Value;
use sparrow_tokenizer::pyjson::{dumps, dumps_float as py_json_float, DumpsOptions};

use crate::metrics::{BenchmarkMetrics, Distribution};

/// When and how the server was seen to stop answering.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerDown {
    /// Seconds since the run start when the first sign appeared.
    pub at_s: f64,
    /// Requests sent and not finished at that moment.
    pub in_flight: usize,
    /// Requests never sent because of it.
    pub not_sent: usize,
    /// What was seen (e.g. `health probe: connection refused`).
    pub reason: String,
}

/// Which client of a multi-client run wrote a result line (`--client-index`,
/// `--client-count`, `--start-at`); for a merged report, `index` is `None`.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientInfo {
    /// `--client-index`; `None` in a merged line.
    pub index: Option<usize>,
    /// `--client-count`.
    pub count: usize,
    /// `--start-at`, unix seconds.
    pub start_at: Option<f64>,
    /// This client's share of the run's `--max-concurrency`.
    pub max_concurrency: Option<usize>,
    /// The tokenizer the client counted with (so a merge re-tokenizes outputs as it did).
    pub tokenizer: Option<std::path::PathBuf>,
}

/// The run-level facts the report shows besides the metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// `--backend`.
    pub backend: String,
    /// `--dataset-name`.
    pub dataset_name: String,
    /// `--request-rate` (req/s; infinite means all at once).
    pub request_rate: f64,
    /// Requests were sent at a trace's timestamps (`mooncake`): the rate shows as `trace`.
    pub request_rate_trace: bool,
    /// `--goodput` figures, when SLOs were given.
    pub goodput: Option<crate::metrics::Goodput>,
    /// `--max-concurrency`.
    pub max_concurrency: Option<usize>,
    /// `--sharegpt-output-len`.
    pub sharegpt_output_len: Option<u64>,
    /// `--random-input-len`.
    pub random_input_len: u64,
    /// `--random-output-len`.
    pub random_output_len: u64,
    /// `--random-range-ratio`.
    pub random_range_ratio: f64,
    /// `--tag`.
    pub tag: Option<String>,
    /// Wall time of the run, seconds.
    pub duration_s: f64,
    /// The server's `/server_info` (or `/get_server_info`) JSON, when it answered.
    pub server_info: Option<Value>,
    /// Set when the server stopped answering during the run.
    pub server_down: Option<ServerDown>,
    /// Set when the run was cut short by a signal.
    pub interrupted: Option<String>,
    /// Set for one client of several, or a merged report.
    pub client: Option<ClientInfo>,
}

/// Python's `str(float)`: `inf`, `nan`, `16.0` for whole numbers, shortest round-trip
/// digits otherwise.
pub fn py_float(x: f64) -> String {
    if x.is_nan() {
        "nan".into()
    } else if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.into()
    } else if x == x.trunc() && x.abs() < 1e16 {
        format!("{x:.1}")
    } else {
        format!("{x}")
    }
}

/// Python's `format(x, "g")` for the SLO values people type (`500`, `0.5`, `12.25`).
fn py_g(x: f64) -> String {
    if x == x.trunc() && x.abs() < 1e6 {
        format!("{x:.0}")
    } else {
        let s = format!("{x:.6}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

fn line_s(out: &mut String, label: &str, v: impl std::fmt::Display) {
    let _ = writeln!(out, "{:<40} {:<10}", label, v.to_string());
}

fn line_f(out: &mut String, label: &str, v: f64) {
    let _ = writeln!(out, "{:<40} {:<10}", label, format!("{v:.2}"));
}

fn section(out: &mut String, title: &str) {
    let _ = writeln!(out, "{title:-^50}");
}

fn dist(out: &mut String, name: &str, d: &Distribution, with_max: bool) {
    line_f(out, &format!("Mean {name} (ms):"), d.mean);
    line_f(out, &format!("Median {name} (ms):"), d.median);
    line_f(out, &format!("P90 {name} (ms):"), d.p90);
    line_f(out, &format!("P95 {name} (ms):"), d.p95);
    line_f(out, &format!("P99 {name} (ms):"), d.p99);
    if with_max {
        line_f(out, &format!("Max {name} (ms):"), d.max);
    }
}

/// The result block, starting with a blank line as SGLang's does.
pub fn render_block(s: &RunSummary, m: &BenchmarkMetrics) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "\n{:=^50}", " Serving Benchmark Result ");
    line_s(&mut o, "Backend:", &s.backend);
    if s.request_rate_trace {
        line_s(&mut o, "Traffic request rate:", "trace");
    } else {
        line_s(&mut o, "Traffic request rate:", py_float(s.request_rate));
    }
    match s.max_concurrency {
        Some(c) => line_s(&mut o, "Max request concurrency:", c),
        None => line_s(&mut o, "Max request concurrency:", "not set"),
    }
    match &s.client {
        Some(ClientInfo { index: Some(i), count, .. }) => line_s(&mut o, "Client:", format!("{i} of {count}")),
        Some(ClientInfo { index: None, count, .. }) => line_s(&mut o, "Clients merged:", count),
        None => {}
    }
    line_s(&mut o, "Successful requests:", m.completed);
    line_s(&mut o, "Failed requests:", m.failed);
    if m.retried_requests > 0 {
        line_s(&mut o, "Retried on a fresh connection:", m.retried_requests);
    }
    line_f(&mut o, "Benchmark duration (s):", s.duration_s);
    line_s(&mut o, "Total input tokens:", m.total_input);
    line_s(&mut o, "Total input text tokens:", m.total_input);
    line_s(&mut o, "Total generated tokens:", m.total_output);
    line_s(&mut o, "Total generated tokens (retokenized):", m.total_output_retokenized);
    if m.estimated_output_requests > 0 {
        line_s(&mut o, "Requests with estimated output tokens:", m.estimated_output_requests);
    }
    line_f(&mut o, "Request throughput (req/s):", m.request_throughput);
    line_f(&mut o, "Input token throughput (tok/s):", m.input_throughput);
    line_f(&mut o, "Output token throughput (tok/s):", m.output_throughput);
    line_f(&mut o, "Peak output token throughput (tok/s):", m.max_output_tokens_per_s);
    line_s(&mut o, "Peak concurrent requests:", m.max_concurrent_requests);
    line_f(&mut o, "Total token throughput (tok/s):", m.total_throughput);
    line_f(&mut o, "Concurrency:", m.concurrency);
    if let Some(a) = accept_length(s) {
        line_f(&mut o, "Accept length:", a);
    }
    if let Some(g) = &s.goodput {
        section(&mut o, "Goodput");
        let slos: Vec<String> = g.slos_ms.iter().map(|(k, v)| format!("{k}:{}", py_g(*v))).collect();
        line_s(&mut o, "SLOs (ms):", slos.join(" "));
        line_f(&mut o, "Request goodput (req/s):", g.request_goodput);
        line_f(&mut o, "SLO attainment (%):", g.slo_attainment * 100.0);
        for (k, a) in &g.slo_attainment_by_metric {
            line_f(&mut o, &format!("{} SLO attainment (%):", k.to_uppercase()), a * 100.0);
        }
    }
    section(&mut o, "End-to-End Latency");
    dist(&mut o, "E2E Latency", &m.e2e_ms, false);
    section(&mut o, "Time to First Token");
    dist(&mut o, "TTFT", &m.ttft_ms, false);
    section(&mut o, "Time per Output Token (excl. 1st token)");
    dist(&mut o, "TPOT", &m.tpot_ms, false);
    if m.itl_per_token {
        section(&mut o, "Inter-Token Latency");
    } else {
        section(&mut o, "Inter-Token Latency (per chunk)");
    }
    dist(&mut o, "ITL", &m.itl_ms, true);
    if m.failed > 0 || s.server_down.is_some() || s.interrupted.is_some() {
        section(&mut o, "Failures");
        for (cause, n) in &m.errors_by_cause {
            line_s(&mut o, &format!("  {cause}:"), n);
        }
        if let Some(d) = &s.server_down {
            line_f(&mut o, "Server stopped answering at (s):", d.at_s);
            line_s(&mut o, "Requests in flight then:", d.in_flight);
            line_s(&mut o, "Requests never sent:", d.not_sent);
            let _ = writeln!(o, "Server down: {}", d.reason);
        }
        if let Some(why) = &s.interrupted {
            let _ = writeln!(o, "Run interrupted: {why}");
        }
    }
    let _ = writeln!(o, "{}", "=".repeat(50));
    o
}

/// The speculative-decoding accept length the server reports, as SGLang's `bench_serving`
/// reads it: `internal_states[0].avg_spec_accept_length` of `/get_server_info` (tokens per
/// verify step since the server started), when present and positive.
pub fn accept_length(s: &RunSummary) -> Option<f64> {
    let v = s.server_info.as_ref()?.get("internal_states")?.get(0)?.get("avg_spec_accept_length")?.as_f64()?;
    (v > 0.0).then_some(v)
}

/// A JSON value for the result line; floats are kept apart so infinity can be written the
/// way Python writes it.
#[derive(Debug, Clone, PartialEq)]
pub enum JVal {
    /// Any JSON value.
    Json(Value),
    /// A float that may be non-finite.
    Float(f64),
}

impl JVal {
    /// As a standard JSON value: a non-finite float becomes `null`.
    pub fn to_value(&self) -> Value {
        match self {
            JVal::Json(v) => v.clone(),
            JVal::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        }
    }
}

impl From<Value> for JVal {
    fn from(v: Value) -> Self {
        JVal::Json(v)
    }
}

/// The ordered key/value pairs of the JSONL result line.
pub fn result_pairs(s: &RunSummary, m: &BenchmarkMetrics) -> Vec<(String, JVal)> {
    use serde_json::json;
    let mut v: Vec<(String, JVal)> = Vec::new();
    let mut put = |k: &str, x: JVal| v.push((k.to_owned(), x));
    put("tag", json!(s.tag).into());
    put("backend", json!(s.backend).into());
    put("dataset_name", json!(s.dataset_name).into());
    if s.request_rate_trace {
        put("request_rate", json!("trace").into());
    } else {
        put("request_rate", JVal::Float(s.request_rate));
    }
    put("max_concurrency", json!(s.max_concurrency).into());
    put("sharegpt_output_len", json!(s.sharegpt_output_len).into());
    put("random_input_len", json!(s.random_input_len).into());
    put("random_output_len", json!(s.random_output_len).into());
    put("random_range_ratio", JVal::Float(s.random_range_ratio));
    put("server_info", s.server_info.clone().unwrap_or(Value::Null).into());
    put("duration", JVal::Float(s.duration_s));
    put("completed", json!(m.completed).into());
    put("total_input_tokens", json!(m.total_input).into());
    put("total_input_text_tokens", json!(m.total_input).into());
    put("total_input_vision_tokens", json!(0).into());
    put("total_output_tokens", json!(m.total_output).into());
    put("total_output_tokens_retokenized", json!(m.total_output_retokenized).into());
    put("request_throughput", JVal::Float(m.request_throughput));
    put("input_throughput", JVal::Float(m.input_throughput));
    put("output_throughput", JVal::Float(m.output_throughput));
    put("total_throughput", JVal::Float(m.total_throughput));
    for (name, d) in [("e2e_latency", &m.e2e_ms), ("ttft", &m.ttft_ms), ("tpot", &m.tpot_ms), ("itl", &m.itl_ms)] {
        put(&format!("mean_{name}_ms"), JVal::Float(d.mean));
        put(&format!("median_{name}_ms"), JVal::Float(d.median));
        put(&format!("std_{name}_ms"), JVal::Float(d.std));
        put(&format!("p90_{name}_ms"), JVal::Float(d.p90));
        put(&format!("p95_{name}_ms"), JVal::Float(d.p95));
        put(&format!("p99_{name}_ms"), JVal::Float(d.p99));
    }
    put("concurrency", JVal::Float(m.concurrency));
    put("accept_length", accept_length(s).map_or(Value::Null.into(), JVal::Float));
    put("max_output_tokens_per_s", JVal::Float(m.max_output_tokens_per_s));
    put("max_concurrent_requests", json!(m.max_concurrent_requests).into());
    if let Some(g) = &s.goodput {
        let obj = |pairs: &[(String, f64)]| {
            Value::Object(pairs.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>())
        };
        put("goodput_slos_ms", obj(&g.slos_ms).into());
        put("request_goodput", JVal::Float(g.request_goodput));
        put("slo_attainment", JVal::Float(g.slo_attainment));
        put("slo_attainment_by_metric", obj(&g.slo_attainment_by_metric).into());
    }
    // Sparrow's own keys.
    put("max_itl_ms", JVal::Float(m.itl_ms.max));
    put("itl_per_token", json!(m.itl_per_token).into());
    put("failed", json!(m.failed).into());
    put("errors_by_cause", json!(m.errors_by_cause).into());
    put("retried_requests", json!(m.retried_requests).into());
    put("output_tokens_estimated_requests", json!(m.estimated_output_requests).into());
    put("send_lag_ms_p50", JVal::Float(m.send_lag_ms.median));
    put("send_lag_ms_p99", JVal::Float(m.send_lag_ms.p99));
    put("send_lag_ms_max", JVal::Float(m.send_lag_ms.max));
    put("queue_wait_ms_mean", JVal::Float(m.queue_wait_ms.mean));
    put("server_down_at_s", s.server_down.as_ref().map_or(JVal::Json(Value::Null), |d| JVal::Float(d.at_s)));
    put("in_flight_at_server_down", json!(s.server_down.as_ref().map(|d| d.in_flight)).into());
    put("server_down_reason", json!(s.server_down.as_ref().map(|d| d.reason.clone())).into());
    put("interrupted", json!(s.interrupted).into());
    if let Some(c) = &s.client {
        put("client_index", json!(c.index).into());
        put("client_count", json!(c.count).into());
        put("start_at", c.start_at.map_or(JVal::Json(Value::Null), JVal::Float));
        if c.index.is_some() {
            put("client_max_concurrency", json!(c.max_concurrency).into());
        }
        put("tokenizer", json!(c.tokenizer).into());
    }
    v
}

/// The JSONL line's `json.dumps` settings: Python's separators, strings written as UTF-8.
const LINE: DumpsOptions = DumpsOptions { ensure_ascii: false, ..DumpsOptions::PYTHON };

/// One JSON object line (no trailing newline) from ordered pairs. Non-finite floats are
/// written `Infinity`/`NaN` as Python does, or `null` when `strict`.
pub fn to_json_line(pairs: &[(String, JVal)], strict: bool) -> String {
    let mut o = String::from("{");
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            o.push_str(", ");
        }
        o.push_str(&dumps(&Value::String(k.clone()), &LINE));
        o.push_str(": ");
        match v {
            JVal::Json(j) => o.push_str(&dumps(j, &LINE)),
            JVal::Float(x) => o.push_str(&py_json_float(*x, strict)),
        }
    }
    o.push('}');
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_forms() {
        assert_eq!(py_float(f64::INFINITY), "inf");
        assert_eq!(py_float(16.0), "16.0");
        assert_eq!(py_float(2.5), "2.5");
        assert_eq!(py_json_float(f64::INFINITY, false), "Infinity");
        assert_eq!(py_json_float(f64::INFINITY, true), "null");
        assert_eq!(py_json_float(1.0, false), "1.0");
        assert_eq!(py_json_float(1e-7, false), "1e-07");
        assert_eq!(py_json_float(1.5e20, false), "1.5e+20");
    }

    #[test]
    fn json_line_is_python_shaped() {
        let pairs = vec![
            ("a".to_owned(), JVal::Float(f64::INFINITY)),
            ("b".to_owned(), JVal::Json(serde_json::json!({"x": [1, 2], "y": null}))),
        ];
        assert_eq!(to_json_line(&pairs, false), r#"{"a": Infinity, "b": {"x": [1, 2], "y": null}}"#);
        assert_eq!(to_json_line(&pairs, true), r#"{"a": null, "b": {"x": [1, 2], "y": null}}"#);
    }
}
