//! Running one API request on the engine: admission limits, one engine request per choice,
//! incremental detokenization, stop strings, metrics, and abort on drop.
//!
//! The result is a stream of [`ChoiceEvent`]s that the OpenAI and native routes render in
//! their own wire formats. Dropping the stream (client gone, or the handler future dropped)
//! aborts every engine request it started, so their KV pages return to the pool within a
//! step, queued requests included.

use std::sync::Arc;
use std::time::Instant;

use futures_util::stream::{self, BoxStream, StreamExt};
use sparrow_engine::engine::Engine;
use sparrow_engine::scheduler::{FinishReason, NewRequest, Output, TokenConstraint, TokenLogprob};
use sparrow_protocol::openai::MatchedStop;

use crate::budget::ThinkBudget;
use crate::detok::{StopMatcher, StopResult, Utf8Stream};
use crate::error::ApiError;
use crate::params::GenParams;
use crate::reqlog::LogTag;
use crate::state::AppState;
use crate::tools::{Encode, LazyCalls, THINK_END, THINK_START};

/// Why a choice ended, as every API's renderer maps it (OpenAI `finish_reason`, SGLang
/// `meta_info.finish_reason.type`, Responses `status`, Anthropic `stop_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// EOS, a stop token, a stop string, or the grammar's end.
    Stop,
    /// The token limit (`max_tokens` or the context).
    Length,
    /// Aborted (client gone, engine failure).
    Abort,
}

impl EndReason {
    /// The OpenAI / SGLang spelling: `stop`, `length`, `abort`.
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Stop => "stop",
            EndReason::Length => "length",
            EndReason::Abort => "abort",
        }
    }
}

/// How a choice ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    /// Why.
    pub reason: EndReason,
    /// The stop token id or stop string that ended it (SGLang's `matched_stop`).
    pub matched: Option<MatchedStop>,
    /// Generated tokens of this choice.
    pub completion_tokens: usize,
    /// Prompt tokens served from the radix cache.
    pub cached_tokens: usize,
    /// Of those, loaded from the hierarchical cache's file tier.
    pub storage_cached_tokens: usize,
    /// Speculative decoding counters (zero without speculation, and on a choice a stop string
    /// ended: the engine's counts arrive only with its own end).
    pub spec: sparrow_engine::spec::SpecCounts,
    /// Set when the engine failed the request.
    pub error: Option<String>,
    /// The engine did not start the request for overload (`error` says why): a 503 with
    /// `Retry-After`, not a 500.
    pub overloaded: bool,
}

impl Finish {
    /// The API error of a failed choice: 503 when the server was overloaded, else 500.
    pub fn api_error(&self) -> Option<ApiError> {
        let e = self.error.clone()?;
        Some(if self.overloaded { ApiError::Overloaded(e) } else { ApiError::Engine(e) })
    }
}

/// One event of a request's combined choice streams.
#[derive(Debug, Clone, PartialEq)]
pub enum ChoiceEvent {
    /// Choice `index` was scheduled: its prompt's prefix-cache hit is known (before any text).
    Started {
        /// Choice index.
        index: usize,
        /// Prompt tokens served from the radix cache.
        cached_tokens: usize,
    },
    /// New text of choice `index`; `tokens` counts its tokens so far.
    Text {
        /// Choice index.
        index: usize,
        /// New text (may be empty when text is held back).
        text: String,
        /// Tokens generated so far for this choice.
        tokens: usize,
        /// The logprobs of the token this event is for (one event per token), when asked for;
        /// `None` on the text flushed at the end.
        logprob: Option<Box<TokenLogprob>>,
    },
    /// The prompt's logprobs of choice `index` (before its first `Text`), when asked for.
    Prompt {
        /// Choice index.
        index: usize,
        /// Prompt position of `entries[0]`.
        start: usize,
        /// One per prompt position from `start`.
        entries: Vec<TokenLogprob>,
    },
    /// Choice `index` ended; no more events for it.
    Done {
        /// Choice index.
        index: usize,
        /// How.
        finish: Finish,
    },
}

