//! Metric math over a run's request records. Every figure in the report is defined here once.
//!
//! Definitions follow SGLang's `calculate_metrics` (`python/sglang/benchmark/serving.py`):
//! means, medians and percentiles over successful requests only, numpy's default (linear)
//! percentile interpolation, population standard deviation. Where SGLang's figure is wrong we
//! keep its name and fix the value, and say so on the field:
//! - output token counts come from server usage, or an estimate flagged as such, never from
//!   the requested length;
//! - peak concurrent requests is the exact maximum of overlapping requests, not a per-second
//!   bucket count (which counts a request in every second it touches and so exceeds
//!   `--max-concurrency`);
//! - peak output throughput buckets tokens, not SSE chunks.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::record::{RequestRecord, TokenCountSource};

/// Percentile `q` (0..=100) of `xs` with linear interpolation between closest ranks, as
/// `numpy.percentile(xs, q)` with its default `method="linear"`: rank `h = (n-1)·q/100`,
/// value `x[floor h] + (h - floor h)·(x[floor h + 1] - x[floor h])` on sorted `xs`.
/// Returns 0 for an empty slice (SGLang computes over `xs or 0`).
pub fn percentile(xs: &[f64], q: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    percentile_sorted(&v, q)
}

/// [`percentile`] of an already sorted slice.
fn percentile_sorted(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let h = (v.len() - 1) as f64 * q / 100.0;
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(v.len() - 1);
    v[lo] + (h - lo as f64) * (v[hi] - v[lo])
}

/// Arithmetic mean; 0 for an empty slice.
pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// Population standard deviation (`numpy.std`, `ddof=0`); 0 for an empty slice.
pub fn std_dev(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let m = mean(xs);
    (xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / xs.len() as f64).sqrt()
}

/// Mean, median, std and percentiles of one latency distribution, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Distribution {
    /// Mean.
    pub mean: f64,
    /// Median (the 50th percentile).
    pub median: f64,
    /// Population standard deviation.
    pub std: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest value.
    pub max: f64,
}

impl Distribution {
    /// Summarises `seconds`, reporting milliseconds.
    pub fn from_seconds(seconds: &[f64]) -> Self {
        // Sorted once for every percentile (ITL lists hold one entry per token of the run).
        let mut ms: Vec<f64> = seconds.iter().map(|s| s * 1000.0).collect();
        ms.sort_by(f64::total_cmp);
        Distribution {
            mean: mean(&ms),
            median: percentile_sorted(&ms, 50.0),
            std: std_dev(&ms),
            p90: percentile_sorted(&ms, 90.0),
            p95: percentile_sorted(&ms, 95.0),
            p99: percentile_sorted(&ms, 99.0),
            max: ms.last().copied().unwrap_or(0.0).max(0.0),
        }
    }
}

/// The figures of one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BenchmarkMetrics {
    /// Successful requests.
    pub completed: usize,
    /// Failed requests (every cause, including not sent).
    pub failed: usize,
    /// Failed requests by cause label.
    pub errors_by_cause: BTreeMap<String, usize>,
    /// Requests sent a second time on a fresh connection after theirs closed at once, before
    /// any response byte (succeeded or not; [`RequestRecord::retries`]).
    pub retried_requests: usize,
    /// Prompt tokens of successful requests.
    pub total_input: u64,
    /// Output tokens of successful requests (server usage, or estimates where none came).
    pub total_output: u64,
    /// Output tokens counted by re-tokenizing the received text.
    pub total_output_retokenized: u64,
    /// Successful requests whose output count is a client-side estimate (no usage).
    pub estimated_output_requests: usize,
    /// `completed / duration`.
    pub request_throughput: f64,
    /// `total_input / duration`.
    pub input_throughput: f64,
    /// `total_output / duration`.
    pub output_throughput: f64,
    /// `(total_input + total_output) / duration`.
    pub total_throughput: f64,
    /// Most output tokens received within one whole second of the run (seconds counted from
    /// the run start).
    pub max_output_tokens_per_s: f64,
    /// Most requests in flight (sent, not finished) at any instant.
    pub max_concurrent_requests: usize,
    /// Average requests in flight: `sum(E2E) / duration` (Little's law).
    pub concurrency: f64,
    /// End-to-end latency, ms.
    pub e2e_ms: Distribution,
    /// Time to first token, ms.
    pub ttft_ms: Distribution,
    /// Time per output token after the first, ms.
    pub tpot_ms: Distribution,
    /// Inter-token latency, ms.
    pub itl_ms: Distribution,
    /// True when every ITL entry is per token; false when at least one request only told
    /// chunk boundaries, so ITL is per chunk.
    pub itl_per_token: bool,
    /// Client send lag (dispatch minus schedule), ms, over every request that was dispatched.
    pub send_lag_ms: Distribution,
    /// Wait for a `--max-concurrency` slot, ms.
    pub queue_wait_ms: Distribution,
}

