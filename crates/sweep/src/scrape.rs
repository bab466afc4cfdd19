//! The server seen from outside while a step runs, once a second: its Prometheus `/metrics`
//! (SGLang's `sglang:*`, vLLM's `vllm:*`, llama-server's `llamacpp:*` and our `sparrow:*`
//! names, read into one set of gauges), the host's CPU (`/proc/stat`), the server's process
//! tree's CPU and RSS (`/proc/<pid>/stat`). The series explains where a step's throughput
//! stopped growing ([`limit`]): the batch cap, the KV pool, or the CPU.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// One second of a step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the step started.
    pub t: f64,
    /// Requests running (prefilling or decoding).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running: Option<f64>,
    /// Requests waiting for admission.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queued: Option<f64>,
    /// Fraction of the KV pool in use, 0..1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_usage: Option<f64>,
    /// Retractions (preemptions) so far, a counter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retractions: Option<f64>,
    /// Busy fraction of all the host's cores over the last second, 0..1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_cpu: Option<f64>,
    /// Cores the server's process tree kept busy over the last second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_cpu: Option<f64>,
    /// Resident bytes of the server's process tree.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss: Option<u64>,
}

/// Prometheus text exposition format: every value of each metric, one per label set (SGLang
/// repeats a gauge per tensor-parallel rank, vLLM gives one per engine). Comments, histogram
/// lines and unparsable lines are kept or skipped as they come: only the names asked for are
/// read.
pub fn parse_prometheus(text: &str) -> HashMap<String, Vec<f64>> {
    let mut m: HashMap<String, Vec<f64>> = HashMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) if line.as_bytes()[i] == b'{' => match line[i..].find('}') {
                Some(j) => (&line[..i], &line[i + j + 1..]),
                None => continue,
            },
            Some(i) => (&line[..i], &line[i..]),
            None => continue,
        };
        let Some(v) = rest.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) else { continue };
        if v.is_finite() {
            m.entry(name.to_owned()).or_default().push(v);
        }
    }
    m
}

/// The first of `names` present, its label sets combined: vLLM's request counts are summed
/// over engines (data parallel); anything else (SGLang's per-rank duplicates, a usage
/// fraction, llama-server's one value) takes the largest.
fn first(m: &HashMap<String, Vec<f64>>, names: &[&str]) -> Option<f64> {
    names.iter().find_map(|n| {
        let v = m.get(*n)?;
        let sum = n.starts_with("vllm:num_") || n.starts_with("sparrow:");
        Some(if sum { v.iter().sum() } else { v.iter().copied().fold(f64::NEG_INFINITY, f64::max) })
    })
}

/// The gauges of a `/metrics` page in one vocabulary: (running, queued, KV usage 0..1,
/// retractions counter). vLLM reports KV usage as a fraction under both its names; SGLang's
/// retraction counter is `num_retracted_requests_total` (its `num_retracted_reqs` is a gauge of
/// the last batch, not a count).
pub fn gauges(m: &HashMap<String, Vec<f64>>) -> (Option<f64>, Option<f64>, Option<f64>, Option<f64>) {
    (
        first(m, &["sglang:num_running_reqs", "vllm:num_requests_running", "llamacpp:requests_processing"]),
        first(m, &["sglang:num_queue_reqs", "vllm:num_requests_waiting", "llamacpp:requests_deferred"]),
        first(
            m,
            &[
                "sglang:token_usage",
                "vllm:kv_cache_usage_perc",
                "vllm:gpu_cache_usage_perc",
                "llamacpp:kv_cache_usage_ratio",
            ],
        ),
        first(
            m,
            &["sparrow:num_retractions_total", "sglang:num_retracted_requests_total", "vllm:num_preemptions_total"],
        ),
    )
}

/// (busy, total) jiffies of all cores, from `/proc/stat`'s `cpu` line.
fn host_jiffies() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let v: Vec<u64> = text.lines().next()?.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal ...: idle and iowait are not busy.
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// utime + stime (clock ticks) of the processes `pids` (those gone count 0).
fn pids_ticks(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            let after = &stat[stat.rfind(')')? + 1..];
            // Fields after `comm`: state is 3rd overall; utime and stime are the 14th and 15th.
            let f: Vec<&str> = after.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .sum()
}

fn clock_ticks() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().map_or(100.0, |t| t as f64)
}

