//! The model layer's linear projection and the context a forward pass carries.
//!
//! A [`Linear`] owns its work: the matmul over its weight, the calibration observer's report of
//! its input under its Hugging Face module names, and its share of the profile's matmul time.
//! The shape is mistral.rs's `QuantMethod` (`forward` plus `begin_track_stats`), reduced to
//! what our models call. Before it, each model wrote the observer block and the timer around
//! every matmul by hand and built the module names with `format!` on every forward.

use super::observer::ObserverSlot;
use super::PartTimes;
use sparrow_cpu::format::ggml::QActs;
use sparrow_cpu::{kernels, Isa, ThreadPool, Weight};

/// A linear layer `y = x · Wᵀ` with the names calibration knows it by.
#[derive(Debug, Clone)]
pub struct Linear {
    /// The matrix, `[out × in]`, at its file's size (several projections stacked when they
    /// share an input: q/k/v, gate/up).
    pub weight: Weight,
    /// The bias added to every output row (`out_features` values), when the module has one
    /// (Qwen2's Q/K/V projections, `{module}.bias`).
    pub bias: Option<Vec<f32>>,
    /// The HF modules it computes (`model.layers.3.self_attn.q_proj`, …), one per stacked
    /// part, in the stack's order: what the observer is told.
    pub modules: Vec<String>,
}

impl Linear {
    /// A layer over `weight` (no bias) computing the HF modules `modules`.
    pub fn new(weight: Weight, modules: Vec<String>) -> Linear {
        Linear { weight, bias: None, modules }
    }

    /// One layer computing `parts` in order (projections that share an input: q/k/v,
    /// gate/up), their weights stacked by [`Weight::stack`]; when some part has a bias, the
    /// stack's bias is theirs concatenated, zeros for the parts without.
    pub fn stack(parts: Vec<Linear>) -> Linear {
        let any_bias = parts.iter().any(|l| l.bias.is_some());
        let mut bias = Vec::new();
        let (mut weights, mut modules) = (Vec::new(), Vec::new());
        for l in parts {
            if any_bias {
                match l.bias {
                    Some(b) => bias.extend(b),
                    None => bias.extend(std::iter::repeat_n(0.0, l.weight.rows())),
                }
            }
            weights.push(l.weight);
            modules.extend(l.modules);
        }
        Linear { weight: Weight::stack(weights), bias: any_bias.then_some(bias), modules }
    }

    /// Output features.
    pub fn out_features(&self) -> usize {
        self.weight.rows()
    }

    /// `out[t·out_features + r] = Σ_k x[t·in + k] · W[r][k] + bias[r]` for the `rows` token rows of `x`
    /// (`[rows × in]` row-major f32). Reports the input to the observer first and adds the
    /// matmul's wall time to the profile, when the context has them.
    pub fn forward(&self, cx: &mut Fwd<'_>, x: &[f32], rows: usize, out: &mut [f32]) {
        self.observe(cx.observer, cx.pool, cx.isa, x, rows);
        self.forward_observed(cx, x, rows, out);
    }

    /// [`Linear::forward`] for an input the observer was already told of, with the other
    /// layers reading it ([`observe_shared`]).
    pub fn forward_observed(&self, cx: &mut Fwd<'_>, x: &[f32], rows: usize, out: &mut [f32]) {
        cx.matmul(&self.weight, x, rows, out);
        self.add_bias(cx.pool, out, rows);
    }

    /// Adds the bias (when there is one) to each of the `rows` output rows of `out`.
    fn add_bias(&self, pool: &ThreadPool, out: &mut [f32], rows: usize) {
        if let Some(b) = &self.bias {
            pool.par_rows(&mut out[..rows * b.len()], b.len(), |_, row| {
                row.iter_mut().zip(b).for_each(|(y, b)| *y += b);
            });
        }
    }

    /// Tells `obs` (when set) that `x` (`rows` rows) is this layer's input, under its modules'
    /// names.
    fn observe(&self, obs: &mut ObserverSlot, pool: &ThreadPool, isa: Isa, x: &[f32], rows: usize) {
        if let Some(o) = obs.as_mut() {
            o.linear_input(pool, isa, &self.modules, x, rows);
        }
    }
}

