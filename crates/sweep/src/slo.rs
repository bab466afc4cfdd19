//! SLOs as `--slo` writes them, a step's judgement against them, and the search for the
//! highest load that meets them (bracketing over the listed step values, then bisection),
//! after vLLM's `vllm bench sweep serve_sla` (which interpolates instead of bisecting).
//!
//! A term is `metric[_pNN]<=ms` with metric `ttft`, `tpot`, `itl` or `e2e`:
//! - with `_pNN` (`ttft_p99<=2000`), the step's pNN of the metric is at or under the bound:
//!   the percentile as the bench prints it (numpy's linear interpolation over the requests;
//!   for `itl` over every inter-token gap), with each failed request taken as infinitely slow
//!   (one infinite value), so failures cannot pass for fast requests;
//! - without (`tpot<=100`), the bounds are judged together per request, and at least
//!   `--slo-attainment` of the requests must meet them all, as SGLang's and vLLM's `--goodput`
//!   judge requests (`--slo-ttft-ms` and friends are such terms).

use sparrow_bench::record::RequestRecord;

use crate::analysis::fmt_value;

/// A latency an SLO bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Time to first token.
    Ttft,
    /// Time per output token after the first.
    Tpot,
    /// Inter-token latency (every gap).
    Itl,
    /// End-to-end latency.
    E2e,
}

impl Metric {
    fn name(self) -> &'static str {
        match self {
            Metric::Ttft => "TTFT",
            Metric::Tpot => "TPOT",
            Metric::Itl => "ITL",
            Metric::E2e => "E2E",
        }
    }
}

/// One SLO term.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Term {
    /// What it bounds.
    pub metric: Metric,
    /// The percentile (0, 100], or `None` for a per-request bound judged with the attainment.
    pub pct: Option<f64>,
    /// The bound, ms.
    pub bound_ms: f64,
}

impl std::fmt::Display for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.pct {
            Some(p) => write!(f, "{} p{} <= {} ms", self.metric.name(), fmt_value(p), fmt_value(self.bound_ms)),
            None => write!(f, "{} <= {} ms", self.metric.name(), fmt_value(self.bound_ms)),
        }
    }
}

/// Parses `--slo` (`ttft_p99<=2000,tpot_p99<=100,e2e_p90<=8000`, ms).
///
/// # Errors
/// A message naming the term that is not `metric[_pNN]<=ms`.
pub fn parse_terms(s: &str) -> Result<Vec<Term>, String> {
    let mut out = vec![];
    for raw in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let bad =
            || format!("--slo {raw:?}: expected metric[_pNN]<=ms, metric one of ttft, tpot, itl, e2e (ttft_p99<=2000)");
        let (lhs, rhs) = raw.split_once("<=").ok_or_else(bad)?;
        let bound_ms: f64 = rhs.trim().trim_end_matches("ms").parse().map_err(|_| bad())?;
        if !(bound_ms.is_finite() && bound_ms > 0.0) {
            return Err(format!("--slo {raw:?}: the bound must be a positive number of milliseconds"));
        }
        let lhs = lhs.trim().to_ascii_lowercase();
        let (m, pct) = match lhs.split_once("_p") {
            Some((m, p)) => (m.to_owned(), Some(p.parse::<f64>().map_err(|_| bad())?)),
            None => (lhs.clone(), None),
        };
        let metric = match m.as_str() {
            "ttft" => Metric::Ttft,
            "tpot" => Metric::Tpot,
            "itl" => Metric::Itl,
            "e2e" | "e2el" => Metric::E2e,
            _ => return Err(bad()),
        };
        if pct.is_some_and(|p| !(p > 0.0 && p <= 100.0)) {
            return Err(format!("--slo {raw:?}: the percentile must be in (0, 100]"));
        }
        if metric == Metric::Itl && pct.is_none() {
            return Err(format!("--slo {raw:?}: a request has many ITLs: give a percentile (itl_p99<=...)"));
        }
        out.push(Term { metric, pct, bound_ms });
    }
    if out.is_empty() {
        return Err("--slo is empty: give terms like ttft_p99<=2000,tpot_p99<=100".into());
    }
    Ok(out)
}

