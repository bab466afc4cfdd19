//! Calibration: the [`Observer`] that `sparrow quantize` sets on a model while it runs
//! calibration text, collecting per linear module the largest |input| (ModelOpt's
//! `input_scale = amax / (6 · 448)`) and, for GPTQ, the Hessian `Σ_t x_t x_tᵀ` of its input.
//!
//! Modules that share an input (q/k/v, gate/up) are reported together; their statistics are
//! computed once and given to each.

use std::collections::HashMap;

use sparrow_cpu::format::ggml::QActs;
use sparrow_cpu::{kernels, Isa, ThreadPool, Weight};
use sparrow_engine::model::observer::Observer;
use sparrow_engine::model::Model;
use sparrow_engine::EngineError;

/// What one group of modules that share an input has seen.
#[derive(Debug, Clone, Default)]
struct GroupStats {
    modules: Vec<String>,
    amax: f32,
    /// `[K × K]` row-major, f64; empty unless Hessians are collected.
    hessian: Vec<f64>,
}

/// The calibration observer. Set it with the model's `set_observer`, run text, take it back
/// and call [`InputStats::finish`].
#[derive(Debug, Default)]
pub struct InputStats {
    hessians: bool,
    groups: Vec<GroupStats>,
    index: HashMap<String, usize>,
}

/// Calibration results keyed by module name (state-dict prefix).
#[derive(Debug, Clone, Default)]
pub struct Calibration {
    /// Largest |input| per module.
    pub input_amax: HashMap<String, f32>,
    /// Input Hessian per module (`[K × K]` row-major f64), when collected.
    pub hessians: HashMap<String, Vec<f64>>,
}

impl InputStats {
    /// An observer that collects input amax always, and the GPTQ Hessians when `hessians`.
    pub fn new(hessians: bool) -> Self {
        InputStats { hessians, ..Default::default() }
    }

    /// Per-module results (each module of a shared-input group gets the group's statistics).
    pub fn finish(self) -> Calibration {
        let mut c = Calibration::default();
        for g in self.groups {
            for m in &g.modules {
                c.input_amax.insert(m.clone(), g.amax);
                if self.hessians {
                    c.hessians.insert(m.clone(), g.hessian.clone());
                }
            }
        }
        c
    }
}

impl Observer for InputStats {
    fn linear_input(&mut self, pool: &ThreadPool, isa: Isa, modules: &[String], x: &[f32], rows: usize) {
        let Some(first) = modules.first() else { return };
        let i = match self.index.get(first) {
            Some(&i) => i,
            None => {
                self.groups.push(GroupStats { modules: modules.to_vec(), ..Default::default() });
                self.index.insert(first.clone(), self.groups.len() - 1);
                self.groups.len() - 1
            }
        };
        let g = &mut self.groups[i];
        g.amax = g.amax.max(sparrow_cpu::format::nvfp4::amax(x));
        if self.hessians && rows > 0 {
            add_xtx(pool, isa, x, rows, x.len() / rows, &mut g.hessian);
        }
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

/// The results of the [`InputStats`] a model gives back from `take_observer` (empty when it
/// held none, or another observer).
pub fn take_stats(observer: Option<Box<dyn Observer>>) -> Calibration {
    observer.and_then(|o| o.into_any().downcast::<InputStats>().ok()).map(|s| s.finish()).unwrap_or_default()
}

/// Adds `XᵀX` of `x` (`[tokens, k]`) into `h` (`[k, k]`), with the f32 GEMM kernel on the
/// pool (one token block at a time, summed in f64).
fn add_xtx(pool: &ThreadPool, isa: Isa, x: &[f32], tokens: usize, k: usize, h: &mut Vec<f64>) {
    h.resize(k * k, 0.0);
    let mut xt = vec![0f32; k * tokens];
    for t in 0..tokens {
        for i in 0..k {
            xt[i * tokens + t] = x[t * k + i];
        }
    }
    let w = Weight::Dense { rows: k, cols: tokens, data: xt.clone() };
    let mut out = vec![0f32; k * k];
    kernels::matmul(pool, isa, &w, &xt, k, &mut QActs::default(), &mut out);
    h.iter_mut().zip(&out).for_each(|(a, b)| *a += *b as f64);
}

/// Runs `model` over `texts`, one sequence at a time from position 0 (the observer, if set,
/// sees every token).
///
/// # Errors
/// A forward error.
pub fn run_texts(model: &mut dyn Model, texts: &[Vec<u32>]) -> Result<(), EngineError> {
    crate::perplexity::forward_each(model, texts, false, |_, _| ())
}

/// Runs `model` over `texts` with an [`InputStats`] observer set (collecting GPTQ Hessians when
/// `hessians`) and returns what it saw: any model that reports its linear inputs
/// ([`Model::set_observer`]) calibrates the same way.
///
/// # Errors
/// What a forward returns.
pub fn calibrate(model: &mut dyn Model, texts: &[Vec<u32>], hessians: bool) -> Result<Calibration, EngineError> {
    model.set_observer(Some(Box::new(InputStats::new(hessians))));
    let run = run_texts(model, texts);
    let stats = take_stats(model.take_observer());
    run.map(|()| stats)
}
