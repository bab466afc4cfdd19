//! Start-up measurement, kept out of the models: the batch cap ([`batch_cap`]: where a larger
//! DECODE batch stops paying) and the MoE implementation per batch size ([`moe`], after
//! SGLang's fused-MoE tuning), each timed on the loaded model and cached as JSON keyed by the
//! shapes, the instruction set, the threads and the kernels' generation.

pub mod batch_cap;
pub mod moe;
