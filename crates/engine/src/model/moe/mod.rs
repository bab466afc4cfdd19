//! The Mixture-of-Experts feed-forward every MoE family shares (GLM-5's checkpoint path and the
//! GGUF families `qwen3moe`, …): a router, a routing rule as data ([`Routing`]), routed
//! experts and optional shared experts, each a SwiGLU MLP (Shazeer et al. 2017; Fedus et al.
//! 2021; the combine of llama.cpp's `build_moe_ffn`, `src/llama-graph.cpp`).
//!
//! Output `Σ_k w_k · E_k(h) + shared(h)`, every expert a SwiGLU MLP.
//!
//! Two implementations, selected like SGLang's `--moe-runner-backend`:
//! [`MoeImpl::TokenMajor`] runs each (token, expert) pair as its own GEMV;
//! [`MoeImpl::ExpertMajor`] gathers the tokens routed to each expert and runs one grouped GEMM
//! per projection over all experts. Every kernel computes each token with its own
//! accumulators, so both give bit-identical outputs; which is faster depends on the batch
//! size, hence GLM-5's start-up autotune ([`crate::tune::moe`]).

use sparrow_cpu::{kernels, Weight};

mod load;

pub use load::{MoeConfig, MoeFamily};

use crate::config::MoeImpl;
use crate::model::common::Scratch;
use crate::model::linear::{gather_forward, Fwd, Gathered, Linear};
use crate::model::routing::Routing;

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

/// A model's first MoE layer with the pool and instruction set its forward runs on: what the
/// start-up autotune times ([`crate::model::Model::first_moe`], [`crate::tune::moe`]).
pub struct MoeBench<'a> {
    /// The layer.
    pub moe: &'a Moe,
    /// The model's compute pool.
    pub pool: &'a sparrow_cpu::ThreadPool,
    /// The model's instruction set.
    pub isa: sparrow_cpu::Isa,
}

/// A gated MLP: fused `[gate; up]` (`[2·inter × hidden]`), its activation, and `down`
/// (`[hidden × inter]`).
pub struct Mlp {
    pub(crate) gate_up: Linear,
    pub(crate) down: Linear,
    pub(crate) inter: usize,
    pub(crate) act: Glu,
}

/// A gated MLP's activation of `(gate, up)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Glu {
    /// SwiGLU, `silu(gate) · up` (Shazeer 2020).
    Silu,
    /// GeGLU with the tanh GELU, `gelu_tanh(gate) · up` (Gemma).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU (llama.cpp's `ggml_swiglu_oai`, HF `GptOssExperts`):
    /// `x = min(gate, limit)`, `y = clamp(up, −limit, limit)`, `x · σ(alpha · x) · (y + 1)`.
    SwigluOai {
        /// 1.702 in gpt-oss.
        alpha: f32,
        /// 7 in gpt-oss.
        limit: f32,
    },
    /// Not gated: `relu(up)²` (Nemotron-H's MLP, llama.cpp `LLM_FFN_RELU_SQR` without a gate
    /// tensor); the MLP has no gate projection.
    Relu2,
}

impl Glu {
    /// Whether the activation reads a gate projection beside `up` (all but [`Glu::Relu2`]).
    pub fn gated(self) -> bool {
        !matches!(self, Glu::Relu2)
    }
}

/// The routed experts of one MoE layer, its router and its routing rule.
pub struct Moe {
    /// The router, `[n_experts × hidden]` (f32 in every file we read: llama-quantize and
    /// ModelOpt leave it unquantized).
    pub(crate) gate: Weight,
    /// The router's bias (gpt-oss, `ffn_gate_inp.bias`), `[n_experts]`.
    pub(crate) gate_bias: Option<Vec<f32>>,
    /// The selection bias (`e_score_correction_bias`, GGUF `exp_probs_b`), `[n_experts]`.
    pub(crate) bias: Option<Vec<f32>>,
    /// How router logits choose and weigh experts.
    pub(crate) routing: Routing,
    pub(crate) experts: Vec<Mlp>,
    /// Shared experts, every token through them, as one MLP (their widths summed).
    pub(crate) shared: Option<Mlp>,
    /// The shared experts' gate (Qwen2-MoE, Qwen3-Next, Qwen3.5-MoE: `shared_expert_gate`,
    /// GGUF `ffn_gate_inp_shexp`), `[hidden]`: their output × `σ(x · gate)` per token.
    pub(crate) shared_gate: Option<Vec<f32>>,
}