/// Tells `obs` (when set) that `x` (`rows` rows) is the input of every layer of `layers`, in
/// one report (several projections reading the same rows: an observer that builds `XᵀX` builds
/// it once).
pub fn observe_shared(obs: &mut ObserverSlot, pool: &ThreadPool, isa: Isa, layers: &[&Linear], x: &[f32], rows: usize) {
    if let Some(o) = obs.as_mut() {
        let modules: Vec<String> = layers.iter().flat_map(|l| l.modules.iter().cloned()).collect();
        o.linear_input(pool, isa, &modules, x, rows);
    }
}

/// One expert's share of a grouped GEMM ([`gather_forward`]): a [`Linear`] over its own rows of
/// the gathered activations.
pub struct Gathered<'a> {
    /// The expert's projection.
    pub linear: &'a Linear,
    /// Its rows, `[rows × in]`.
    pub x: &'a [f32],
    /// How many.
    pub rows: usize,
    /// Its output rows, `[rows × out]`.
    pub out: &'a mut [f32],
}

/// The `gather_forward` of a MoE layer's experts: every part's input reported to the observer
/// (in the order given), then all the matmuls as one grouped GEMM ([`kernels::matmul_grouped`]:
/// one fork-join of the pool for the layer), its wall time shared out over the weights by bytes,
/// then each part's bias, if it has one, added to its rows (as [`Linear::forward`] adds it).
/// Parts without rows are skipped.
pub fn gather_forward(cx: &mut Fwd<'_>, parts: Vec<Gathered<'_>>) {
    let mut jobs = Vec::with_capacity(parts.len());
    let mut linears = Vec::with_capacity(parts.len());
    for p in parts.into_iter().filter(|p| p.rows > 0) {
        p.linear.observe(cx.observer, cx.pool, cx.isa, p.x, p.rows);
        linears.push(p.linear);
        jobs.push(kernels::GemmJob { w: &p.linear.weight, x: p.x, tokens: p.rows, out: p.out });
    }
    let t0 = cx.parts.is_some().then(std::time::Instant::now);
    kernels::matmul_grouped(cx.pool, cx.isa, &mut jobs, &mut cx.xq);
    if let (Some(pt), Some(t0)) = (cx.parts.as_deref_mut(), t0) {
        let secs = t0.elapsed().as_secs_f64();
        let total: usize = linears.iter().map(|l| l.weight.bytes()).sum::<usize>().max(1);
        for l in &linears {
            pt.add_gemm(&l.weight, secs * l.weight.bytes() as f64 / total as f64);
        }
    }
    for (job, l) in jobs.iter_mut().zip(&linears) {
        l.add_bias(cx.pool, job.out, job.tokens);
    }
}

/// What one forward pass carries through its layers: the compute pool and instruction set,
/// the matmuls' activation scratch, the calibration observer (serving has none) and the part
/// times (`Some` while profiling).
pub struct Fwd<'a> {
    /// The model's compute pool.
    pub pool: &'a ThreadPool,
    /// The instruction set the kernels run.
    pub isa: Isa,
    /// The activations' quantization scratch of every matmul (Q8 rows for the integer
    /// kernels), kept by the model across forwards.
    pub xq: QActs,
    /// Told the input of every [`Linear`] that runs.
    pub observer: &'a mut ObserverSlot,
    /// Where the wall times go while the model is profiled.
    pub parts: Option<&'a mut PartTimes>,
}

impl Fwd<'_> {
    /// `out = x · wᵀ` for the `rows` rows of `x`, its wall time added to the profile's matmul
    /// share (and its weight type's) while profiling; the observer is not told: for weights
    /// that are no module calibration quantizes (GLM-5's router).
    pub fn matmul(&mut self, w: &Weight, x: &[f32], rows: usize, out: &mut [f32]) {
        let t0 = self.parts.is_some().then(std::time::Instant::now);
        kernels::matmul(self.pool, self.isa, w, x, rows, &mut self.xq, out);
        if let (Some(p), Some(t0)) = (self.parts.as_deref_mut(), t0) {
            p.add_gemm(w, t0.elapsed().as_secs_f64());
        }
    }

    /// Runs `f`, adding its wall time to the part `pick` chooses while profiling.
    pub fn timed<R>(&mut self, pick: fn(&mut PartTimes) -> &mut f64, f: impl FnOnce() -> R) -> R {
        let t0 = self.parts.is_some().then(std::time::Instant::now);
        let r = f();
        if let (Some(p), Some(t0)) = (self.parts.as_deref_mut(), t0) {
            *pick(p) += t0.elapsed().as_secs_f64();
        }
        r
    }
}
