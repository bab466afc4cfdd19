//! Sparrow's serving engine: one thread owns the scheduler, the paged KV cache and the model
//! runner. Kernels, formats and the thread pool live in `sparrow-cpu`; offline tools
//! (quantization, calibration, perplexity) in `sparrow-convert`.
//!
//! Modules, bottom up:
//! - [`request`]: the request boundary: `NewRequest` in, `Output` events (`Started`,
//!   `PromptLogprobs`, `Token`, `Finished`) out;
//! - [`config`]: typed start-up options (`EngineArgs`) and the derived scheduler configuration;
//! - [`checkpoint`]: model files (HF directory with safetensors / ModelOpt NVFP4; GGUF), the one
//!   place files are opened and mapped;
//! - [`kv`]: pages, page allocator, per-layer KV storage by layout, and [`kv::radix`], the radix
//!   prefix cache;
//! - [`batch`]: `ForwardBatch`, the complete per-step metadata, and its validator;
//! - [`model`]: the `Model` trait, attention backends by capability, the start-up compatibility
//!   check and timings (MoE autotune, batch cap), the calibration observer hook, and the
//!   models (Llama family with its Gemma 3 variant, GLM-5);
//! - [`logprobs`]: log-probabilities of a raw logits row (value, rank, top-N);
//! - [`sampler`]: greedy / temperature / top-k / top-p / min-p / logit bias, seeded per
//!   (request, step);
//! - [`scheduler`]: continuous batching: `schedule()` (retraction, chunked prefill, admission,
//!   batch building) and `postprocess()` (sampling, verifying proposals, finishing);
//! - [`spec`]: speculative decoding's configuration, per-request state and NGRAM proposer;
//! - [`engine`]: the engine thread, its typed command channel and panic containment;
//! - [`testing`]: the fake model the scheduler and engine tests share.
//!
//! ```text
//! request ─► engine thread ─► Scheduler::schedule ─► ForwardBatch::validate ─► Model::forward
//!                 ▲                                                                 │
//!                 └──── Output (Started / Token / …) ◄───────── Scheduler::postprocess ◄┘
//! ```

pub mod batch;
pub mod checkpoint;
pub mod config;
pub mod engine;
pub mod kv;
pub mod logprobs;
pub mod model;
pub mod request;
pub mod sampler;
pub mod scheduler;
pub mod spec;
pub mod testing;
pub mod tune;

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
    /// `--max-queued-requests` requests are waiting: this one is refused (SGLang answers 503).
    #[error(
        "the request queue is full: {waiting} requests are waiting (the server's --max-queued-requests is {max}); \
         retry later"
    )]
    QueueFull {
        /// Requests waiting for their first admission.
        waiting: usize,
        /// `--max-queued-requests`.
        max: usize,
    },
}

impl EngineError {
    /// [`EngineError::Model`] from a message (the loaders' one constructor).
    pub fn model(m: impl Into<String>) -> Self {
        EngineError::Model(m.into())
    }
}