impl ChoiceEvent {
    /// The same event for choice `index + off` (choices of several prompts merged, prompt-major).
    pub fn offset(mut self, off: usize) -> Self {
        match &mut self {
            ChoiceEvent::Started { index, .. }
            | ChoiceEvent::Text { index, .. }
            | ChoiceEvent::Prompt { index, .. }
            | ChoiceEvent::Done { index, .. } => *index += off,
        }
        self
    }
}

/// A request ready to run.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// Prompt token ids.
    pub prompt_ids: Vec<u32>,
    /// Parameters.
    pub params: GenParams,
    /// Tokens to generate at most, after the context and pool limits.
    pub max_new: usize,
    /// Admitted past a full queue under priority scheduling ([`admit`]): its engine requests
    /// may take the place of less urgent waiting ones.
    pub over_limit: bool,
    /// Its tag in the request log (`--log-requests`).
    pub log: Option<LogTag>,
}

/// Applies the length policy (documented in `docs/api.md`, "Lengths"):
/// - an empty prompt is a 400;
/// - the prompt must be shorter than the context length (`ctx`): at least one token must fit;
/// - an explicit `max_tokens` with `prompt + max_tokens > ctx` is a 400 naming both numbers
///   (no silent clamping);
/// - an absent `max_tokens` means `ctx − prompt`, clamped to what the KV pool can ever hold;
/// - a request that can never fit the KV pool (`prompt + max_tokens > max_total_tokens`) is a
///   400 at admission.
///
/// # Errors
/// The 400s above, and token ids outside the vocabulary.
pub fn prepare(state: &AppState, prompt_ids: Vec<u32>, params: GenParams) -> Result<Prepared, ApiError> {
    let cfg = state.engine.config();
    let (ctx, pool) = (cfg.context_length, cfg.max_total_tokens());
    let p = prompt_ids.len();
    if p == 0 {
        return Err(ApiError::bad("prompt", "the prompt is empty; send at least one token"));
    }
    let vocab = state.engine.info().vocab_size;
    if let Some(bad) = prompt_ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad("prompt", format!("token id {bad} is outside the vocabulary (size {vocab})")));
    }
    if let Some((bad, _)) = params.sampling.logit_bias.iter().find(|(t, _)| *t as usize >= vocab) {
        return Err(ApiError::bad(
            "logit_bias",
            format!("logit_bias names token id {bad}, outside the vocabulary (size {vocab})"),
        ));
    }
    if p >= ctx {
        return Err(ApiError::bad(
            "prompt",
            format!("the prompt has {p} tokens; this model's context length is {ctx} tokens, and the prompt must leave room for at least one generated token"),
        ));
    }
    let field = params.max_tokens_field;
    let max_new = match params.max_tokens {
        Some(m) if p + m > ctx => {
            return Err(ApiError::bad(
                field,
                format!(
                    "the prompt has {p} tokens and {field} is {m}: {} tokens exceed the context length of {ctx} tokens",
                    p + m
                ),
            ))
        }
        Some(m) if p + m > pool => {
            return Err(ApiError::bad(
                field,
                format!(
                "the prompt has {p} tokens and {field} is {m}: {} tokens can never fit the KV pool of {pool} tokens",
                p + m
            ),
            ))
        }
        // A prompt-logprobs request with `max_tokens: 0` still runs its prompt: it must fit.
        Some(0) if params.logprobs.prompt_start.is_some() && p >= pool => {
            return Err(ApiError::bad("prompt", format!("the prompt has {p} tokens; the KV pool holds {pool} tokens")));
        }
        Some(m) => m,
        None if p >= pool => {
            return Err(ApiError::bad("prompt", format!("the prompt has {p} tokens; the KV pool holds {pool} tokens")));
        }
        None => (ctx - p).min(pool - p).min(params.default_max.unwrap_or(usize::MAX)),
    };
    Ok(Prepared { prompt_ids, params, max_new, over_limit: false, log: state.log_tag() })
}

