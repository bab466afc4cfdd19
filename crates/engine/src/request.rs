//! The engine's request boundary: what callers submit ([`NewRequest`]) and the events they get
//! back ([`Output`]: `Started`, `Token`, `Finished` with a [`FinishReason`] and [`Usage`]), as in
//! TGI's `schedule(request) -> stream of events`.

use crate::sampler::SamplingParams;

/// A request as the engine receives it (already tokenized and validated).
#[derive(Debug, Clone)]
pub struct NewRequest {
    /// Caller-chosen unique id.
    pub id: u64,
    /// Prompt token ids (non-empty).
    pub input_ids: Vec<u32>,
    /// Most tokens to generate.
    pub max_new_tokens: usize,
    /// Sampling.
    pub sampling: SamplingParams,
    /// Tokens that end the sequence (the model's EOS is added unless `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    /// Keep generating through EOS.
    pub ignore_eos: bool,
}

/// Why a sequence ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token (EOS or one of `stop_token_ids`) was generated; it is part of the output.
    Stop(u32),
    /// `max_new_tokens` or the context length was reached.
    Length,
    /// The client went away or asked to stop.
    Abort,
    /// The engine could not run the request.
    Error(String),
}

/// Token accounting of a finished request (OpenAI `usage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Prompt tokens served from the radix cache at first admission.
    pub cached_tokens: usize,
}

/// What a step tells the callers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// The request's first scheduling (ends its queue time).
    Started {
        /// Request id.
        id: u64,
        /// Prompt tokens served from the radix cache.
        cached_tokens: usize,
    },
    /// One generated token.
    Token {
        /// Request id.
        id: u64,
        /// Token id.
        token: u32,
    },
    /// The request ended; nothing follows for this id.
    Finished {
        /// Request id.
        id: u64,
        /// Why.
        reason: FinishReason,
        /// Token counts.
        usage: Usage,
    },
}
