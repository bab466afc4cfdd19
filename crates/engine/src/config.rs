//! Engine configuration: the typed, validated start-up options (`sparrow serve` turns its raw
//! flags into [`EngineArgs`]; nothing here parses strings), and the scheduler configuration
//! derived from them and the model, returned by [`derive_config`] and never written back. The
//! choices the models and the scheduler take (`AttnImpl`, `MoeImpl`, `SchedulePolicy`) are
//! defined here, so the model code depends on the configuration and not the other way round.

use std::path::PathBuf;

use crate::EngineError;

/// Order in which waiting requests are admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedulePolicy {
    /// First come, first served.
    Fcfs,
    /// Longest cached prefix first (SGLang's `lpm`; falls back to FCFS above 128 waiting).
    Lpm,
}

/// Immutable scheduler configuration (numbers derived at start-up included).
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Slots per KV page.
    pub page_size: usize,
    /// Usable KV pages.
    pub num_pages: usize,
    /// Most requests running (prefilling or decoding) at once.
    pub max_running_requests: usize,
    /// Most prefill tokens per step, and the chunk size of a long prompt.
    pub chunked_prefill_size: usize,
    /// Most prefill tokens per batch (SGLang `--max-prefill-tokens`).
    pub max_prefill_tokens: usize,
    /// Longest sequence (prompt + output).
    pub context_length: usize,
    /// Radix prefix cache off.
    pub disable_radix_cache: bool,
    /// Admission order.
    pub policy: SchedulePolicy,
    /// Speculative decoding (none: off).
    pub spec: Option<crate::spec::SpecConfig>,
    /// A prompt is computed in one step or not at all (an encoder's bidirectional attention,
    /// [`crate::model::AttentionNeeds::whole_sequences`]): admission waits for a step whose
    /// budget holds the whole prompt; the prefill budget is at least the context.
    pub whole_prompts: bool,
    /// A hybrid model's saved states for prefix hits ([`crate::kv::state`]): 0 for a model
    /// without recurrent layers; else the radix cache matches a prompt only as far as its
    /// deepest node holding a saved state, and saves one where a request's prompt ends and where
    /// it leaves (finished or retracted) on a page boundary.
    pub state_checkpoints: usize,
    /// Who waits and who goes first: priority, fair prefill, the queue deadline.
    pub queue: QueueConfig,
}

/// Queueing policy beyond the admission order ([`SchedulePolicy`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    /// Priority scheduling (SGLang's `--enable-priority-scheduling`); `None`: off, a request's
    /// `priority` is ignored.
    pub priority: Option<PriorityConfig>,
    /// Fair prefill (`None`: off, `--disable-fair-prefill`): see [`FairPrefill`].
    pub fair_prefill: Option<FairPrefill>,
    /// A request still waiting for its first admission after this long is answered with
    /// [`crate::request::FinishReason::Overloaded`] (`--queue-timeout`; `None`: it waits).
    pub queue_timeout: Option<std::time::Duration>,
    /// `--max-queued-requests`: requests waiting for their first admission beyond which new
    /// ones are refused ([`EngineError::QueueFull`]); `None`: no limit.
    pub max_queued_requests: Option<usize>,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            priority: None,
            fair_prefill: Some(FairPrefill::default()),
            queue_timeout: None,
            max_queued_requests: None,
        }
    }
}

/// Priority scheduling, after SGLang's `schedule_policy.py` (`--enable-priority-scheduling`).
/// The waiting queue is ordered by priority, then by the admission policy; a waiting request
/// that cannot be admitted (no pages, or `max_running_requests` reached) retracts the running
/// request of the lowest priority when its own priority is better by more than
/// `preemption_threshold` (the retracted request recomputes later, exactly, as after any
/// retraction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityConfig {
    /// Smaller values run first (`--schedule-low-priority-values-first`); by default larger
    /// values do, as in SGLang.
    pub low_values_first: bool,
    /// Preempt running requests for better ones (off: `--disable-priority-preemption`).
    pub preemption: bool,
    /// `--priority-scheduling-preemption-threshold` (SGLang's default 10).
    pub preemption_threshold: i64,
    /// The priority of a request that gives none (`--default-priority-value`, default 0).
    pub default_priority: i64,
}