impl Mlp {
    /// `out = down(act(gate(x)) · up(x))` (or `down(act(up(x)))` when not gated) for `tokens`
    /// rows of `x` (`[tokens × hidden]`), its buffers from `bufs`.
    pub fn forward(&self, cx: &mut Fwd<'_>, x: &[f32], tokens: usize, bufs: &mut Scratch, out: &mut [f32]) {
        // Both written whole (a GEMM's output, the activation's).
        let mut gu = bufs.take(tokens * self.gu_width());
        let mut act = bufs.take(tokens * self.inter);
        self.forward_with(cx, x, tokens, &mut gu, &mut act, out);
        bufs.give(gu);
        bufs.give(act);
    }

    /// Width of the first projection's output row: `2 · inter` (gate and up), `inter` when the
    /// activation is not gated.
    pub fn gu_width(&self) -> usize {
        if self.act.gated() {
            2 * self.inter
        } else {
            self.inter
        }
    }

    /// [`Mlp::forward`] into the caller's buffers: `gu` (`[tokens × gu_width]`) and `act`
    /// (`[tokens × inter]`), at least that long (a dense decoder keeps them across steps).
    pub fn forward_with(
        &self,
        cx: &mut Fwd<'_>,
        x: &[f32],
        tokens: usize,
        gu: &mut [f32],
        act: &mut [f32],
        out: &mut [f32],
    ) {
        let (gu, act) = (&mut gu[..tokens * self.gu_width()], &mut act[..tokens * self.inter]);
        self.gate_up.forward(cx, x, tokens, gu);
        swiglu(cx, gu, self.inter, self.act, act);
        self.down.forward(cx, act, tokens, out);
    }

