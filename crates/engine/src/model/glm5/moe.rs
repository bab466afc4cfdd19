//! GLM-5's feed-forward: a dense SwiGLU MLP in the first layers, then a Mixture-of-Experts with
//! sigmoid routing, a correction bias, group-limited top-k and shared experts (DeepSeek-V3
//! §2.1.2; HF transformers `modeling_glm_moe_dsa.py`, `GlmMoeDsaMoE` / `GlmMoeDsaTopkRouter`).
//!
//! Routing (layers `≥ first_k_dense_replace`): `s = sigmoid(gate(h))` (f32); choice scores
//! `s + e_score_correction_bias`; groups ranked by the sum of their top-2 choice scores, the
//! best `topk_group` kept; the top `num_experts_per_tok` experts of those by choice score;
//! weights are `s` (without the bias) of the chosen, divided by their sum when
//! `norm_topk_prob`, times `routed_scaling_factor` exactly once. Output
//! `Σ_k w_k · E_k(h) + shared(h)`, every expert a SwiGLU MLP.
//!
//! The experts, their two implementations and the combine are the shared [`crate::model::moe`];
//! GLM-5's part is its rule ([`routing`]) and the dense-or-MoE choice per layer.

use super::{Glm5Config, Step, Work};
use crate::model::moe::{Mlp, Moe};
use crate::model::routing::Routing;

/// The model's routing rule as data: GLM-5's and DeepSeek-V3's sigmoid scores (DeepSeek-V2's
/// softmax), the correction bias when the layer has one, group-limited top-k.
pub fn routing(c: &Glm5Config) -> Routing {
    Routing {
        scoring: c.scoring,
        top_k: c.top_k,
        norm_topk_prob: c.norm_topk_prob,
        scaling: c.routed_scaling,
        n_group: c.n_group,
        topk_group: c.topk_group,
    }
}

/// Chooses the experts of one token: returns `(expert, weight)` in selection order.
///
/// `logits` are the router's `[n_routed]` outputs; see the module docs for the rule.
pub fn route(c: &Glm5Config, logits: &[f32], bias: &[f32]) -> Vec<(usize, f32)> {
    routing(c).route(logits, Some(bias))
}

/// A layer's feed-forward: dense in the first layers, MoE after.
// One per layer, built once and never moved on a hot path.
#[allow(clippy::large_enum_variant)]
pub(super) enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

impl Ffn {
    /// The feed-forward on the step's rows `x` (`[tokens × hidden]`).
    pub(super) fn forward(&self, s: &Step<'_>, x: &[f32], w: &mut Work<'_>) -> Vec<f32> {
        let t_n = s.batch.num_tokens();
        // Written whole: by the dense MLP's GEMM, or by the MoE's combine, which starts each
        // row from zero.
        let mut out = w.bufs.take(t_n * s.cfg.hidden);
        match self {
            Ffn::Dense(m) => m.forward(&mut w.cx, x, t_n, &mut w.bufs, &mut out),
            Ffn::Moe(m) => {
                m.forward(&mut w.cx, s.opts.moe.pick(t_n), x, t_n, &mut w.bufs, &mut out);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MoeImpl;
    use crate::model::moe::MoeChoice;
    use crate::model::routing::Scoring;

    fn cfg() -> Glm5Config {
        Glm5Config {
            hidden: 8,
            layers: 1,
            heads: 1,
            q_lora_rank: 8,
            kv_lora_rank: 8,
            qk_nope: 4,
            qk_rope: 4,
            v_dim: 4,
            n_routed: 8,
            top_k: 2,
            n_shared: 1,
            moe_inter: 4,
            inter: 8,
            first_k_dense: 0,
            mlp_dense: vec![false],
            scoring: Scoring::Sigmoid,
            routed_scaling: 2.5,
            n_group: 4,
            topk_group: 2,
            norm_topk_prob: true,
            idx_heads: 2,
            idx_dim: 8,
            idx_topk: 4,
            indexer_full: vec![true],
            rope_theta: 10000.0,
            softmax_scale: 0.5,
            lora_eps: 1e-6,
            rms_eps: 1e-6,
            vocab: 10,
            max_positions: 16,
            tie_word_embeddings: false,
        }
    }

    /// Hand-computed routing: sigmoid(0) = 0.5, the bias steers the choice but not the weight,
    /// groups are ranked by their top-2 sum, weights normalized then scaled by 2.5 once.
    #[test]
    fn routing_by_hand() {
        let c = cfg();
        // Groups of 2: {0,1} {2,3} {4,5} {6,7}.
        let logits = [0.0, 0.0, 2.0, -2.0, 1.0, 1.0, 3.0, -9.0];
        let bias = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0, 0.0];
        let s = |x: f32| 1.0 / (1.0 + (-x).exp());
        // Choice scores: g0 = 0.5+0.5 = 1.0; g1 = s(2)+s(-2) = 1.0; g2 = 2·s(1) = 1.462;
        // g3 = s(3)−1 + s(−9) = −0.047. Groups kept: g2, then g0 and g1 tie at 1.0 → g0.
        let r = route(&c, &logits, &bias);
        let experts: Vec<usize> = r.iter().map(|x| x.0).collect();
        assert_eq!(experts, vec![4, 5]);
        let (w4, w5) = (s(1.0), s(1.0));
        assert!((r[0].1 - 2.5 * w4 / (w4 + w5)).abs() < 1e-6 && (r[1].1 - 1.25).abs() < 1e-6, "{r:?}");
        // Bias only in the choice: expert 6 (raw 0.95) loses its group to the others.
        let mut c2 = c.clone();
        c2.norm_topk_prob = false;
        c2.n_group = 1;
        c2.topk_group = 1;
        let r = route(&c2, &logits, &bias);
        // Choice: e2 = s(2) = 0.881, e6 = s(3) − 1 = −0.047; e4 = e5 = 0.731.
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![2, 4]);
        assert!((r[0].1 - 2.5 * s(2.0)).abs() < 1e-6);
    }

    #[test]
    fn moe_choice_buckets() {
        let b = MoeChoice::Buckets(vec![(1, MoeImpl::TokenMajor), (8, MoeImpl::ExpertMajor)]);
        assert_eq!(
            (b.pick(1), b.pick(2), b.pick(100)),
            (MoeImpl::TokenMajor, MoeImpl::ExpertMajor, MoeImpl::ExpertMajor)
        );
        assert_eq!(MoeChoice::Fixed(MoeImpl::TokenMajor).pick(64), MoeImpl::TokenMajor);
    }
}