/// The SLOs of a sweep: `--slo` terms and the `--slo-*-ms` bounds, with `--slo-attainment`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Slo {
    /// Every term.
    pub terms: Vec<Term>,
    /// Fraction of requests that must meet the per-request terms together.
    pub attainment: f64,
}

/// A step's judgement.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    /// Every term held.
    pub met: bool,
    /// Requests meeting every bound of every term, per second.
    pub goodput: f64,
    /// Fraction of requests meeting every bound of every term.
    pub attainment: f64,
    /// The terms that did not hold, with what was measured ("TTFT p99 <= 2000 ms: 91.0 %
    /// met"); empty when `met`.
    pub missed: Vec<String>,
}

fn value_ms(r: &RequestRecord, m: Metric) -> Option<f64> {
    match m {
        Metric::Ttft => r.ttft(),
        Metric::Tpot => r.tpot(),
        Metric::E2e => Some(r.e2e()),
        Metric::Itl => r.itl().0.into_iter().reduce(f64::max),
    }
    .map(|s| s * 1000.0)
}

/// Whether request `r` meets `t`'s bound: it succeeded, and the value is within the bound (a
/// request with one output token has no TPOT or ITL and meets those; a TTFT must exist).
fn meets(r: &RequestRecord, t: &Term) -> bool {
    r.success()
        && match value_ms(r, t.metric) {
            Some(v) => v <= t.bound_ms,
            None => t.metric != Metric::Ttft,
        }
}

/// The `q`-th percentile of `v` with numpy's linear interpolation (as the bench prints its
/// percentiles), where infinite values (failed requests) sort last and an interpolation that
/// touches one is infinite; `v` is sorted in place. 0 for no value.
pub fn percentile_inf(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let h = (v.len() - 1) as f64 * q / 100.0;
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(v.len() - 1);
    let frac = h - lo as f64;
    if frac == 0.0 || v[hi] == v[lo] {
        v[lo]
    } else {
        v[lo] + frac * (v[hi] - v[lo])
    }
}

impl Slo {
    /// True when there is any term.
    pub fn any(&self) -> bool {
        !self.terms.is_empty()
    }

    /// `TTFT p99 <= 2000 ms, TPOT <= 100 ms for >= 90 % of requests`.
    pub fn describe(&self) -> String {
        let (pct, per): (Vec<&Term>, Vec<&Term>) = self.terms.iter().partition(|t| t.pct.is_some());
        let mut parts: Vec<String> = pct.iter().map(|t| t.to_string()).collect();
        if !per.is_empty() {
            let p: Vec<String> = per.iter().map(|t| t.to_string()).collect();
            parts.push(format!("{} for >= {} % of requests", p.join(", "), fmt_value(self.attainment * 100.0)));
        }
        parts.join("; ")
    }