/// Aborts the engine requests of a dropped stream (or of a dropped embedding request).
pub(crate) struct AbortOnDrop {
    pub(crate) engine: Engine,
    pub(crate) ids: Vec<u64>,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        // Harmless for requests that already finished: the engine ignores unknown ids.
        for &id in &self.ids {
            self.engine.abort(id);
        }
    }
}

struct Choice {
    index: usize,
    engine_id: u64,
    rx: tokio::sync::mpsc::UnboundedReceiver<Output>,
    bytes: Arc<Vec<Vec<u8>>>,
    utf8: Utf8Stream,
    stop: StopMatcher,
    tokens: usize,
    cached: usize,
    storage: usize,
    stop_ids: Arc<Vec<u32>>,
    no_stop_trim: bool,
    done: bool,
    engine: Engine,
    state: AppState,
    start: Instant,
    last: Option<Instant>,
    log: Option<LogTag>,
    prompt: usize,
}

impl Choice {
    fn text_of(&mut self, token: u32) -> String {
        let b = self.bytes.get(token as usize).map(Vec::as_slice).unwrap_or(&[]);
        self.utf8.push(b)
    }

    fn on_output(&mut self, o: Output) -> Vec<ChoiceEvent> {
        let index = self.index;
        match o {
            Output::Started { cached_tokens, storage_cached_tokens, .. } => {
                self.cached = cached_tokens;
                self.storage = storage_cached_tokens;
                vec![ChoiceEvent::Started { index, cached_tokens }]
            }
            Output::PromptLogprobs { start, entries, .. } => vec![ChoiceEvent::Prompt { index, start, entries }],
            // A generation request gets none (`start` refuses generation on an embedding server).
            Output::Embedding { .. } => Vec::new(),
            Output::Token { token, logprob, .. } => {
                let now = Instant::now();
                match self.last {
                    None => self.state.metrics.ttft.observe(now.duration_since(self.start).as_secs_f64()),
                    Some(t) => self.state.metrics.itl.observe(now.duration_since(t).as_secs_f64()),
                }
                self.last = Some(now);
                self.tokens += 1;
                // A `stop_token_ids` token ends the sequence and, as in SGLang, is trimmed from
                // the text (it still counts as a completion token) unless `no_stop_trim`.
                let trim = self.stop_ids.contains(&token) && !self.no_stop_trim;
                let piece = if trim { String::new() } else { self.text_of(token) };
                match self.stop.push(&piece) {
                    StopResult::Continue(text) => vec![ChoiceEvent::Text { index, text, tokens: self.tokens, logprob }],
                    StopResult::Stopped { text, matched } => {
                        self.done = true;
                        self.engine.abort(self.engine_id);
                        self.observe_e2e();
                        self.stopped(text, matched, self.cached, logprob)
                    }
                }
            }
            Output::Finished { reason, usage, .. } => {
                self.done = true;
                self.observe_e2e();
                let tail = self.utf8.finish();
                let mut text = match self.stop.push(&tail) {
                    StopResult::Continue(t) => t,
                    StopResult::Stopped { text, matched } => {
                        return self.stopped(text, matched, usage.cached_tokens, None)
                    }
                };
                text.push_str(&self.stop.finish());
                let overloaded = matches!(reason, FinishReason::Overloaded(_));
                let (r, matched, error) = match reason {
                    FinishReason::Overloaded(e) => (EndReason::Abort, None, Some(e)),
                    FinishReason::Stop(t) => (EndReason::Stop, Some(MatchedStop::Token(t)), None),
                    FinishReason::Length => (EndReason::Length, None, None),
                    FinishReason::GrammarEnd => (EndReason::Stop, None, None),
                    FinishReason::Abort => (EndReason::Abort, None, None),
                    FinishReason::Error(e) => (EndReason::Abort, None, Some(e)),
                };
                let finish = Finish {
                    reason: r,
                    matched,
                    completion_tokens: usage.completion_tokens,
                    cached_tokens: usage.cached_tokens,
                    storage_cached_tokens: usage.storage_cached_tokens,
                    spec: usage.spec,
                    error,
                    overloaded,
                };
                let mut ev = Vec::new();
                if !text.is_empty() {
                    ev.push(ChoiceEvent::Text { index, text, tokens: self.tokens, logprob: None });
                }
                self.log_done(&finish);
                ev.push(ChoiceEvent::Done { index, finish });
                ev
            }
        }
    }

