//! The engine's request boundary: what callers submit ([`NewRequest`]) and the events they get
//! back ([`Output`]: `Started`, `PromptLogprobs`, `Token`, `Finished` with a [`FinishReason`] and
//! [`TokenUsage`]), as in TGI's `schedule(request) -> stream of events`.

use crate::sampler::SamplingParams;

/// A request as the engine receives it (already tokenized and validated).
#[derive(Debug)]
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
    /// Which log-probabilities to report (none by default).
    pub logprobs: LogprobSpec,
    /// The grammar its tokens must follow (structured output), if any.
    pub constraint: Option<Box<dyn TokenConstraint>>,
    /// An embedding request: the prompt is computed and its pooled hidden state (or a
    /// cross-encoder's label logits) comes back as one [`Output::Embedding`]; nothing is
    /// generated (`max_new_tokens`, sampling, stops and logprobs are ignored) and no KV is
    /// kept after the forward.
    pub embed: bool,
    /// Scheduling priority (SGLang's and vLLM's request field `priority`), used only under
    /// priority scheduling ([`crate::config::PriorityConfig`]); `None`: the server's default.
    pub priority: Option<i64>,
}

impl NewRequest {
    /// An embedding request for `input_ids` (see [`NewRequest::embed`]).
    pub fn embedding(id: u64, input_ids: Vec<u32>) -> NewRequest {
        NewRequest {
            id,
            input_ids,
            max_new_tokens: 0,
            sampling: SamplingParams::default(),
            stop_token_ids: Vec::new(),
            ignore_eos: true,
            logprobs: LogprobSpec::default(),
            constraint: None,
            embed: true,
            priority: None,
        }
    }
}

/// A per-request grammar the engine consults at each sampling step: the tokens allowed next,
/// then the token chosen. The server builds them (llguidance matchers); the engine only masks.
///
/// Called on the engine thread, once per generated token of the request, never for rows of
/// other requests. A constraint that errors ends its request with that error.
pub trait TokenConstraint: Send + std::fmt::Debug {
    /// Sets `allowed[t]` for every token `t` that may come next (`allowed` has the model's
    /// vocabulary size and arrives all false). Stop tokens are allowed only where the grammar
    /// may end.
    ///
    /// # Errors
    /// The grammar's error, in words.
    fn allowed(&mut self, allowed: &mut [bool]) -> Result<(), String>;

    /// Advances past the sampled `token`; returns true when the grammar is complete and can
    /// take nothing more (the request then stops).
    ///
    /// # Errors
    /// The grammar's error (a token it does not allow).
    fn advance(&mut self, token: u32) -> Result<bool, String>;
}

/// What a request wants to know about the model's distribution (SGLang's `return_logprob`,
/// `top_logprobs_num`, `logprob_start_len`, `token_ids_logprob`; OpenAI's `logprobs` and
/// `echo`; vLLM's `prompt_logprobs`).
///
/// Every value is a log-probability of the model's raw distribution: `log_softmax` of the
/// logits as the model produced them, before logit bias, penalties, temperature and the
/// top-k/top-p/min-p filters (vLLM's default `logprobs_mode = raw_logprobs`). A token that
/// sampling filtered out therefore still has its finite raw value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogprobSpec {
    /// Report the logprob of every generated token ([`Output::Token::logprob`]).
    pub output: bool,
    /// Report the prompt tokens at positions `prompt_start ..` ([`Output::PromptLogprobs`]).
    /// Position 0 has no logprob (nothing predicts it); a start beyond the prompt reports none.
    pub prompt_start: Option<usize>,
    /// Alternatives per reported position: the `top_n` most likely tokens, by logprob
    /// descending, ties to the lower id.
    pub top_n: usize,
    /// Tokens whose logprobs are reported at every reported position (SGLang's
    /// `token_ids_logprob`), in this order.
    pub token_ids: Vec<u32>,
}

impl LogprobSpec {
    /// True when any logprob is wanted.
    pub fn any(&self) -> bool {
        self.output || self.prompt_start.is_some()
    }
}

/// Log-probabilities at one position: the token that is there (sampled or given) and the
/// alternatives the [`LogprobSpec`] asked for. Values are natural logs, finite and ≤ 0
/// (a non-finite one is reported as [`LOGPROB_FLOOR`](crate::logprobs::LOGPROB_FLOOR)).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token at this position.
    pub token: u32,
    /// Its logprob; `None` only for prompt position 0.
    pub logprob: Option<f32>,
    /// Its rank in the distribution (1 = most likely; ties share the better rank), as vLLM's
    /// `Logprob.rank`; 0 with `logprob: None`.
    pub rank: u32,
    /// `(token, logprob)` of the `top_n` most likely tokens, best first.
    pub top: Vec<(u32, f32)>,
    /// `(token, logprob)` for each of [`LogprobSpec::token_ids`].
    pub ids: Vec<(u32, f32)>,
}

/// Why a sequence ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token (EOS or one of `stop_token_ids`) was generated; it is part of the output.
    Stop(u32),
    /// `max_new_tokens` or the context length was reached.
    Length,
    /// The request's grammar ([`TokenConstraint`]) was complete and could take nothing more.
    GrammarEnd,
    /// The client went away or asked to stop.
    Abort,
    /// The engine could not run the request.
    Error(String),
    /// The server was too busy to start the request (it waited past `--queue-timeout`, or a
    /// better-priority arrival took its place in a full queue); nothing was computed. Servers
    /// answer it as 503 with `Retry-After`.
    Overloaded(String),
}

/// Token accounting of a finished request (OpenAI `usage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenUsage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Prompt tokens served from the radix cache at first admission.
    pub cached_tokens: usize,
    /// Of those, loaded from the hierarchical cache's file tier.
    pub storage_cached_tokens: usize,
    /// Speculative decoding counters (all zero without speculation).
    pub spec: crate::spec::SpecCounts,
}

/// What a step tells the callers.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// The request's first scheduling (ends its queue time).
    Started {
        /// Request id.
        id: u64,
        /// Prompt tokens served from the radix cache.
        cached_tokens: usize,
        /// Of those, loaded from the hierarchical cache's file tier.
        storage_cached_tokens: usize,
    },
    /// One generated token.
    Token {
        /// Request id.
        id: u64,
        /// Token id.
        token: u32,
        /// Its logprobs, when [`LogprobSpec::output`] asked for them.
        logprob: Option<Box<TokenLogprob>>,
    },
    /// The prompt's logprobs, sent once, after the last prompt chunk ran and before the first
    /// `Token` (when [`LogprobSpec::prompt_start`] asked for them).
    PromptLogprobs {
        /// Request id.
        id: u64,
        /// Prompt position of `entries[0]`.
        start: usize,
        /// One entry per prompt position from `start` to the prompt's end.
        entries: Vec<TokenLogprob>,
    },
    /// An embedding request's result, sent once before its `Finished`: the model's row for the
    /// sequence ([`crate::model::Model::set_embedding`]: the pooled hidden state, not
    /// normalized, or a cross-encoder's label logits).
    Embedding {
        /// Request id.
        id: u64,
        /// `dim` values.
        values: Vec<f32>,
    },
    /// The request ended; nothing follows for this id.
    Finished {
        /// Request id.
        id: u64,
        /// Why.
        reason: FinishReason,
        /// Token counts.
        usage: TokenUsage,
    },
}