impl PriorityConfig {
    /// Higher is more urgent, whichever way the values are read.
    pub fn urgency(&self, priority: i64) -> i64 {
        if self.low_values_first {
            priority.saturating_neg()
        } else {
            priority
        }
    }
}

/// Fair prefill, after vLLM's partial prefills (`--long-prefill-token-threshold`,
/// `--max-long-partial-prefills`): while requests wait, a running prompt whose remainder is
/// longer than the threshold does not hold the step's prefill budget alone. Such *long*
/// prefill chunks take only what decode rows, short prompt chunks and new admissions leave,
/// and new admissions take at most half the budget while a long prefill runs (so a stream of
/// arrivals at most doubles a long prompt's prefill). A long waiting prompt is admitted only
/// while fewer than `max_long_partial_prefills` long prefills run; shorter requests behind it
/// go first meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FairPrefill {
    /// Prompt tokens left above which a prefill is long; 0: the step's prefill budget.
    pub long_prefill_token_threshold: usize,
    /// Long prefills running at once (at least 1).
    pub max_long_partial_prefills: usize,
}

impl Default for FairPrefill {
    fn default() -> Self {
        FairPrefill { long_prefill_token_threshold: 0, max_long_partial_prefills: 1 }
    }
}

impl SchedulerConfig {
    /// Tokens the KV pool holds (`max_total_tokens`).
    pub fn max_total_tokens(&self) -> usize {
        self.num_pages * self.page_size
    }

    /// Checks a request against limits that no amount of waiting can change.
    ///
    /// # Errors
    /// [`EngineError::InvalidRequest`] naming the limit.
    pub fn admission_check(&self, prompt_len: usize, max_new_tokens: usize) -> Result<(), EngineError> {
        if prompt_len == 0 {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        if max_new_tokens == 0 {
            // Nothing to sample: callers answer such requests without the engine (the scheduler
            // lets 0 through only for prompt logprobs).
            return Err(EngineError::InvalidRequest("max_new_tokens must be at least 1".into()));
        }
        self.fits(prompt_len, max_new_tokens)
    }

    /// [`SchedulerConfig::admission_check`] for an embedding request: a prompt and nothing
    /// generated, so the whole context is the prompt's.
    ///
    /// # Errors
    /// [`EngineError::InvalidRequest`] naming the limit.
    pub fn embed_check(&self, prompt_len: usize) -> Result<(), EngineError> {
        if prompt_len == 0 {
            return Err(EngineError::InvalidRequest("the input is empty".into()));
        }
        self.fits(prompt_len, 0)
    }

    /// A prompt of `prompt_len` tokens and `max_new` generated within the context and the
    /// pool (a generating request keeps room for at least one token).
    fn fits(&self, prompt_len: usize, max_new: usize) -> Result<(), EngineError> {
        let what = match max_new {
            0 => format!("input of {prompt_len} tokens"),
            n => format!("prompt of {prompt_len} tokens plus max_new_tokens {n}"),
        };
        if prompt_len + max_new > self.context_length {
            return Err(EngineError::InvalidRequest(format!(
                "{what} exceeds the context length of {} tokens",
                self.context_length
            )));
        }
        let need = prompt_len + max_new;
        if need > self.max_total_tokens() {
            return Err(EngineError::InvalidRequest(format!(
                "{what} needs {need} KV slots; the KV pool holds {} (--max-total-tokens)",
                self.max_total_tokens()
            )));
        }
        Ok(())
    }
}

/// `--attention-backend`: a backend of [`crate::model::BACKENDS`], or the first one that
/// implements the model's attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionBackend {
    /// The first registered backend whose capabilities cover the model.
    Auto,
    /// `cpu`: GQA over the paged cache.
    Cpu,
    /// `dsa`: MLA + DeepSeek sparse attention (SGLang's `dsa`, formerly `nsa`).
    Dsa,
}

impl AttentionBackend {
    /// The backend's registered name (`auto` for [`AttentionBackend::Auto`]).
    pub fn name(self) -> &'static str {
        match self {
            AttentionBackend::Auto => "auto",
            AttentionBackend::Cpu => "cpu",
            AttentionBackend::Dsa => "dsa",
        }
    }
}