    /// The last text before a stop string (with it under `no_stop_trim`), and the choice's end.
    fn stopped(
        &self,
        mut text: String,
        matched: String,
        cached_tokens: usize,
        logprob: Option<Box<TokenLogprob>>,
    ) -> Vec<ChoiceEvent> {
        let index = self.index;
        if self.no_stop_trim {
            text.push_str(&matched);
        }
        let finish = Finish {
            reason: EndReason::Stop,
            matched: Some(MatchedStop::Text(matched)),
            completion_tokens: self.tokens,
            cached_tokens,
            storage_cached_tokens: self.storage,
            spec: Default::default(),
            error: None,
            overloaded: false,
        };
        self.log_done(&finish);
        vec![ChoiceEvent::Text { index, text, tokens: self.tokens, logprob }, ChoiceEvent::Done { index, finish }]
    }

    fn log_done(&self, f: &Finish) {
        if let Some(t) = &self.log {
            t.done(self.index, self.prompt, f, self.start.elapsed().as_secs_f64());
        }
    }

    fn observe_e2e(&self) {
        self.state.metrics.e2e.observe(self.start.elapsed().as_secs_f64());
    }
}

/// Admission control, once per API request before any of its engine requests is submitted
/// (so a request with several prompts or choices is refused or taken whole): `Ok(false)`
/// while fewer than `--max-queued-requests` wait; past it, `Ok(true)` under priority
/// scheduling (the request is submitted with [`Prepared::over_limit`] and may take a less
/// urgent waiting request's place, as SGLang's does), else a 503.
///
/// # Errors
/// [`ApiError::Overloaded`] (counted in `/metrics`).
pub fn admit(state: &AppState) -> Result<bool, ApiError> {
    match state.engine.check_queue() {
        Ok(()) => Ok(false),
        Err(_) if state.engine.priority_scheduling() => Ok(true),
        Err(e) => {
            state.metrics.queue_full.inc();
            Err(e.into())
        }
    }
}

