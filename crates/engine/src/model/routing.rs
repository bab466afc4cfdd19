//! Mixture-of-Experts routing as data: one [`Routing`] value describes how a family picks its
//! experts and weighs them, and one function ([`Routing::route`]) applies it, so a new MoE
//! family is a new value, not a new `forward`.
//!
//! The rule follows llama.cpp's `build_moe_ffn` (`src/llama-graph.cpp`), which every GGUF MoE
//! family goes through, and the HF reference of each family:
//! 1. scores from the router logits: softmax (Qwen3-MoE, DeepSeek-V2), sigmoid (DeepSeek-V3,
//!    GLM-4.5 / GLM-5), or the raw logits ([`Scoring::SoftmaxSelected`], gpt-oss);
//! 2. selection keys = scores + the correction bias when the family has one
//!    (`e_score_correction_bias`, GGUF `exp_probs_b`); the bias steers the choice only;
//! 3. group-limited choice when `n_group > 1` (DeepSeek-V3 §2.1.2): groups ranked by the sum of
//!    their two best keys, the best `topk_group` kept;
//! 4. the `top_k` best keys, highest first, ties to the lower expert index (`torch.topk`);
//! 5. weights = the chosen experts' scores (softmax over their raw logits for gpt-oss), divided
//!    by their sum when `norm_topk_prob`, times `scaling` (`routed_scaling_factor`) once.

/// How router logits become scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scoring {
    /// Softmax over all experts (Qwen3-MoE, DeepSeek-V2; llama.cpp `SOFTMAX`).
    Softmax,
    /// Sigmoid per expert (DeepSeek-V3, GLM-4.5, GLM-5; llama.cpp `SIGMOID`).
    Sigmoid,
    /// Choose by raw logit, then softmax over the chosen ones (gpt-oss; llama.cpp
    /// `SOFTMAX_WEIGHT`).
    SoftmaxSelected,
}

/// A family's routing rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Routing {
    /// Scores from logits.
    pub scoring: Scoring,
    /// Experts per token.
    pub top_k: usize,
    /// Divide the chosen weights by their sum.
    pub norm_topk_prob: bool,
    /// Multiplies every weight once (`routed_scaling_factor`; 1 for most families).
    pub scaling: f32,
    /// Expert groups (1: no group limit); experts `g·n/n_group ..` form group `g`.
    pub n_group: usize,
    /// Groups kept when `n_group > 1`.
    pub topk_group: usize,
}

