//! Log-probabilities of one logits row: the value at a token, its rank, the top-N alternatives
//! and named tokens ([`row_logprobs`]).
//!
//! `log p(t) = l_t − (m + ln Σ_j exp(l_j − m))` with `m = max_j l_j` (the log-sum-exp trick, as
//! `torch.log_softmax`); the exponentials in f32 (Cephes `expf`, within 2 ulp), summed in f32
//! lanes of 32 terms and then in f64 ([`sparrow_cpu::kernels::flash::sum_exp_shifted`], the same
//! bits on every ISA). The row is the model's raw output: callers pass
//! it before logit bias, penalties, temperature and filters (see
//! [`LogprobSpec`](crate::request::LogprobSpec)).

use std::sync::OnceLock;

use sparrow_cpu::kernels::flash::sum_exp_shifted;
use sparrow_cpu::Isa;

use crate::request::TokenLogprob;

/// What a non-finite logprob is reported as (vLLM's documented floor for "very unlikely");
/// JSON has no −∞ and a NaN would break clients.
pub const LOGPROB_FLOOR: f32 = -9999.0;

fn finite_or_floor(x: f64) -> f32 {
    let v = x as f32;
    if v.is_finite() {
        v.min(0.0)
    } else {
        LOGPROB_FLOOR
    }
}

/// The log-sum-exp of a logits row, f64; NaNs are skipped, an all-NaN or empty row gives −∞.
pub fn log_sum_exp(row: &[f32]) -> f64 {
    static ISA: OnceLock<Isa> = OnceLock::new();
    let m = row.iter().copied().filter(|x| !x.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    if !m.is_finite() {
        return m as f64;
    }
    m as f64 + sum_exp_shifted(*ISA.get_or_init(Isa::detect), row, m).ln()
}

/// Logprobs of the logits `row` (`[vocab]`): the value and rank of `token`, the `top_n` most
/// likely tokens (logprob descending, ties to the lower id; NaN logits never enter) and the
/// values of `ids` (ids outside the row get [`LOGPROB_FLOOR`]). With `token: None` the entry
/// has no value of its own (prompt position 0). Every value is finite and ≤ 0.
pub fn row_logprobs(row: &[f32], token: Option<u32>, top_n: usize, ids: &[u32]) -> TokenLogprob {
    let lse = log_sum_exp(row);
    let lp = |t: u32| row.get(t as usize).map_or(LOGPROB_FLOOR, |&l| finite_or_floor(l as f64 - lse));
    let (logprob, rank) = match token {
        Some(t) => {
            let l = row.get(t as usize).copied().unwrap_or(f32::NEG_INFINITY);
            // Only strictly larger logits rank above: equal values share the better rank.
            let above = if l.is_nan() { row.len() } else { row.iter().filter(|&&x| x > l).count() };
            (Some(lp(t)), above as u32 + 1)
        }
        None => (None, 0),
    };
    TokenLogprob {
        token: token.unwrap_or(0),
        logprob,
        rank,
        top: top_tokens(row, top_n).into_iter().map(|t| (t, lp(t))).collect(),
        ids: ids.iter().map(|&t| (t, lp(t))).collect(),
    }
}

/// The `n` largest entries of `row` by value, descending, ties to the lower index; NaNs skipped.
/// One pass with a sorted buffer of `n`: O(vocab) when `n` is small, as in the API (≤ 20).
pub fn top_tokens(row: &[f32], n: usize) -> Vec<u32> {
    let n = n.min(row.len());
    if n == 0 {
        return Vec::new();
    }
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(n + 1);
    for (i, &x) in row.iter().enumerate() {
        if x.is_nan() || (best.len() == n && x <= best[n - 1].0) {
            continue;
        }
        // Insert after every entry that is ≥ x: an equal earlier index stays ahead.
        let at = best.partition_point(|&(v, _)| v >= x);
        best.insert(at, (x, i as u32));
        best.truncate(n);
    }
    best.into_iter().map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-computed: logits [1, 3, 3, 0] have log-sum-exp ln(e + 2e³ + 1).
    #[test]
    fn hand_computed_row() {
        let row = [1.0f32, 3.0, 3.0, 0.0];
        let lse = (1f64.exp() + 2.0 * 3f64.exp() + 1.0).ln();
        let e = row_logprobs(&row, Some(0), 3, &[3, 9]);
        assert_eq!(e.token, 0);
        assert!((e.logprob.unwrap_or(0.0) as f64 - (1.0 - lse)).abs() < 1e-6);
        assert_eq!(e.rank, 3);
        assert_eq!(e.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2, 0]);
        assert!((e.top[0].1 as f64 - (3.0 - lse)).abs() < 1e-6);
        assert_eq!(e.top[0].1, e.top[1].1);
        assert!((e.ids[0].1 as f64 - (0.0 - lse)).abs() < 1e-6);
        assert_eq!(e.ids[1], (9, LOGPROB_FLOOR));
        // A tied token shares the better rank.
        assert_eq!(row_logprobs(&row, Some(2), 0, &[]).rank, 1);
        let none = row_logprobs(&row, None, 1, &[]);
        assert_eq!((none.logprob, none.rank, none.top.len()), (None, 0, 1));
    }

    #[test]
    fn never_non_finite() {
        let row = [f32::NEG_INFINITY, 0.0, f32::NAN, -1e30];
        let e = row_logprobs(&row, Some(0), 4, &[2, 3]);
        assert_eq!(e.logprob, Some(LOGPROB_FLOOR));
        assert_eq!(e.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 0]);
        for v in e.top.iter().chain(&e.ids).map(|t| t.1).chain(e.logprob) {
            assert!(v.is_finite() && v <= 0.0, "{v}");
        }
    }

    /// Against a full sort, with many ties.
    #[test]
    fn top_matches_sort() {
        let row: Vec<f32> = (0..500u32).map(|i| ((i * 7919) % 13) as f32 - 6.0).collect();
        for n in [1, 5, 20, 499, 500, 600] {
            let mut idx: Vec<u32> = (0..row.len() as u32).collect();
            idx.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
            idx.truncate(n);
            assert_eq!(top_tokens(&row, n), idx, "n = {n}");
        }
    }
}