/// Runs `f`, a grammar compile, with this worker's other tasks moved elsewhere meanwhile (on
/// the multi-threaded runtime), so other requests are answered while it runs.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Starts all choices of a prepared request and returns their merged events.
///
/// # Errors
/// [`ApiError::Unavailable`] when the engine is gone.
pub fn start(state: &AppState, prep: Prepared) -> Result<BoxStream<'static, ChoiceEvent>, ApiError> {
    let GenParams {
        sampling,
        stop,
        stop_token_ids,
        ignore_eos,
        n,
        skip_special_tokens,
        no_stop_trim,
        logprobs,
        constraint,
        priority,
        reasoning_budget,
        lazy_calls,
        ..
    } = prep.params;
    // The grammar compiles (once, copied for each choice) before anything is submitted: a bad
    // schema, or one past llguidance's limits, is a 400 naming the field.
    let compile = || -> Result<Vec<Option<Box<dyn TokenConstraint>>>, ApiError> {
        let grammars = constraint.as_ref().map(|_| state.grammars().map_err(ApiError::Engine)).transpose()?;
        match (&constraint, &grammars) {
            (Some((c, field)), Some(g)) => g
                .constraints(c, n)
                .map(|cs| cs.into_iter().map(Some).collect())
                .map_err(|e| ApiError::bad(field, format!("{field}: {e}"))),
            _ => Ok((0..n).map(|_| None).collect()),
        }
    };
    // A compile can take a good part of a second within the limits (and the first one builds
    // the vocabulary's token trie): the runtime moves this worker's other tasks elsewhere
    // meanwhile, so other requests are answered while it runs.
    let mut constraints = if constraint.is_some() { blocking(compile)? } else { compile()? };
    if let Some(tools) = lazy_calls.filter(|t| !t.is_empty()) {
        let compiled = blocking(|| state.lazy_grammar(&tools))?;
        let st = state.clone();
        let encode: Encode = Arc::new(move |t: &str| st.tokenizer.encode(t, false).unwrap_or_default());
        for c in constraints.iter_mut().filter(|c| c.is_none()) {
            *c = Some(Box::new(LazyCalls::new(compiled.clone(), state.bytes_all.clone(), encode.clone())));
        }
    }
    if let Some(b) = reasoning_budget {
        let tags = |t: &str| state.tokenizer.encode(t, false).map_err(|e| ApiError::Engine(e.to_string()));
        let (open, close) = (tags(THINK_START)?, tags(THINK_END)?);
        if !close.is_empty() {
            for c in constraints.iter_mut().filter(|c| c.is_none()) {
                *c = Some(Box::new(ThinkBudget::new(open.clone(), close.clone(), b.tokens, b.inside)));
            }
        }
    }
    // The tokens trimmed from the text when they end it: the request's stop tokens and, unless
    // it ignores EOS, the model's end-of-generation tokens (SGLang's `trim_matched_stop`; seen
    // only when `skip_special_tokens` is false, e.g. under a harmony parser).
    let mut trimmed = stop_token_ids.clone();
    if !ignore_eos {
        trimmed.extend_from_slice(state.engine.eos_ids());
    }
    let stop_ids = Arc::new(trimmed);
    let bytes = if skip_special_tokens { state.bytes_skip.clone() } else { state.bytes_all.clone() };
    state.metrics.requests.inc();
    if prep.max_new == 0 && logprobs.prompt_start.is_none() {
        // Nothing to sample: no engine request, no KV pages.
        let events: Vec<ChoiceEvent> = (0..n)
            .map(|index| ChoiceEvent::Done {
                index,
                finish: Finish {
                    reason: EndReason::Length,
                    matched: None,
                    completion_tokens: 0,
                    cached_tokens: 0,
                    storage_cached_tokens: 0,
                    spec: Default::default(),
                    error: None,
                    overloaded: false,
                },
            })
            .collect();
        return Ok(stream::iter(events).boxed());
    }
    let mut guard = AbortOnDrop { engine: state.engine.clone(), ids: Vec::with_capacity(n) };
    let mut streams = Vec::with_capacity(n);
    let start = Instant::now();
    for (index, constraint) in constraints.into_iter().enumerate() {
        let id = state.next_engine_id();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut sp = sampling.clone();
        sp.seed = sp.seed.wrapping_add(index as u64);
        let req = NewRequest {
            id,
            input_ids: prep.prompt_ids.clone(),
            max_new_tokens: prep.max_new,
            sampling: sp,
            stop_token_ids: stop_token_ids.clone(),
            ignore_eos,
            logprobs: logprobs.clone(),
            constraint,
            embed: false,
            priority,
        };
        let sink = Box::new(move |o| tx.send(o).is_ok());
        if prep.over_limit {
            state.engine.submit_over_limit(req, sink)?;
        } else {
            state.engine.submit(req, sink)?;
        }
        guard.ids.push(id);
        let choice = Choice {
            index,
            engine_id: id,
            rx,
            bytes: bytes.clone(),
            utf8: Utf8Stream::default(),
            stop: StopMatcher::new(stop.clone()),
            tokens: 0,
            cached: 0,
            storage: 0,
            stop_ids: stop_ids.clone(),
            no_stop_trim,
            done: false,
            engine: state.engine.clone(),
            state: state.clone(),
            start,
            last: None,
            log: prep.log,
            prompt: prep.prompt_ids.len(),
        };
        streams.push(
            stream::unfold(choice, |mut c| async move {
                if c.done {
                    return None;
                }
                let o = c.rx.recv().await?;
                let ev = c.on_output(o);
                Some((stream::iter(ev), c))
            })
            .flatten()
            .boxed(),
        );
    }
    let merged = stream::select_all(streams);
    // The guard lives as long as the merged stream.
    Ok(merged
        .map(move |e| {
            let _keep = &guard;
            e
        })
        .boxed())
}