/// Samples every `every` (a second) until `stop`, then returns the series. `pid` is the
/// launched server's (no CPU or RSS figures for a server the sweep did not launch).
pub async fn watch(
    http: reqwest::Client,
    metrics_url: String,
    pid: Option<u32>,
    every: Duration,
    stop: CancellationToken,
) -> Vec<Sample> {
    let started = Instant::now();
    let mut out = vec![];
    let mut host_prev = host_jiffies();
    let mut tree_prev = pid.map(|p| pids_ticks(&crate::monitor::tree_pids(p)));
    let mut t_prev = Instant::now();
    let hz = clock_ticks();
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    // A server without /metrics answers 404 once: not asked again.
    let mut has_metrics = true;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => break,
        }
        let mut s = Sample { t: started.elapsed().as_secs_f64(), ..Sample::default() };
        if has_metrics {
            match http.get(&metrics_url).timeout(every.mul_f64(0.8)).send().await {
                Ok(r) if r.status().is_success() => {
                    if let Ok(text) = r.text().await {
                        (s.running, s.queued, s.kv_usage, s.retractions) = gauges(&parse_prometheus(&text));
                    }
                }
                Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => has_metrics = false,
                _ => {}
            }
        }
        let host = host_jiffies();
        if let (Some((b0, t0)), Some((b1, t1))) = (host_prev, host) {
            if t1 > t0 {
                s.host_cpu = Some((b1 - b0.min(b1)) as f64 / (t1 - t0) as f64);
            }
        }
        host_prev = host;
        if let Some(p) = pid {
            // One walk of /proc for the tree, read for both its CPU time and its RSS.
            let tree = crate::monitor::tree_pids(p);
            let ticks = pids_ticks(&tree);
            let dt = t_prev.elapsed().as_secs_f64();
            if let (Some(prev), true) = (tree_prev, dt > 0.0) {
                s.server_cpu = Some(ticks.saturating_sub(prev) as f64 / hz / dt);
            }
            tree_prev = Some(ticks);
            s.rss = Some(crate::monitor::pids_rss(&tree)).filter(|r| *r > 0);
        }
        t_prev = Instant::now();
        out.push(s);
    }
    out
}

/// A step's series in a few figures (`summary.json` `server_stats`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Samples taken.
    pub samples: usize,
    /// Largest and mean requests running.
    pub running_max: Option<f64>,
    /// See above.
    pub running_mean: Option<f64>,
    /// Largest and mean requests waiting.
    pub queued_max: Option<f64>,
    /// See above.
    pub queued_mean: Option<f64>,
    /// Largest KV usage, 0..1.
    pub kv_usage_max: Option<f64>,
    /// Retractions during the step (counter growth).
    pub retractions: Option<f64>,
    /// Mean busy fraction of the host's cores.
    pub host_cpu_mean: Option<f64>,
    /// Mean cores busy in the server's process tree.
    pub server_cpu_mean: Option<f64>,
    /// Largest RSS of the server's process tree, bytes.
    pub rss_max: Option<u64>,
}

/// The figures of a series; the first and last seconds (ramp up, drain) count like the rest.
pub fn stats(s: &[Sample]) -> Stats {
    let col = |f: &dyn Fn(&Sample) -> Option<f64>| -> Vec<f64> { s.iter().filter_map(f).collect() };
    let max = |v: &[f64]| v.iter().copied().reduce(f64::max);
    let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    let running = col(&|x| x.running);
    let queued = col(&|x| x.queued);
    let ret = col(&|x| x.retractions);
    Stats {
        samples: s.len(),
        running_max: max(&running),
        running_mean: mean(&running),
        queued_max: max(&queued),
        queued_mean: mean(&queued),
        kv_usage_max: max(&col(&|x| x.kv_usage)),
        retractions: match (ret.first(), ret.last()) {
            (Some(a), Some(b)) => Some(b - a),
            _ => None,
        },
        host_cpu_mean: mean(&col(&|x| x.host_cpu)),
        server_cpu_mean: mean(&col(&|x| x.server_cpu)),
        rss_max: s.iter().filter_map(|x| x.rss).max(),
    }
}

