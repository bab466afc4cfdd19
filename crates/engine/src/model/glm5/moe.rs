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
//! Two implementations, selected like SGLang's `--moe-runner-backend`:
//! [`MoeImpl::TokenMajor`] runs each (token, expert) pair as its own GEMV;
//! [`MoeImpl::ExpertMajor`] gathers the tokens routed to each expert and runs one grouped GEMM
//! per expert. The NVFP4 kernel computes every token with its own accumulators, so both give
//! bit-identical outputs; which is faster depends on the batch size, hence the start-up
//! autotune ([`crate::model::autotune`]).

use sparrow_cpu::{kernels, Weight};

use super::{Glm5Config, Step, Work};
use crate::config::MoeImpl;
use crate::model::common::Scratch;
use crate::model::linear::{gather_forward, Fwd, Gathered, Linear};
use crate::model::routing::{Routing, Scoring};

/// Which MoE implementation runs a batch of `tokens` tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MoeChoice {
    /// Always this one.
    Fixed(MoeImpl),
    /// Per batch-size bucket: `(largest token count of the bucket, implementation)`, ascending;
    /// counts beyond the last bucket use the last.
    Buckets(Vec<(usize, MoeImpl)>),
}

impl MoeChoice {
    /// The implementation for a batch of `tokens`.
    pub fn pick(&self, tokens: usize) -> MoeImpl {
        match self {
            MoeChoice::Fixed(m) => *m,
            MoeChoice::Buckets(b) => {
                b.iter().find(|(max, _)| tokens <= *max).or(b.last()).map_or(MoeImpl::ExpertMajor, |(_, m)| *m)
            }
        }
    }
}

/// GLM-5's routing rule as data: sigmoid scores, the correction bias, group-limited top-k.
pub fn routing(c: &Glm5Config) -> Routing {
    Routing {
        scoring: Scoring::Sigmoid,
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

/// A SwiGLU MLP: fused `[gate; up]` and `down`.
pub struct Mlp {
    pub(super) gate_up: Linear,
    pub(super) down: Linear,
    pub(super) inter: usize,
}

/// The routed experts of one MoE layer and its router.
pub struct Moe {
    pub(super) gate: Weight,
    pub(super) bias: Vec<f32>,
    pub(super) experts: Vec<Mlp>,
    pub(super) shared: Option<Mlp>,
}

/// A layer's feed-forward: dense in the first layers, MoE after.
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
                let routes = m.routes(s.cfg, &mut w.cx, x, t_n);
                m.forward_routed(&mut w.cx, s.opts.moe.pick(t_n), &routes, x, &mut w.bufs, &mut out);
            }
        }
        out
    }
}

impl Mlp {
    /// `out = down(silu(gate(x)) · up(x))` for `tokens` rows.
    fn forward(&self, cx: &mut Fwd<'_>, x: &[f32], tokens: usize, bufs: &mut Scratch, out: &mut [f32]) {
        // Both written whole (a GEMM's output, SwiGLU's).
        let mut gu = bufs.take(tokens * 2 * self.inter);
        self.gate_up.forward(cx, x, tokens, &mut gu);
        let mut act = bufs.take(tokens * self.inter);
        swiglu(cx, &gu, self.inter, &mut act);
        self.down.forward(cx, &act, tokens, out);
        bufs.give(gu);
        bufs.give(act);
    }

    /// Bytes of its weights.
    pub(super) fn bytes(&self) -> usize {
        self.gate_up.weight.bytes() + self.down.weight.bytes()
    }
}

