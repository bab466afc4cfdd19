//! Sparrow's CPU layer: everything that touches the machine directly, and the only crate where
//! `unsafe` is allowed (the rest of the workspace forbids it).
//!
//! Modules, bottom up:
//! - [`isa`]: instruction-set detection, once at start-up ([`Isa`]);
//! - [`pool`]: fork-join thread pool and the safe parallel-rows helpers the models use;
//! - [`mmap`]: the one wrapper over `memmap2`, used by the checkpoint loaders and the tokenizer;
//! - [`mem`]: the process's allocator settings for per-step activation buffers, and
//!   [`mem::HugeBytes`], the huge-page buffers weights live in;
//! - [`half`]: IEEE half <-> f32, bf16, FP8 E4M3 / E5M2;
//! - [`format`]: GGML blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K repacked at their
//!   file's size as [`format::qmatrix::QMatrix`]; F16/BF16/F32 dense; 8-bit activations) and
//!   ModelOpt NVFP4 (E2M1 codes, E4M3 block scales, quantizer);
//! - [`weight`]: [`Weight`], a linear layer's matrix in the form the kernels take;
//! - [`kernels`]: batched matmul (GGML integer types, NVFP4, dense), tiled flash attention over
//!   the paged cache, the DSA indexer's scores, element-wise ops; each SIMD path bit-identical
//!   to its scalar reference;
//! - [`roofline`]: the machine's measured limits (clock, bandwidth, 8-bit and f32 peaks per
//!   path) beside their theoretical values.

pub mod format;
pub mod guard;
pub mod half;
pub mod isa;
pub mod kernels;
pub mod mem;
pub mod mmap;
pub mod pool;
pub mod roofline;
pub mod weight;

/// The generation of the kernels' speed: bump it whenever a change makes a kernel faster or
/// slower, so that timings cached at start-up (the batch cap, GLM-5's MoE autotune, both keyed
/// by it) are measured again instead of describing an older build.
pub const KERNEL_GENERATION: u32 = 7;

pub use isa::Isa;
pub use mmap::Mapped;
pub use pool::ThreadPool;
pub use weight::Weight;