/// Attention implementation for DSA rows (`--nsa-prefill-backend` / `--nsa-decode-backend`),
/// used by GLM-5's MLA (`model/glm5/mla.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnImpl {
    /// Reads only the selected slots.
    Sparse,
    /// Scores every slot of the context, then masks the unselected ones.
    Dense,
}

impl AttnImpl {
    /// Flag spelling (`sparse`, `dense`).
    pub fn name(self) -> &'static str {
        match self {
            AttnImpl::Sparse => "sparse",
            AttnImpl::Dense => "dense",
        }
    }
}

/// A MoE implementation (`--moe-runner-backend`; `model/glm5/moe.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MoeImpl {
    /// One GEMV per (token, expert) pair.
    TokenMajor,
    /// One grouped GEMM per expert over the tokens routed to it.
    ExpertMajor,
}

impl MoeImpl {
    /// Flag spelling.
    pub fn name(self) -> &'static str {
        match self {
            MoeImpl::TokenMajor => "token_major",
            MoeImpl::ExpertMajor => "expert_major",
        }
    }
}

/// `--moe-runner-backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeRunner {
    /// Chosen per batch-size bucket by the start-up autotune (a fixed rule when it is off).
    Auto,
    /// Always this implementation.
    Fixed(MoeImpl),
}

/// Start-up options (the `sparrow serve` flags that concern the engine).
#[derive(Debug, Clone)]
pub struct EngineArgs {
    /// `--model-path`: a GGUF file or a Hugging Face checkpoint directory.
    pub model_path: PathBuf,
    /// Compute threads (caller included).
    pub threads: usize,
    /// Slots per KV page.
    pub page_size: usize,
    /// KV pool size in tokens; derived from `kv_cache_gb` when `None`.
    pub max_total_tokens: Option<usize>,
    /// KV memory budget in GiB (used when `max_total_tokens` is `None`).
    pub kv_cache_gb: f64,
    /// Derived from the pool the way SGLang derives it when `None`.
    pub max_running_requests: Option<usize>,
    /// Prefill chunk size in tokens.
    pub chunked_prefill_size: usize,
    /// Prefill tokens per batch.
    pub max_prefill_tokens: usize,
    /// Overrides the model's context length (must not exceed it).
    pub context_length: Option<usize>,
    /// Radix prefix cache off.
    pub disable_radix_cache: bool,
    /// Admission order.
    pub schedule_policy: SchedulePolicy,
    /// Attention backend (`Auto` picks the first backend that implements the model's
    /// attention).
    pub attention_backend: AttentionBackend,
    /// DSA attention for EXTEND rows.
    pub dsa_prefill_backend: AttnImpl,
    /// DSA attention for DECODE rows.
    pub dsa_decode_backend: AttnImpl,
    /// MoE implementation: autotuned per batch size (or a fixed rule when autotune is off), or
    /// one fixed implementation.
    pub moe_runner_backend: MoeRunner,
    /// Skip the start-up MoE autotune.
    pub disable_autotune: bool,
    /// KV cache element type (`None`: the model's own); a model whose attention cannot read it
    /// is refused at start-up.
    pub kv_cache_dtype: Option<crate::kv::KvDtype>,
    /// Where autotune results are kept (none: not kept).
    pub autotune_cache_dir: Option<PathBuf>,
    /// End-of-sequence tokens (the tokenizer's, and the model's `eos_token_id` list).
    pub eos: Vec<u32>,
    /// Speculative decoding (`--speculative-algorithm` and its flags; none: off).
    pub speculative: Option<crate::spec::SpecConfig>,
    /// Serve embeddings instead of generation (SGLang's `--is-embedding`); an encoder-only
    /// model (BERT) serves embeddings either way.
    pub is_embedding: bool,
    /// Priority, fair prefill, the queue deadline and limit (see [`QueueConfig`]).
    pub queue: QueueConfig,
    /// The hierarchical cache's file tier (`--enable-hierarchical-cache`); `None`: off.
    pub hicache: Option<crate::kv::hicache::HiCacheArgs>,
}