    /// Bytes of its weights.
    pub fn bytes(&self) -> usize {
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
                match &self.shared_gate {
                    Some(g) => {
                        let xt = &x[t * hidden..(t + 1) * hidden];
                        let w = kernels::recurrent::sigmoid(kernels::recurrent::dot_lanes(xt, g));
                        o.iter_mut().zip(&s[t * hidden..]).for_each(|(o, s)| *o += w * s);
                    }
                    None => o.iter_mut().zip(&s[t * hidden..]).for_each(|(o, s)| *o += s),
                }
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
        let gu_w = self.experts.first().map_or(0, Mlp::gu_width);
        let mut gu = bufs.take(pairs * gu_w);
        let mut gu_sh = bufs.take(tokens * self.shared.as_ref().map_or(0, Mlp::gu_width));
        gather_forward(cx, self.gathered(|m| &m.gate_up, &start, &xs, &mut gu, x, &mut gu_sh));
        let (mut act, mut act_sh) = (bufs.take(pairs * inter), bufs.take(tokens * sh_inter));
        let act_of = |m: Option<&Mlp>| m.map_or(Glu::Silu, |m| m.act);
        swiglu(cx, &gu, inter, act_of(self.experts.first()), &mut act);
        swiglu(cx, &gu_sh, sh_inter, act_of(self.shared.as_ref()), &mut act_sh);
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

    /// Routes every token of `x` (`[tokens × hidden]`) by the layer's rule: `(expert, weight)`
    /// per token in selection order. The router's matmul counts as one in the profile.
    pub fn routes(&self, cx: &mut Fwd<'_>, x: &[f32], tokens: usize) -> Vec<Vec<(usize, f32)>> {
        let n = self.experts.len();
        let mut logits = vec![0f32; tokens * n];
        cx.matmul(&self.gate, x, tokens, &mut logits);
        if let Some(b) = &self.gate_bias {
            logits.chunks_exact_mut(n).for_each(|l| l.iter_mut().zip(b).for_each(|(l, b)| *l += b));
        }
        let bias = self.bias.as_deref();
        logits.chunks_exact(n).map(|l| self.routing.route(l, bias)).collect()
    }

    /// The layer on `tokens` rows of `x` (`[tokens × hidden]`) into `out` (written whole):
    /// route, then [`Moe::forward_routed`] with implementation `imp`.
    pub fn forward(
        &self,
        cx: &mut Fwd<'_>,
        imp: MoeImpl,
        x: &[f32],
        tokens: usize,
        bufs: &mut Scratch,
        out: &mut [f32],
    ) {
        let routes = self.routes(cx, x, tokens);
        self.forward_routed(cx, imp, &routes, x, bufs, out);
    }

    /// Experts per token.
    pub fn top_k(&self) -> usize {
        self.routing.top_k
    }

    /// Bytes one token reads: the router, `top_k` routed experts (all experts are one size)
    /// and the shared experts.
    pub fn active_bytes(&self) -> usize {
        let per = self.experts.first().map_or(0, Mlp::bytes);
        self.gate.bytes()
            + self.routing.top_k.min(self.experts.len()) * per
            + self.shared.as_ref().map_or(0, Mlp::bytes)
    }

    /// Routed experts.
    pub fn num_experts(&self) -> usize {
        self.experts.len()
    }

    /// Hidden size (the router's input width).
    pub fn hidden(&self) -> usize {
        self.gate.cols()
    }

    /// A routed expert's inner width.
    pub fn expert_inter(&self) -> usize {
        self.experts.first().map_or(0, |m| m.inter)
    }

    /// The shared experts' inner width together (0 for none).
    pub fn shared_inter(&self) -> usize {
        self.shared.as_ref().map_or(0, |m| m.inter)
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
    pub fn bytes(&self) -> usize {
        self.gate.bytes() + self.experts.iter().chain(self.shared.iter()).map(Mlp::bytes).sum::<usize>()
    }
}

/// [`crate::model::ModelInfo::active_weight_bytes`] of a model holding `weight_bytes` whose MoE
/// layers are `moes`: each MoE layer counted at what one token reads of it ([`Moe::active_bytes`]),
/// and without the embedding table when the head is separate (`separate_head`: a token reads
/// one row of `embed`); `None` for a model with no MoE layer.
pub fn active_weight_bytes<'a>(
    weight_bytes: usize,
    moes: impl IntoIterator<Item = &'a Moe>,
    embed: &Weight,
    separate_head: bool,
) -> Option<usize> {
    let (mut any, mut all, mut active) = (false, 0, 0);
    for m in moes {
        (any, all, active) = (true, all + m.bytes(), active + m.active_bytes());
    }
    let embed_unread = if separate_head { embed.bytes() } else { 0 };
    any.then(|| weight_bytes - all + active - embed_unread)
}

/// The gated activation of every row of `gu` (`[gate (inter), up (inter)]` per row, or
/// `[up (inter)]` for [`Glu::Relu2`]) into `act` (`inter` wide).
fn swiglu(cx: &Fwd<'_>, gu: &[f32], inter: usize, glu: Glu, act: &mut [f32]) {
    let isa = cx.isa;
    let w = if glu.gated() { 2 * inter } else { inter };
    cx.pool.par_rows(act, inter, |t, a| {
        let g = &gu[t * w..(t + 1) * w];
        match glu {
            Glu::Relu2 => a.iter_mut().zip(g).for_each(|(o, &u)| *o = u.max(0.0) * u.max(0.0)),
            Glu::Silu => kernels::silu_mul(isa, &g[..inter], &g[inter..], a),
            Glu::GeluTanh => kernels::gelu_tanh_mul(&g[..inter], &g[inter..], a),
            Glu::SwigluOai { alpha, limit } => {
                for ((o, &gate), &up) in a.iter_mut().zip(&g[..inter]).zip(&g[inter..]) {
                    let x = gate.min(limit);
                    let y = up.clamp(-limit, limit);
                    *o = x / (1.0 + (-alpha * x).exp()) * (y + 1.0);
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::routing::Scoring;
    use sparrow_cpu::format::ggml::QActs;
    use sparrow_cpu::{Isa, ThreadPool};

    fn dense(rows: usize, cols: usize, seed: u64) -> Weight {
        let mut x = seed;
        let data = (0..rows * cols)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.4
            })
            .collect();
        Weight::Dense { rows, cols, data }
    }

    fn mlp(hidden: usize, inter: usize, seed: u64) -> Mlp {
        Mlp {
            gate_up: Linear::new(dense(2 * inter, hidden, seed), vec![]),
            down: Linear::new(dense(hidden, inter, seed + 1), vec![]),
            inter,
            act: Glu::Silu,
        }
    }

    /// Rows routed to disjoint expert sets in one batch get, under both implementations, the
    /// bits they get alone, and the two implementations agree: a row's output depends on its
    /// own experts only.
    #[test]
    fn disjoint_routes_batched_equal_alone() {
        let (hidden, inter, n) = (64, 32, 8);
        let moe = Moe {
            gate: dense(n, hidden, 7),
            gate_bias: None,
            bias: None,
            routing: Routing {
                scoring: Scoring::Softmax,
                top_k: 2,
                norm_topk_prob: true,
                scaling: 1.0,
                n_group: 1,
                topk_group: 1,
            },
            experts: (0..n).map(|e| mlp(hidden, inter, 100 + 2 * e as u64)).collect(),
            shared: Some(mlp(hidden, inter, 99)),
            shared_gate: Some((0..hidden).map(|i| (i as f32 - 32.0) / 64.0).collect()),
        };
        let pool = ThreadPool::new(2).expect("pool");
        let mut none = None;
        let mut cx = Fwd { pool: &pool, isa: Isa::detect(), xq: QActs::default(), observer: &mut none, parts: None };
        let x: Vec<f32> = match dense(3, hidden, 5) {
            Weight::Dense { data, .. } => data,
            _ => unreachable!(),
        };
        // Token 0 to experts {0, 1}, token 1 to {4, 5}, token 2 to {1, 6}.
        let routes = vec![vec![(0, 0.7), (1, 0.3)], vec![(4, 0.6), (5, 0.4)], vec![(6, 0.9), (1, 0.1)]];
        let mut bufs = Scratch::default();
        let mut together = [vec![0f32; 3 * hidden], vec![0f32; 3 * hidden]];
        for (imp, out) in [MoeImpl::TokenMajor, MoeImpl::ExpertMajor].into_iter().zip(&mut together) {
            moe.forward_routed(&mut cx, imp, &routes, &x, &mut bufs, out);
            for t in 0..3 {
                let mut alone = vec![0f32; hidden];
                let xt = &x[t * hidden..(t + 1) * hidden];
                moe.forward_routed(&mut cx, imp, &routes[t..t + 1], xt, &mut bufs, &mut alone);
                assert_eq!(&out[t * hidden..(t + 1) * hidden], &alone[..], "{imp:?} token {t}");
            }
        }
        assert_eq!(together[0], together[1], "token- and expert-major differ");
        // And the router itself chooses per row: all three together route as each alone.
        let all = moe.routes(&mut cx, &x, 3);
        for t in 0..3 {
            assert_eq!(all[t], moe.routes(&mut cx, &x[t * hidden..(t + 1) * hidden], 1)[0]);
        }
    }
}