    /// Judges a step's requests, run over `duration_s` seconds.
    pub fn judge(&self, records: &[RequestRecord], duration_s: f64) -> Judgement {
        let n = records.len();
        let frac = |k: usize, of: usize| if of == 0 { 0.0 } else { k as f64 / of as f64 };
        let good = records.iter().filter(|r| self.terms.iter().all(|t| meets(r, t))).count();
        let mut missed = vec![];
        let per: Vec<&Term> = self.terms.iter().filter(|t| t.pct.is_none()).collect();
        if !per.is_empty() {
            let k = records.iter().filter(|r| per.iter().all(|t| meets(r, t))).count();
            if frac(k, n) < self.attainment {
                let names: Vec<String> = per.iter().map(|t| t.to_string()).collect();
                missed.push(format!(
                    "{}: {:.1} % of requests met, {} % needed",
                    names.join(", "),
                    frac(k, n) * 100.0,
                    fmt_value(self.attainment * 100.0)
                ));
            }
        }
        for t in self.terms.iter().filter(|t| t.pct.is_some()) {
            let mut values: Vec<f64> = vec![];
            for r in records {
                if !r.success() {
                    values.push(f64::INFINITY);
                } else if t.metric == Metric::Itl {
                    values.extend(r.itl().0.iter().map(|g| g * 1000.0));
                } else if let Some(v) = value_ms(r, t.metric) {
                    values.push(v);
                } else if t.metric == Metric::Ttft {
                    // A success with no content chunk has no TTFT to meet the bound with.
                    values.push(f64::INFINITY);
                }
            }
            // No value at all (one token per request for TPOT/ITL) has nothing to miss.
            if values.is_empty() {
                continue;
            }
            let p = percentile_inf(&mut values, t.pct.unwrap_or(100.0));
            if p > t.bound_ms {
                let shown = if p.is_finite() { format!("{p:.1} ms") } else { "a failed request".to_owned() };
                missed.push(format!("{t}: p{} was {shown}", fmt_value(t.pct.unwrap_or(100.0))));
            }
        }
        Judgement {
            met: missed.is_empty() && n > 0,
            goodput: if duration_s > 0.0 { good as f64 / duration_s } else { 0.0 },
            attainment: frac(good, n),
            missed,
        }
    }
}

/// The search for the highest step value meeting the SLOs on one side: the listed values are
/// tried in increasing order until one misses (bracketing); then the gap between the highest
/// value met and the lowest missed is halved until the two are adjacent integers
/// (concurrency) or within `tolerance` of each other (request rate, relative). When even the
/// lowest listed concurrency misses, the search halves it down towards 1 (vLLM's
/// `serve_sla` searches from 1 as well).
#[derive(Debug, Clone, PartialEq)]
pub struct Search {
    listed: Vec<f64>,
    integer: bool,
    tolerance: f64,
    next_listed: usize,
    /// The highest value met so far.
    pub met: Option<f64>,
    /// The lowest value missed so far.
    pub missed: Option<f64>,
    /// Every probe in order: (value, met).
    pub probes: Vec<(f64, bool)>,
    ended: bool,
}

impl Search {
    /// A search over `listed` (increasing, finite); `integer` for concurrencies.
    pub fn new(listed: Vec<f64>, integer: bool, tolerance: f64) -> Search {
        Search { listed, integer, tolerance, next_listed: 0, met: None, missed: None, probes: vec![], ended: false }
    }

    /// The next value to measure, or `None` when the search is over.
    pub fn next(&self) -> Option<f64> {
        if self.ended {
            return None;
        }
        match (self.met, self.missed) {
            // Still bracketing: the next listed value above the highest met.
            (_, None) => self.listed.get(self.next_listed).copied(),
            // Even the lowest listed value missed: concurrencies go on down towards 1 (the
            // implicit lower end); rates stop (no lower end to bisect from).
            (None, Some(hi)) => (self.integer && hi.round() > 1.0).then(|| (hi.round() / 2.0).floor().max(1.0)),
            (Some(lo), Some(hi)) => {
                if self.integer {
                    let (lo, hi) = (lo.round(), hi.round());
                    (hi - lo > 1.0).then(|| ((lo + hi) / 2.0).floor())
                } else {
                    (hi / lo - 1.0 > self.tolerance).then(|| (lo + hi) / 2.0)
                }
            }
        }
    }

    /// Records the outcome at `value` (as returned by [`Self::next`]).
    pub fn record(&mut self, value: f64, met: bool) {
        self.probes.push((value, met));
        if self.missed.is_none() {
            self.next_listed += 1;
        }
        if met {
            self.met = Some(self.met.map_or(value, |m| m.max(value)));
        } else {
            self.missed = Some(self.missed.map_or(value, |m| m.min(value)));
        }
    }

    /// Ends the search (its server stopped for good, or the sweep was interrupted).
    pub fn end(&mut self) {
        self.ended = true;
    }