/// Why a step's throughput stopped growing, from its series: the batch cap (requests queued
/// while the running count reached the server's cap, or without one stayed near its most,
/// below the offered concurrency), a full KV pool
/// (usage at 98 % or more with retractions), or the CPU (the server's tree at 90 % of the
/// cores, or the host at 90 %); `None` when none of these shows. `cap` is the server's
/// `max_running_requests` when its `/get_server_info` tells; `concurrency` the step's.
pub fn limit(st: &Stats, cap: Option<f64>, concurrency: Option<f64>, cores: usize) -> Option<String> {
    let queued = st.queued_mean.unwrap_or(0.0);
    if let (Some(max), Some(mean)) = (st.running_max, st.running_mean) {
        // With the server's cap known, reaching it is enough (a scheduler that admits one
        // prefill a step ramps back up after each wave); without, running must have stayed
        // near its most.
        let at_cap = match cap {
            Some(c) => max >= c,
            None => mean >= 0.8 * max,
        };
        let pinned = max > 0.0 && at_cap && queued >= 0.5;
        let below_offered = concurrency.is_none_or(|c| max < c);
        if pinned && below_offered {
            return Some(match cap {
                Some(n) => format!(
                    "the server runs at most {n:.0} at once (max_running_requests): running stayed at {mean:.1} on average (most {max:.0}) while {queued:.1} waited"
                ),
                // The server does not say why (vLLM's max_num_seqs, or admission by KV pages).
                None => format!(
                    "the server ran at most {max:.0} at once (a batch cap such as max_running_requests / max_num_seqs, or admission by KV pages): running stayed at {mean:.1} on average while {queued:.1} waited"
                ),
            });
        }
    }
    if st.kv_usage_max.is_some_and(|k| k >= 0.98) && st.retractions.is_some_and(|r| r > 0.0) {
        return Some(format!(
            "KV pool full: usage reached {:.0} % and {:.0} request(s) were retracted",
            st.kv_usage_max.unwrap_or(0.0) * 100.0,
            st.retractions.unwrap_or(0.0)
        ));
    }
    let cores = cores.max(1) as f64;
    if let Some(c) = st.server_cpu_mean.filter(|c| *c >= 0.9 * cores) {
        return Some(format!("compute-bound: the server kept {c:.2} of {cores:.0} cores busy"));
    }
    if let Some(h) = st.host_cpu_mean.filter(|h| *h >= 0.9) {
        return Some(format!("compute-bound: the host's CPU was {:.0} % busy", h * 100.0));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_is_summed_over_labels() {
        let m = parse_prometheus(
            "# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n\
             vllm:num_requests_running{model_name=\"a\",engine=\"0\"} 3.0\n\
             vllm:num_requests_running{model_name=\"a\",engine=\"1\"} 4\n\
             vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.75\n\
             vllm:num_preemptions_total 7 1700000000\nbad line\nnan_metric NaN\n",
        );
        assert_eq!(m["vllm:num_requests_running"], [3.0, 4.0]);
        // Engines' requests add up; their KV usage is the fullest one's, not a sum.
        assert_eq!(gauges(&m), (Some(7.0), None, Some(0.75), Some(7.0)));
        assert!(!m.contains_key("nan_metric"));
        // SGLang repeats a gauge per TP rank: not a sum. The gauge num_retracted_reqs is no count.
        let s = parse_prometheus(
            "sglang:num_running_reqs{tp_rank=\"0\"} 2\nsglang:num_running_reqs{tp_rank=\"1\"} 2\n\
             sglang:num_queue_reqs 5\nsglang:num_retracted_reqs 3\nsglang:num_retracted_requests_total{priority=\"\"} 9\n",
        );
        assert_eq!(gauges(&s), (Some(2.0), Some(5.0), None, Some(9.0)));
    }

    #[test]
    fn the_limit_is_named_from_the_series() {
        let at = |running, queued, kv, ret, cpu| Sample {
            running: Some(running),
            queued: Some(queued),
            kv_usage: Some(kv),
            retractions: Some(ret),
            server_cpu: Some(cpu),
            ..Sample::default()
        };
        // Four running, three waiting, at concurrency 8: the cap.
        let cap = stats(&[at(4.0, 3.0, 0.2, 0.0, 0.1), at(4.0, 4.0, 0.2, 0.0, 0.1), at(4.0, 3.0, 0.2, 0.0, 0.1)]);
        let why = limit(&cap, Some(4.0), Some(8.0), 2).expect("cap");
        assert!(limit(&cap, None, Some(8.0), 2).is_some());
        assert!(why.starts_with("the server runs at most 4 at once (max_running_requests)"), "{why}");
        // Running as many as offered is no cap, even with a queue.
        assert_eq!(limit(&cap, None, Some(4.0), 2), None);
        // A wave that ramps back up (1, 4, 1 running) with a queue: the cap when the server
        // tells it; without, running did not stay near its most.
        let wave = stats(&[at(1.0, 12.0, 0.0, 0.0, 0.1), at(4.0, 12.0, 0.0, 0.0, 0.1), at(1.0, 7.0, 0.0, 0.0, 0.1)]);
        assert!(limit(&wave, Some(4.0), Some(16.0), 2).expect("cap").contains("at most 4 at once"));
        assert_eq!(limit(&wave, None, Some(16.0), 2), None);
        // A server that does not tell its cap: named as what it may be.
        let told = limit(&cap, None, Some(8.0), 2).expect("cap unknown");
        assert!(told.starts_with("the server ran at most 4 at once (a batch cap"), "{told}");
        // The pool full and retractions.
        let kv = stats(&[at(8.0, 0.0, 0.9, 1.0, 0.5), at(6.0, 0.0, 1.0, 3.0, 0.5)]);
        assert!(limit(&kv, None, Some(16.0), 2)
            .expect("kv")
            .starts_with("KV pool full: usage reached 100 % and 2 request"));
        // Neither, the server's tree at 1.9 of 2 cores.
        let cpu = stats(&[at(8.0, 0.0, 0.3, 0.0, 1.9), at(7.0, 0.0, 0.3, 0.0, 1.9)]);
        assert!(limit(&cpu, None, Some(8.0), 2).expect("cpu").starts_with("compute-bound"));
        assert_eq!(limit(&stats(&[at(2.0, 0.0, 0.1, 0.0, 0.2)]), None, Some(8.0), 2), None);
    }
}