/// Computes a run's figures from its records. `duration_s` is the run's wall time.
///
/// `retokenize` counts the tokens of a generated text (for "Total generated tokens
/// (retokenized)"); it is called once per successful request.
pub fn calculate(
    records: &[RequestRecord],
    duration_s: f64,
    mut retokenize: impl FnMut(&str) -> u64,
) -> BenchmarkMetrics {
    let mut m = BenchmarkMetrics { itl_per_token: true, ..Default::default() };
    let (mut ttfts, mut tpots, mut itls, mut e2es) = (vec![], vec![], vec![], vec![]);
    let (mut lags, mut waits) = (vec![], vec![]);
    let mut token_buckets: BTreeMap<i64, f64> = BTreeMap::new();
    let mut events: Vec<(f64, i32)> = Vec::new();
    for r in records {
        m.retried_requests += usize::from(r.retries > 0);
        if r.dispatched_s >= 0.0 {
            lags.push((r.dispatched_s - r.scheduled_s).max(0.0));
            waits.push((r.sent_s - r.dispatched_s).max(0.0));
        }
        let Some(failure) = &r.failure else {
            m.completed += 1;
            m.total_input += r.prompt_len;
            m.total_output += r.output_tokens;
            m.total_output_retokenized += retokenize(&r.text);
            if r.output_tokens_source == TokenCountSource::Estimated {
                m.estimated_output_requests += 1;
            }
            if let Some(t) = r.ttft() {
                ttfts.push(t);
            }
            if let Some(t) = r.tpot() {
                tpots.push(t);
            }
            let (itl, per_token) = r.itl();
            m.itl_per_token &= per_token;
            itls.extend(itl);
            e2es.push(r.e2e());
            for (t, n) in r.token_arrivals() {
                *token_buckets.entry(t.floor() as i64).or_default() += n;
            }
            events.push((r.sent_s, 1));
            events.push((r.end_s, -1));
            continue;
        };
        m.failed += 1;
        *m.errors_by_cause.entry(failure.kind.label()).or_default() += 1;
    }
    // Ends sort before starts at the same instant: back-to-back requests do not overlap.
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut live = 0i64;
    for (_, d) in events {
        live += i64::from(d);
        m.max_concurrent_requests = m.max_concurrent_requests.max(live as usize);
    }
    m.max_output_tokens_per_s = token_buckets.values().copied().fold(0.0, f64::max);
    if duration_s > 0.0 {
        m.request_throughput = m.completed as f64 / duration_s;
        m.input_throughput = m.total_input as f64 / duration_s;
        m.output_throughput = m.total_output as f64 / duration_s;
        m.total_throughput = (m.total_input + m.total_output) as f64 / duration_s;
        m.concurrency = e2es.iter().sum::<f64>() / duration_s;
    }
    m.e2e_ms = Distribution::from_seconds(&e2es);
    m.ttft_ms = Distribution::from_seconds(&ttfts);
    m.tpot_ms = Distribution::from_seconds(&tpots);
    m.itl_ms = Distribution::from_seconds(&itls);
    m.send_lag_ms = Distribution::from_seconds(&lags);
    m.queue_wait_ms = Distribution::from_seconds(&waits);
    m
}

/// `--goodput` figures (SGLang's `sglang/benchmark/goodput.py`, `calculate_goodput`).
#[derive(Debug, Clone, PartialEq)]
pub struct Goodput {
    /// The SLOs, `(key, ms)`, in the order given.
    pub slos_ms: Vec<(String, f64)>,
    /// Good requests per second of the run.
    pub request_goodput: f64,
    /// Good requests over all requests (failed ones included).
    pub slo_attainment: f64,
    /// Per SLO, the share of all requests that met it.
    pub slo_attainment_by_metric: Vec<(String, f64)>,
}

/// Goodput of a run: a request is good when it succeeded and met every SLO. TPOT is
/// `(E2E − TTFT) / (tokens − 1)`, 0 for a one-token answer; a repeated key keeps its last
/// value (as SGLang's `dict()` of the pairs does).
pub fn goodput(records: &[RequestRecord], slos: &[(crate::args::SloMetric, f64)], duration_s: f64) -> Goodput {
    use crate::args::SloMetric;
    let mut uniq: Vec<(SloMetric, f64)> = Vec::new();
    for &(m, v) in slos {
        match uniq.iter_mut().find(|(k, _)| *k == m) {
            Some(e) => e.1 = v,
            None => uniq.push((m, v)),
        }
    }
    let mut good = 0usize;
    let mut met = vec![0usize; uniq.len()];
    for r in records.iter().filter(|r| r.success()) {
        let e2e = r.e2e();
        let ttft = r.ttft().unwrap_or(e2e);
        let tpot = if r.output_tokens > 1 { (e2e - ttft) / (r.output_tokens - 1) as f64 } else { 0.0 };
        let mut all = true;
        for (i, (m, slo)) in uniq.iter().enumerate() {
            let observed_ms = 1000.0
                * match m {
                    SloMetric::Ttft => ttft,
                    SloMetric::Tpot => tpot,
                    SloMetric::E2el => e2e,
                };
            if observed_ms <= *slo {
                met[i] += 1;
            } else {
                all = false;
            }
        }
        good += usize::from(all);
    }
    let n = records.len().max(1) as f64;
    Goodput {
        slos_ms: uniq.iter().map(|(m, v)| (m.name().to_owned(), *v)).collect(),
        request_goodput: if duration_s > 0.0 { good as f64 / duration_s } else { 0.0 },
        slo_attainment: good as f64 / n,
        slo_attainment_by_metric: uniq
            .iter()
            .zip(&met)
            .map(|((m, _), c)| (m.name().to_owned(), *c as f64 / n))
            .collect(),
    }
}
