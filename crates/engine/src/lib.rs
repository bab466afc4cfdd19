//! Sparrow's engine: one thread owns the scheduler, the paged KV cache and the model runner.
//!
//! Modules, bottom up:
//! - [`quant`]: GGML block formats and the affine 4/8-bit layout the kernels use;
//! - [`kernels`]: batched quantized matmul (AVX-512 VNNI / AVX2 / scalar), attention helpers;
//! - [`pool`]: the fork-join thread pool that runs the kernels;
//! - [`kv_cache`]: page allocator, per-layer KV storage generic over the cache layout;
//! - [`radix`]: the radix prefix cache over pages;
//! - [`batch`]: `ForwardBatch`, the complete per-step metadata, and its validator;
//! - [`model`]: the `Model` trait, capability checks, and the Llama GGUF model;
//! - [`nvfp4`]: ModelOpt NVFP4 weights (E2M1 + E4M3 block scales) and their quantizer, the
//!   first piece of the GLM-5 work;
//! - [`sampler`]: temperature / top-k / top-p / min-p sampling, seeded per request;
//! - [`scheduler`]: continuous batching, chunked prefill, retraction;
//! - [`engine`]: the engine thread and its typed command channel.

pub mod autotune;
pub mod batch;
pub mod engine;
pub mod checkpoint;
pub mod config;
pub mod kv;
pub mod model;
pub mod sampler;
pub mod request;
pub mod scheduler;
pub mod testing;

/// Engine errors. Request-level errors never stop the engine.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    /// The model file could not be loaded (path, format, unsupported feature).
    #[error("model: {0}")]
    Model(String),
    /// Model and attention backend do not fit together (found at start-up).
    #[error("incompatible model and backend: {0}")]
    Incompatible(String),
    /// A request breaks a limit (empty, too long, cannot fit the KV pool).
    #[error("{0}")]
    InvalidRequest(String),
    /// Configuration flags that contradict each other.
    #[error("configuration: {0}")]
    Config(String),
    /// A bug caught by a check (e.g. batch metadata validation); the affected requests fail.
    #[error("internal error: {0}")]
    Internal(String),
    /// The engine thread is gone.
    #[error("the engine has stopped")]
    Stopped,
}

impl EngineError {
    /// [`EngineError::Model`] from a message (the loaders' one constructor).
    pub fn model(m: impl Into<String>) -> Self {
        EngineError::Model(m.into())
    }
}
