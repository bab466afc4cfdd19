//! The calibration hook. A model with an observer set reports the input of every linear layer
//! it runs, under the layer's Hugging Face module name, so calibration (input amax for
//! ModelOpt's `input_scale`, GPTQ Hessians) lives in `sparrow-convert` instead of inside the
//! serving forward. The shape follows mistral.rs's `QuantMethod::begin_track_stats`, as a hook
//! rather than a method on every weight.

use sparrow_cpu::{Isa, ThreadPool};

/// Receives linear-layer inputs during a forward (calibration only; serving sets none).
pub trait Observer: Send {
    /// `x` (`[rows × cols]` row-major f32, `cols = x.len() / rows`) is the input of the linear
    /// modules `modules` (state-dict prefixes such as `model.layers.3.self_attn.q_proj`; several
    /// when they share the input, as q/k/v and gate/up do). `pool` and `isa` are the model's, for
    /// observers that do heavy work (an `XᵀX` per call).
    fn linear_input(&mut self, pool: &ThreadPool, isa: Isa, modules: &[String], x: &[f32], rows: usize);

    /// The observer as `Any`, so whoever set it can take its concrete type back after the run.
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any>;
}

/// A model's optional observer, as the models store it.
pub type ObserverSlot = Option<Box<dyn Observer>>;
