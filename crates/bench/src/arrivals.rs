//! Arrival times of a run, computed before it starts.
//!
//! With an infinite rate every request is due at 0. Otherwise gaps are drawn from a gamma
//! distribution with shape `burstiness` and scale `1 / (rate · burstiness)` (vLLM's
//! `--burstiness`, `vllm/benchmarks/serve.py`), so the mean gap is `1 / rate` for any
//! burstiness; burstiness 1 is a Poisson process (SGLang's only mode). The first request is
//! due at 0 and request `i` at the sum of the first `i` gaps. Sends are then made at these
//! absolute offsets from the run start, so a slow send never delays the ones after it.

use rand::rngs::StdRng;
use rand_distr::{Distribution, Gamma};

/// Offsets in seconds from the run start, one per request, non-decreasing.
///
/// `rate` is requests per second (`f64::INFINITY` for all at once); `burstiness` must be
/// positive and finite (checked by the caller's flag validation; a bad value gives all-zero
/// offsets rather than a panic).
pub fn arrival_offsets(n: usize, rate: f64, burstiness: f64, rng: &mut StdRng) -> Vec<f64> {
    if !rate.is_finite() || rate <= 0.0 {
        return vec![0.0; n];
    }
    let Ok(gamma) = Gamma::new(burstiness, 1.0 / (rate * burstiness)) else {
        return vec![0.0; n];
    };
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            if i > 0 {
                t += gamma.sample(rng);
            }
            t
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn infinite_rate_sends_all_at_once() {
        let mut rng = StdRng::seed_from_u64(0);
        assert_eq!(arrival_offsets(3, f64::INFINITY, 1.0, &mut rng), vec![0.0; 3]);
    }

    #[test]
    fn mean_gap_is_one_over_rate() {
        for b in [0.5, 1.0, 4.0] {
            let mut rng = StdRng::seed_from_u64(7);
            let n = 20_000;
            let o = arrival_offsets(n, 50.0, b, &mut rng);
            assert_eq!(o[0], 0.0);
            assert!(o.windows(2).all(|w| w[1] >= w[0]));
            let mean_gap = o[n - 1] / (n - 1) as f64;
            assert!((mean_gap - 0.02).abs() < 0.02 * 0.05, "burstiness {b}: mean gap {mean_gap}");
        }
    }

    #[test]
    fn burstiness_sets_gap_dispersion() {
        // Gamma(k, θ) has coefficient of variation 1/sqrt(k).
        for (b, cv_want) in [(1.0, 1.0), (4.0, 0.5)] {
            let mut rng = StdRng::seed_from_u64(11);
            let o = arrival_offsets(20_001, 10.0, b, &mut rng);
            let gaps: Vec<f64> = o.windows(2).map(|w| w[1] - w[0]).collect();
            let m = crate::metrics::mean(&gaps);
            let cv = crate::metrics::std_dev(&gaps) / m;
            assert!((cv - cv_want).abs() < 0.05, "burstiness {b}: cv {cv}");
        }
    }
}