impl Routing {
    /// Routes one token: `logits` are the router's outputs `[n_experts]`, `bias` the optional
    /// selection bias `[n_experts]`. Returns `(expert, weight)`, `top_k` of them (fewer only
    /// when there are fewer experts), in selection order.
    pub fn route(&self, logits: &[f32], bias: Option<&[f32]>) -> Vec<(usize, f32)> {
        let n = logits.len();
        let scores: Vec<f32> = match self.scoring {
            Scoring::Sigmoid => logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect(),
            Scoring::Softmax => {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = logits.iter().map(|&x| (x - max).exp()).collect();
                let sum: f32 = e.iter().sum();
                e.iter().map(|&v| v / sum).collect()
            }
            Scoring::SoftmaxSelected => logits.to_vec(),
        };
        let key: Vec<f32> = match bias {
            Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
            None => scores.clone(),
        };
        let mut allowed = vec![true; n];
        if self.n_group > 1 {
            let per = n / self.n_group;
            let mut gscore: Vec<(usize, f32)> = (0..self.n_group)
                .map(|g| {
                    let mut v: Vec<f32> = key[g * per..(g + 1) * per].to_vec();
                    v.sort_by(|a, b| b.total_cmp(a));
                    (g, v.iter().take(2).sum())
                })
                .collect();
            // Highest first; ties to the lower index (torch.topk's order on CPU).
            gscore.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let keep: Vec<usize> = gscore.iter().take(self.topk_group).map(|g| g.0).collect();
            for (e, a) in allowed.iter_mut().enumerate() {
                *a = keep.contains(&(e / per));
            }
        }
        let mut cand: Vec<usize> = (0..n).filter(|&e| allowed[e]).collect();
        cand.sort_by(|&a, &b| key[b].total_cmp(&key[a]).then(a.cmp(&b)));
        cand.truncate(self.top_k);
        let mut w: Vec<(usize, f32)> = cand.iter().map(|&e| (e, scores[e])).collect();
        if self.scoring == Scoring::SoftmaxSelected {
            let max = w.iter().map(|x| x.1).fold(f32::NEG_INFINITY, f32::max);
            w.iter_mut().for_each(|x| x.1 = (x.1 - max).exp());
            let sum: f32 = w.iter().map(|x| x.1).sum();
            w.iter_mut().for_each(|x| x.1 /= sum);
        } else if self.norm_topk_prob {
            let sum: f32 = w.iter().map(|x| x.1).sum::<f32>() + 1e-20;
            w.iter_mut().for_each(|x| x.1 /= sum);
        }
        if self.scaling != 1.0 {
            w.iter_mut().for_each(|x| x.1 *= self.scaling);
        }
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule in f64, written the long way (every subset of `top_k` experts considered), as an
    /// independent reference: the chosen set is the one with the largest key sum among allowed
    /// experts, which for distinct keys is exactly the top-k.
    fn reference(r: &Routing, logits: &[f32], bias: Option<&[f32]>) -> Vec<(usize, f64)> {
        let n = logits.len();
        let l: Vec<f64> = logits.iter().map(|&x| f64::from(x)).collect();
        let scores: Vec<f64> = match r.scoring {
            Scoring::Sigmoid => l.iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect(),
            Scoring::Softmax => {
                let z: f64 = l.iter().map(|x| x.exp()).sum();
                l.iter().map(|x| x.exp() / z).collect()
            }
            Scoring::SoftmaxSelected => l.clone(),
        };
        let key: Vec<f64> = (0..n).map(|e| scores[e] + bias.map_or(0.0, |b| f64::from(b[e]))).collect();
        let per = n / r.n_group;
        // Groups: the two best keys of each, the best `topk_group` groups.
        let mut groups: Vec<(f64, usize)> = (0..r.n_group)
            .map(|g| {
                let mut v: Vec<f64> = key[g * per..(g + 1) * per].to_vec();
                v.sort_by(|a, b| b.total_cmp(a));
                (v.iter().take(2).sum(), g)
            })
            .collect();
        groups.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let kept: Vec<usize> = groups.iter().take(if r.n_group > 1 { r.topk_group } else { 1 }).map(|g| g.1).collect();
        let allowed: Vec<usize> = (0..n).filter(|e| kept.contains(&(e / per))).collect();
        // Brute force over subsets of `allowed` of size top_k (allowed ≤ 12 in these tests).
        let k = r.top_k.min(allowed.len());
        let mut best: Option<(f64, Vec<usize>)> = None;
        for mask in 0u32..(1 << allowed.len()) {
            if mask.count_ones() as usize != k {
                continue;
            }
            let set: Vec<usize> = (0..allowed.len()).filter(|i| mask >> i & 1 == 1).map(|i| allowed[i]).collect();
            let sum: f64 = set.iter().map(|&e| key[e]).sum();
            if best.as_ref().is_none_or(|b| sum > b.0) {
                best = Some((sum, set));
            }
        }
        let mut set = best.map(|b| b.1).unwrap_or_default();
        set.sort_by(|&a, &b| key[b].total_cmp(&key[a]));
        let mut w: Vec<(usize, f64)> = set.iter().map(|&e| (e, scores[e])).collect();
        if r.scoring == Scoring::SoftmaxSelected {
            let z: f64 = w.iter().map(|x| x.1.exp()).sum();
            w.iter_mut().for_each(|x| x.1 = x.1.exp() / z);
        } else if r.norm_topk_prob {
            let z: f64 = w.iter().map(|x| x.1).sum();
            w.iter_mut().for_each(|x| x.1 /= z);
        }
        w.iter_mut().for_each(|x| x.1 *= f64::from(r.scaling));
        w
    }

    /// A deterministic stream of distinct-enough values in [-3, 3).
    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 6.0 - 3.0
            })
            .collect()
    }

    /// Every family's rule against the f64 reference on 200 random tokens each.
    #[test]
    fn every_scoring_matches_the_f64_reference() {
        let families = [
            // Qwen3-MoE: softmax, top-8 of 128 in the real model, renormalized.
            (
                Routing {
                    scoring: Scoring::Softmax,
                    top_k: 4,
                    norm_topk_prob: true,
                    scaling: 1.0,
                    n_group: 1,
                    topk_group: 1,
                },
                false,
            ),
            // DeepSeek-V2-Lite: softmax, no renormalization, scaled.
            (
                Routing {
                    scoring: Scoring::Softmax,
                    top_k: 3,
                    norm_topk_prob: false,
                    scaling: 1.5,
                    n_group: 1,
                    topk_group: 1,
                },
                false,
            ),
            // DeepSeek-V3 / GLM: sigmoid, bias, groups, renormalized then scaled.
            (
                Routing {
                    scoring: Scoring::Sigmoid,
                    top_k: 3,
                    norm_topk_prob: true,
                    scaling: 2.5,
                    n_group: 4,
                    topk_group: 2,
                },
                true,
            ),
            // gpt-oss: choose by logit, softmax over the chosen.
            (
                Routing {
                    scoring: Scoring::SoftmaxSelected,
                    top_k: 4,
                    norm_topk_prob: false,
                    scaling: 1.0,
                    n_group: 1,
                    topk_group: 1,
                },
                false,
            ),
        ];
        for (fi, (r, with_bias)) in families.iter().enumerate() {
            for t in 0..200u64 {
                let logits = values(t * 31 + fi as u64, 12);
                let bias = with_bias.then(|| values(t * 7 + 1000, 12).iter().map(|b| b * 0.1).collect::<Vec<f32>>());
                let got = r.route(&logits, bias.as_deref());
                let want = reference(r, &logits, bias.as_deref());
                assert_eq!(
                    got.iter().map(|x| x.0).collect::<Vec<_>>(),
                    want.iter().map(|x| x.0).collect::<Vec<_>>(),
                    "family {fi}, token {t}: {logits:?}"
                );
                for (g, w) in got.iter().zip(&want) {
                    assert!((f64::from(g.1) - w.1).abs() < 1e-5, "family {fi}, token {t}: {got:?} vs {want:?}");
                }
            }
        }
    }

    /// Hand-computed: softmax weights renormalized over the chosen (Qwen3-MoE), and gpt-oss's
    /// softmax over the chosen logits, which ignores every expert not chosen.
    #[test]
    fn softmax_rules_by_hand() {
        let logits = [2.0f32, 0.0, 1.0, -1.0];
        let q = Routing {
            scoring: Scoring::Softmax,
            top_k: 2,
            norm_topk_prob: true,
            scaling: 1.0,
            n_group: 1,
            topk_group: 1,
        };
        let r = q.route(&logits, None);
        let (a, b) = (2f32.exp(), 1f32.exp());
        assert_eq!((r[0].0, r[1].0), (0, 2));
        assert!((r[0].1 - a / (a + b)).abs() < 1e-6 && (r[1].1 - b / (a + b)).abs() < 1e-6, "{r:?}");
        // Without renormalization the weights are the full softmax's.
        let z: f32 = logits.iter().map(|x| x.exp()).sum();
        let r = Routing { norm_topk_prob: false, ..q }.route(&logits, None);
        assert!((r[0].1 - a / z).abs() < 1e-6, "{r:?}");
        // gpt-oss: the same choice; its weights equal the renormalized softmax ones.
        let g = Routing { scoring: Scoring::SoftmaxSelected, norm_topk_prob: false, ..q };
        let r = g.route(&logits, None);
        assert!((r[0].1 - a / (a + b)).abs() < 1e-6, "{r:?}");
    }
}