impl EngineArgs {
    /// `sparrow serve`'s defaults for `model_path` (one compute thread): callers that drive
    /// the engine directly change only what they need with struct-update syntax.
    pub fn new(model_path: PathBuf) -> Self {
        EngineArgs {
            model_path,
            threads: 1,
            page_size: 1,
            max_total_tokens: None,
            kv_cache_gb: 4.0,
            max_running_requests: None,
            chunked_prefill_size: 512,
            max_prefill_tokens: 16384,
            context_length: None,
            disable_radix_cache: false,
            schedule_policy: SchedulePolicy::Fcfs,
            attention_backend: AttentionBackend::Auto,
            dsa_prefill_backend: AttnImpl::Sparse,
            dsa_decode_backend: AttnImpl::Sparse,
            moe_runner_backend: MoeRunner::Auto,
            disable_autotune: false,
            kv_cache_dtype: None,
            autotune_cache_dir: None,
            eos: Vec::new(),
            speculative: None,
            is_embedding: false,
            queue: QueueConfig::default(),
            hicache: None,
        }
    }
}

/// Largest `--max-running-requests` accepted (request slots are 32-bit and preallocated).
pub const MAX_RUNNING_LIMIT: usize = 1 << 16;

/// Derives the scheduler configuration from flags and the model, as SGLang does
/// (`model_executor/model_runner.py`): the request pool holds
/// `clamp(max_total_tokens / context_len · 512, 2048, 4096)` rows and
/// `max_running_requests = min(max_total_tokens / 2, that)` unless given.
///
/// # Errors
/// [`EngineError::Config`] for contradicting flags.
pub fn derive_config(
    args: &EngineArgs,
    bytes_per_token: usize,
    model_ctx: usize,
) -> Result<SchedulerConfig, EngineError> {
    let cerr = |m: String| Err(EngineError::Config(m));
    if !(1..=4096).contains(&args.page_size) {
        return cerr(format!("--page-size {} must be between 1 and 4096", args.page_size));
    }
    if bytes_per_token == 0 {
        return cerr("the model's KV layout has no bytes per token (no layers?)".into());
    }
    let ctx = args.context_length.unwrap_or(model_ctx);
    if ctx == 0 || ctx > model_ctx {
        return cerr(format!("--context-length {ctx} must be between 1 and the model's {model_ctx}"));
    }
    let total = match args.max_total_tokens {
        Some(t) => t,
        None => {
            if args.kv_cache_gb.is_nan() || args.kv_cache_gb <= 0.0 {
                return cerr(format!("--kv-cache-gb {} must be positive", args.kv_cache_gb));
            }
            (args.kv_cache_gb * (1u64 << 30) as f64 / bytes_per_token as f64) as usize
        }
    };
    let num_pages = total / args.page_size;
    if num_pages == 0 {
        return cerr(format!("a KV pool of {total} tokens holds no page of {} tokens", args.page_size));
    }
    let total = num_pages * args.page_size;
    if (num_pages + 1) * args.page_size > u32::MAX as usize {
        return cerr(format!("a KV pool of {total} tokens exceeds the 32-bit slot index space"));
    }
    let req_pool = (total as f64 / ctx as f64 * 512.0) as usize;
    let req_pool = req_pool.clamp(2048, 4096);
    let max_running = match args.max_running_requests {
        Some(0) => return cerr("--max-running-requests must be at least 1".into()),
        Some(m) if m > MAX_RUNNING_LIMIT => {
            return cerr(format!("--max-running-requests {m} is above the limit of {MAX_RUNNING_LIMIT}"))
        }
        Some(m) => m,
        None => (total / 2).min(req_pool).max(1),
    };
    if args.chunked_prefill_size == 0 || args.max_prefill_tokens == 0 {
        return cerr("--chunked-prefill-size and --max-prefill-tokens must be positive".into());
    }
    Ok(SchedulerConfig {
        page_size: args.page_size,
        num_pages,
        max_running_requests: max_running,
        chunked_prefill_size: args.chunked_prefill_size,
        max_prefill_tokens: args.max_prefill_tokens,
        context_length: ctx,
        disable_radix_cache: args.disable_radix_cache,
        policy: args.schedule_policy,
        spec: args.speculative.clone(),
        whole_prompts: false,
        state_checkpoints: 0,
        queue: args.queue.clone(),
    })
}