impl Moe {
    /// The routed + shared output for the rows of `x` (`[tokens × hidden]`, into `out`), with
    /// the routing of each token given (`routes[t]`, one per row); implementation `imp`.
    /// Activation buffers come from `bufs` and go back to it.
    pub fn forward_routed(
        &self,
        cx: &mut Fwd<'_>,
        imp: MoeImpl,
        routes: &[Vec<(usize, f32)>],
        x: &[f32],
        bufs: &mut Scratch,
        out: &mut [f32],
    ) {
        let hidden = self.gate.cols();
        let pool = cx.pool;
        let tokens = routes.len();
        let k = routes.first().map_or(0, Vec::len);
        // Row at[t·k + j] of `ys` is expert routes[t][j]'s output for token t; `sh` the shared
        // experts' output, `[tokens × hidden]`.
        let (ys, at, sh) = match imp {
            MoeImpl::TokenMajor => {
                let mut y = vec![0f32; tokens * k * hidden];
                for (t, r) in routes.iter().enumerate() {
                    for (j, &(e, _)) in r.iter().enumerate() {
                        let dst = &mut y[(t * k + j) * hidden..(t * k + j + 1) * hidden];
                        self.experts[e].forward(cx, &x[t * hidden..(t + 1) * hidden], 1, bufs, dst);
                    }
                }
                let sh = self.shared.as_ref().map(|m| {
                    let mut s = bufs.take(tokens * hidden);
                    m.forward(cx, x, tokens, bufs, &mut s);
                    s
                });
                (y, (0..tokens * k).collect(), sh)
            }
            MoeImpl::ExpertMajor => self.expert_major(cx, routes, x, hidden, bufs),
        };
        // Per token on the pool: the same sum in the same order on any thread and either
        // implementation: the routed outputs in routing order, then the shared experts'.
        pool.par_rows(out, hidden, |t, o| {
            o.iter_mut().for_each(|v| *v = 0.0);
            for (j, &(_, w)) in routes[t].iter().enumerate() {
                let r = at[t * k + j];
                o.iter_mut().zip(&ys[r * hidden..(r + 1) * hidden]).for_each(|(o, y)| *o += w * y);
            }
            if let Some(s) = &sh {
                o.iter_mut().zip(&s[t * hidden..]).for_each(|(o, s)| *o += s);
            }
        });
        bufs.give(ys);
        if let Some(s) = sh {
            bufs.give(s);
        }
    }

    /// [`MoeImpl::ExpertMajor`]: the tokens routed to each expert gathered into one
    /// expert-sorted batch, then every expert's (and the shared experts') `gate_up` as one
    /// grouped GEMM ([`kernels::matmul_grouped`]), SwiGLU, and every `down` as another: three
    /// fork-joins of the pool for the layer instead of three per expert. Returns the
    /// expert-sorted outputs, the row of (token t, choice j) at `t·k + j`, and the shared
    /// experts' output.
    fn expert_major(
        &self,
        cx: &mut Fwd<'_>,
        routes: &[Vec<(usize, f32)>],
        x: &[f32],
        hidden: usize,
        bufs: &mut Scratch,
    ) -> (Vec<f32>, Vec<usize>, Option<Vec<f32>>) {
        let (tokens, n_e) = (routes.len(), self.experts.len());
        let k = routes.first().map_or(0, Vec::len);
        let inter = self.experts.first().map_or(0, |m| m.inter);
        assert!(self.experts.iter().all(|m| m.inter == inter), "MoE experts of different widths");
        // Expert e's tokens are rows start[e]..start[e + 1], in token order.
        let mut start = vec![0usize; n_e + 1];
        for &(e, _) in routes.iter().flatten() {
            start[e + 1] += 1;
        }
        for e in 0..n_e {
            start[e + 1] += start[e];
        }
        let mut fill = start.clone();
        let mut at = vec![0usize; tokens * k];
        let mut src = vec![0usize; tokens * k];
        for (t, r) in routes.iter().enumerate() {
            for (j, &(e, _)) in r.iter().enumerate() {
                at[t * k + j] = fill[e];
                src[fill[e]] = t;
                fill[e] += 1;
            }
        }
        let pairs = tokens * k;
        // Every buffer below is written whole: gathered rows, GEMM and SwiGLU outputs.
        let mut xs = bufs.take(pairs * hidden);
        cx.pool.par_rows(&mut xs, hidden, |i, row| row.copy_from_slice(&x[src[i] * hidden..(src[i] + 1) * hidden]));
        let sh_inter = self.shared.as_ref().map_or(0, |m| m.inter);
        let mut gu = bufs.take(pairs * 2 * inter);
        let mut gu_sh = bufs.take(tokens * 2 * sh_inter);
        gather_forward(cx, self.gathered(|m| &m.gate_up, &start, &xs, &mut gu, x, &mut gu_sh));
        let (mut act, mut act_sh) = (bufs.take(pairs * inter), bufs.take(tokens * sh_inter));
        swiglu(cx, &gu, inter, &mut act);
        swiglu(cx, &gu_sh, sh_inter, &mut act_sh);
        let mut ys = bufs.take(pairs * hidden);
        let mut sh = self.shared.as_ref().map(|_| bufs.take(tokens * hidden));
        let mut no_shared = Vec::new();
        let sh_out = sh.as_mut().unwrap_or(&mut no_shared);
        gather_forward(cx, self.gathered(|m| &m.down, &start, &act, &mut ys, &act_sh, sh_out));
        for b in [xs, gu, gu_sh, act, act_sh] {
            bufs.give(b);
        }
        (ys, at, sh)
    }

