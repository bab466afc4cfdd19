//! The knee, the peak and the SLO point of a sweep, from its steps; medians and spreads over
//! `--repeat`ed runs.
//!
//! The knee is the first step value after which output throughput grows by less than `gain`
//! per doubling of the step value: between consecutive values `c(i) < c(i+1)` with (median)
//! output throughputs `T(i)`, `T(i+1)`, the knee is `c(i)` for the first `i` with
//! `T(i+1)/T(i) < (1 + gain)^log2(c(i+1)/c(i))`. Infinite values (`--request-rate inf`) have
//! no distance on that scale and are left out of the test (they still show in the table).

use crate::step::StepResult;

/// One side's figures at one step value, over its repeats.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// Index of the step value on the axis.
    pub value_index: usize,
    /// The step value.
    pub value: f64,
    /// Runs that measured something (status ok).
    pub runs: usize,
    /// Median output tok/s over the runs.
    pub output_throughput: f64,
    /// Smallest and largest output tok/s over the runs.
    pub spread: (f64, f64),
    /// Median of the other figures: total tok/s, req/s, TTFT p50/p99, TPOT p50/p99, ITL p50,
    /// E2E p50 (ms).
    pub total_throughput: f64,
    /// See above.
    pub request_throughput: f64,
    /// See above.
    pub ttft_p50: f64,
    /// See above.
    pub ttft_p99: f64,
    /// See above.
    pub tpot_p50: f64,
    /// See above.
    pub tpot_p99: f64,
    /// See above.
    pub itl_p50: f64,
    /// See above.
    pub e2e_p50: f64,
    /// Median SLO attainment, when SLOs were given.
    pub slo_attainment: Option<f64>,
    /// Median goodput (req/s), when SLOs were given.
    pub goodput: Option<f64>,
    /// Whether the value met the SLOs: more than half of its runs did (with SLOs).
    pub slo_met: Option<bool>,
}

/// Whether side `label` met the SLOs at step value `vi`: more than half of its judged runs
/// there did. A run that crashed, or failed on requests, is judged and did not; a skipped or
/// interrupted one is not judged. `None` when no run was judged.
pub fn value_met(steps: &[StepResult], label: &str, vi: usize) -> Option<bool> {
    use crate::step::Status;
    let judged: Vec<&StepResult> = steps
        .iter()
        .filter(|s| s.label == label && s.value_index == vi)
        .filter(|s| matches!(s.status, Status::Ok | Status::Failed | Status::Crashed))
        .collect();
    let met = judged.iter().filter(|s| s.status == Status::Ok && s.slo_met == Some(true)).count();
    (!judged.is_empty()).then(|| 2 * met > judged.len())
}

/// Median (numpy's: the mean of the two middle values for an even count); 0 for none.
pub fn median(xs: &[f64]) -> f64 {
    sparrow_bench::metrics::percentile(xs, 50.0)
}

/// The points of side `label` in step-value order (values with no usable run are left out).
pub fn points(steps: &[StepResult], label: &str, axis: &str) -> Vec<Point> {
    let mut idx: Vec<usize> = steps.iter().filter(|s| s.label == label).map(|s| s.value_index).collect();
    // Listed values increase along the axis, but an SLO search appends the values it bisects.
    let value_of = |vi: usize| steps.iter().find(|s| s.value_index == vi).map_or(0.0, |s| s.value(axis));
    idx.sort_by(|a, b| value_of(*a).total_cmp(&value_of(*b)));
    idx.dedup();
    idx.into_iter()
        .filter_map(|vi| {
            let runs: Vec<&StepResult> =
                steps.iter().filter(|s| s.label == label && s.value_index == vi && s.measured()).collect();
            let first = runs.first()?;
            let med = |k: &str| median(&runs.iter().filter_map(|s| s.metric(k)).collect::<Vec<_>>());
            let opt = |f: &dyn Fn(&StepResult) -> Option<f64>| {
                let v: Vec<f64> = runs.iter().filter_map(|s| f(s)).collect();
                (!v.is_empty()).then(|| median(&v))
            };
            let tps: Vec<f64> = runs.iter().filter_map(|s| s.metric("output_throughput")).collect();
            Some(Point {
                value_index: vi,
                value: first.value(axis),
                runs: runs.len(),
                output_throughput: median(&tps),
                spread: (tps.iter().copied().fold(f64::INFINITY, f64::min), tps.iter().copied().fold(0.0, f64::max)),
                total_throughput: med("total_throughput"),
                request_throughput: med("request_throughput"),
                ttft_p50: med("median_ttft_ms"),
                ttft_p99: med("p99_ttft_ms"),
                tpot_p50: med("median_tpot_ms"),
                tpot_p99: med("p99_tpot_ms"),
                itl_p50: med("median_itl_ms"),
                e2e_p50: med("median_e2e_latency_ms"),
                slo_attainment: opt(&|s| s.slo_attainment),
                goodput: opt(&|s| s.goodput),
                slo_met: first.slo_met.and_then(|_| value_met(steps, label, vi)),
            })
        })
        .collect()
}