    /// How it ended, in words.
    pub fn outcome(&self) -> String {
        match (self.met, self.missed) {
            (Some(m), Some(x)) => format!("highest met {}, lowest missed {}", fmt_value(m), fmt_value(x)),
            (Some(m), None) => {
                format!("every probe met the SLOs up to {} (the top of the list): the limit lies above", fmt_value(m))
            }
            (None, Some(x)) => format!("even {} missed the SLOs", fmt_value(x)),
            (None, None) => "nothing measured".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_parse_and_describe() {
        let t = parse_terms("ttft_p99<=2000, tpot<=100ms,e2el_p90<=8000.5,itl_p95<=50").expect("terms");
        assert_eq!(t[0], Term { metric: Metric::Ttft, pct: Some(99.0), bound_ms: 2000.0 });
        assert_eq!(t[1], Term { metric: Metric::Tpot, pct: None, bound_ms: 100.0 });
        assert_eq!(t[2].metric, Metric::E2e);
        let s = Slo { terms: t, attainment: 0.9 };
        assert_eq!(
            s.describe(),
            "TTFT p99 <= 2000 ms; E2E p90 <= 8000.5 ms; ITL p95 <= 50 ms; TPOT <= 100 ms for >= 90 % of requests"
        );
        for bad in ["ttft<2000", "foo_p99<=1", "ttft_p0<=1", "ttft_p101<=1", "itl<=5", "ttft<=-1", ""] {
            assert!(parse_terms(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn percentiles_interpolate_and_failures_are_infinitely_slow() {
        let mut v = vec![10.0, 20.0, 30.0, 40.0];
        assert_eq!(percentile_inf(&mut v, 50.0), 25.0);
        let mut w = vec![10.0, f64::INFINITY, 20.0];
        assert_eq!(percentile_inf(&mut w, 50.0), 20.0);
        assert!(percentile_inf(&mut w, 75.0).is_infinite());
        assert_eq!(percentile_inf(&mut [], 99.0), 0.0);
    }

    /// Concurrency 1..=100 where everything up to 37 meets: the listed 1, 4, 16, 64 bracket
    /// it between 16 and 64, and bisection ends at 37 / 38.
    #[test]
    fn search_brackets_then_bisects_to_adjacent_integers() {
        let mut s = Search::new(vec![1.0, 4.0, 16.0, 64.0, 256.0], true, 0.05);
        let mut seen = vec![];
        while let Some(v) = s.next() {
            seen.push(v);
            s.record(v, v <= 37.0);
        }
        assert_eq!(seen, [1.0, 4.0, 16.0, 64.0, 40.0, 28.0, 34.0, 37.0, 38.0]);
        assert_eq!((s.met, s.missed), (Some(37.0), Some(38.0)));
        // Rates: within 5 % of each other.
        let mut r = Search::new(vec![1.0, 8.0], false, 0.05);
        while let Some(v) = r.next() {
            r.record(v, v <= 3.3);
        }
        let (lo, hi) = (r.met.expect("met"), r.missed.expect("missed"));
        assert!(lo <= 3.3 && hi > 3.3 && hi / lo - 1.0 <= 0.05, "{lo} {hi}");
        // Nothing met at the lowest listed value: down towards 1.
        let mut n = Search::new(vec![8.0, 16.0], true, 0.05);
        let mut seen = vec![];
        while let Some(v) = n.next() {
            seen.push(v);
            n.record(v, v <= 2.0);
        }
        assert_eq!(seen, [8.0, 4.0, 2.0, 3.0]);
        assert_eq!((n.met, n.missed), (Some(2.0), Some(3.0)));
        let mut one = Search::new(vec![1.0, 4.0], true, 0.05);
        one.record(1.0, false);
        assert_eq!(one.next(), None);
        assert!(one.outcome().contains("even 1"));
        let mut a = Search::new(vec![2.0, 4.0], true, 0.05);
        a.record(2.0, true);
        a.record(4.0, true);
        assert_eq!(a.next(), None);
        assert!(a.outcome().contains("the limit lies above"));
    }
}