    /// One projection (`pick`: `gate_up` or `down`) of every expert as the parts of one grouped
    /// GEMM: expert `e` over rows `start[e]..start[e + 1]` of `x` into the same rows of `out`,
    /// then the shared experts over every row of `x_sh` into `out_sh` (widths: the
    /// projection's).
    fn gathered<'a>(
        &'a self,
        pick: fn(&Mlp) -> &Linear,
        start: &[usize],
        x: &'a [f32],
        out: &'a mut [f32],
        x_sh: &'a [f32],
        out_sh: &'a mut [f32],
    ) -> Vec<Gathered<'a>> {
        let mut parts = Vec::with_capacity(self.experts.len() + 1);
        let mut rest = out;
        for (e, m) in self.experts.iter().enumerate() {
            let (lin, rows) = (pick(m), start[e + 1] - start[e]);
            let (xw, ow) = (lin.weight.cols(), lin.out_features());
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(rows * ow);
            rest = tail;
            parts.push(Gathered { linear: lin, x: &x[start[e] * xw..start[e + 1] * xw], rows, out: mine });
        }
        if let Some(m) = &self.shared {
            let lin = pick(m);
            parts.push(Gathered { linear: lin, x: x_sh, rows: x_sh.len() / lin.weight.cols(), out: out_sh });
        }
        parts
    }

    /// Routes every token of `x` (`[tokens × hidden]`); the router's matmul counts as one.
    pub fn routes(&self, c: &Glm5Config, cx: &mut Fwd<'_>, x: &[f32], tokens: usize) -> Vec<Vec<(usize, f32)>> {
        let mut logits = vec![0f32; tokens * c.n_routed];
        cx.matmul(&self.gate, x, tokens, &mut logits);
        let r = routing(c);
        logits.chunks_exact(c.n_routed).map(|l| r.route(l, Some(&self.bias))).collect()
    }

    /// Routed experts.
    pub fn num_experts(&self) -> usize {
        self.experts.len()
    }

    /// The experts' weight format (`nvfp4`, `dense` or `gguf`), for autotune's cache key.
    pub fn weight_format(&self) -> &'static str {
        match self.experts.first().map(|e| &e.gate_up.weight) {
            Some(Weight::Nvfp4(_)) => "nvfp4",
            Some(Weight::Quant(_)) => "gguf",
            _ => "dense",
        }
    }

    /// Bytes of its weights (router, routed and shared experts).
    pub(super) fn bytes(&self) -> usize {
        self.gate.bytes() + self.experts.iter().chain(self.shared.iter()).map(Mlp::bytes).sum::<usize>()
    }
}

/// SwiGLU of every row of `gu` (`[gate (inter), up (inter)]` per row) into `act` (`inter` wide).
fn swiglu(cx: &Fwd<'_>, gu: &[f32], inter: usize, act: &mut [f32]) {
    let isa = cx.isa;
    cx.pool.par_rows(act, inter, |t, a| {
        let g = &gu[t * 2 * inter..(t + 1) * 2 * inter];
        kernels::silu_mul(isa, &g[..inter], &g[inter..], a);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

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
            routed_scaling: 2.5,
            n_group: 4,
            topk_group: 2,
            norm_topk_prob: true,
            idx_heads: 2,
            idx_dim: 8,
            idx_topk: 4,
            indexer_full: vec![true],
            rope_theta: 10000.0,
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