/// One side's analysis.
#[derive(Debug, Clone)]
pub struct SideAnalysis {
    /// The label.
    pub label: String,
    /// Its points.
    pub points: Vec<Point>,
    /// The knee.
    pub knee: Finding,
    /// The peak.
    pub peak: Finding,
    /// The SLO point (with SLOs).
    pub slo: Option<Finding>,
    /// What held the throughput past the knee, from the server's series at the next step
    /// value ("at 16: the server runs at most 4 at once (max_running_requests): ...").
    pub limit: Option<String>,
}

/// A found point and how it was found.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// The step value, when one was found.
    pub value: Option<f64>,
    /// Its output tok/s (or goodput, for the SLO point).
    pub figure: Option<f64>,
    /// One or two sentences: the rule and the numbers that decided.
    pub how: String,
}

/// `16` for whole numbers, `inf`, else shortest digits.
pub fn fmt_value(v: f64) -> String {
    if v.is_infinite() {
        "inf".into()
    } else if v == v.trunc() {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

/// The knee of `pts` (sorted by value) for `gain`.
pub fn knee(pts: &[Point], gain: f64) -> Finding {
    let finite: Vec<&Point> = pts.iter().filter(|p| p.value.is_finite() && p.value > 0.0).collect();
    if finite.len() < 2 {
        return Finding {
            value: None,
            figure: None,
            how: "fewer than two measured finite step values: no knee".into(),
        };
    }
    for w in finite.windows(2) {
        let (a, b) = (w[0], w[1]);
        let need = (1.0 + gain).powf((b.value / a.value).log2());
        let got = if a.output_throughput > 0.0 { b.output_throughput / a.output_throughput } else { f64::INFINITY };
        if got < need {
            return Finding {
                value: Some(a.value),
                figure: Some(a.output_throughput),
                how: format!(
                    "knee at {}: from {} to {} output tok/s went {:.1} -> {:.1} (x{:.3}), below the x{:.3} that {:.0} % per doubling needs",
                    fmt_value(a.value),
                    fmt_value(a.value),
                    fmt_value(b.value),
                    a.output_throughput,
                    b.output_throughput,
                    got,
                    need,
                    gain * 100.0
                ),
            };
        }
    }
    Finding {
        value: None,
        figure: None,
        how: format!(
            "no knee up to {}: output tok/s grew by at least {:.0} % per doubling at every step",
            fmt_value(finite[finite.len() - 1].value),
            gain * 100.0
        ),
    }
}

/// The step value with the highest median output tok/s.
pub fn peak(pts: &[Point]) -> Finding {
    match pts.iter().max_by(|a, b| a.output_throughput.total_cmp(&b.output_throughput)) {
        Some(p) => Finding {
            value: Some(p.value),
            figure: Some(p.output_throughput),
            how: format!("peak {:.1} output tok/s at {}", p.output_throughput, fmt_value(p.value)),
        },
        None => Finding { value: None, figure: None, how: "no step measured anything".into() },
    }
}

/// The highest step value that met the SLOs `slos` (described in words).
pub fn slo_point(pts: &[Point], slos: &str) -> Finding {
    let ok = pts.iter().filter(|p| p.slo_met == Some(true)).max_by(|a, b| a.value.total_cmp(&b.value));
    match ok {
        Some(p) => Finding {
            value: Some(p.value),
            figure: p.goodput,
            how: format!(
                "highest step meeting {slos}: {} ({:.1} % of requests met every bound, goodput {:.2} req/s)",
                fmt_value(p.value),
                p.slo_attainment.unwrap_or(0.0) * 100.0,
                p.goodput.unwrap_or(0.0)
            ),
        },
        None => Finding { value: None, figure: None, how: format!("no step met {slos}") },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(value: f64, t: f64) -> Point {
        Point {
            value_index: 0,
            value,
            runs: 1,
            output_throughput: t,
            spread: (t, t),
            total_throughput: 0.0,
            request_throughput: 0.0,
            ttft_p50: 0.0,
            ttft_p99: 0.0,
            tpot_p50: 0.0,
            tpot_p99: 0.0,
            itl_p50: 0.0,
            e2e_p50: 0.0,
            slo_attainment: None,
            goodput: None,
            slo_met: None,
        }
    }

    #[test]
    fn knee_by_hand() {
        // 1 -> 4 is two doublings: needs x1.21 at 10 %; 100 -> 190 passes (x1.9).
        // 4 -> 16 needs x1.21; 190 -> 220 is x1.158: the knee is at 4.
        let pts = [pt(1.0, 100.0), pt(4.0, 190.0), pt(16.0, 220.0), pt(64.0, 230.0)];
        let k = knee(&pts, 0.10);
        assert_eq!(k.value, Some(4.0), "{}", k.how);
        assert!(k.how.contains("x1.158") && k.how.contains("x1.210"), "{}", k.how);
        // At 5 % per doubling (x1.1025 over two), 4 -> 16 passes and 16 -> 64 (x1.045) fails.
        assert_eq!(knee(&pts, 0.05).value, Some(16.0));
        assert_eq!(knee(&pts[..2], 0.10).value, None);
        assert_eq!(peak(&pts).value, Some(64.0));
        // inf takes no part.
        let inf = [pt(1.0, 100.0), pt(2.0, 200.0), pt(f64::INFINITY, 10.0)];
        assert_eq!(knee(&inf, 0.1).value, None);
    }

    fn run(label: &str, vi: usize, c: usize, tps: f64, ok: bool) -> StepResult {
        let mut bench = serde_json::Map::new();
        bench.insert("output_throughput".into(), serde_json::json!(tps));
        bench.insert("median_ttft_ms".into(), serde_json::json!(tps / 10.0));
        StepResult {
            step: 0,
            key: String::new(),
            label: label.into(),
            config: None,
            workload: None,
            value_index: vi,
            repeat: 0,
            concurrency: Some(c),
            request_rate: f64::INFINITY,
            seed: 1,
            num_prompts: 64,
            status: if ok { crate::step::Status::Ok } else { crate::step::Status::Crashed },
            verdict: None,
            evidence: String::new(),
            quote: None,
            error_type: None,
            location: None,
            context: vec![],
            completed: 64,
            failed: 0,
            server_log: None,
            peak_rss_bytes: None,
            goodput: None,
            slo_attainment: None,
            slo_met: None,
            slo_missed: vec![],
            server_stats: None,
            limit: None,
            series_file: None,
            block_file: None,
            bench,
        }
    }

    #[test]
    fn repeats_give_medians_and_spread_per_side() {
        let steps = [
            run("A", 0, 1, 100.0, true),
            run("B", 0, 1, 50.0, true),
            run("A", 0, 1, 130.0, true),
            run("A", 0, 1, 90.0, true),
            run("A", 1, 8, 400.0, true),
            run("A", 1, 8, 999.0, false),
        ];
        let pts = points(&steps, "A", "concurrency");
        assert_eq!(pts.len(), 2);
        assert_eq!((pts[0].runs, pts[0].output_throughput, pts[0].spread), (3, 100.0, (90.0, 130.0)));
        assert_eq!(pts[0].ttft_p50, 10.0);
        // The crashed run is not a point.
        assert_eq!((pts[1].runs, pts[1].output_throughput, pts[1].value), (1, 400.0, 8.0));
        assert_eq!(points(&steps, "B", "concurrency")[0].output_throughput, 50.0);
    }

    #[test]
    fn slo_point_is_the_highest_meeting_step() {
        let mut pts = [pt(1.0, 1.0), pt(4.0, 2.0), pt(16.0, 3.0)];
        pts[0].slo_met = Some(true);
        pts[1].slo_met = Some(true);
        pts[1].slo_attainment = Some(0.95);
        pts[1].goodput = Some(3.5);
        pts[2].slo_met = Some(false);
        let f = slo_point(&pts, "TTFT <= 100 ms for >= 90 % of requests");
        assert_eq!(f.value, Some(4.0));
        assert_eq!(f.figure, Some(3.5));
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0]), 2.5);
    }
}
