//! OpenAI's `/v1/completions` and `/v1/chat/completions`: the request run (`OaiRun`), its
//! streamed chunks (`oai_stream`) and its whole answer (`oai_collect`).
//!
//! Streaming follows the OpenAI reference and SGLang's `serving_completions.py` /
//! `serving_chat.py`: chunks of one `id`; each choice gets its deltas and exactly one chunk with
//! a `finish_reason`; with `stream_options.include_usage` one last chunk with `choices: []` and
//! the summed `usage` precedes `data: [DONE]`, and without it no `choices: []` chunk is ever sent
//! (clients that did not ask for one crash on it). With vLLM's
//! `stream_options.continuous_usage_stats` every chunk carries the cumulative usage.

use super::frames::{collect, push_api_error, push_done, push_error, push_frame, sse_response};
use super::now_secs;
use crate::chat::ChatShape;
use crate::error::ApiError;
use crate::gen::{self, ChoiceEvent, EndReason, Finish};
use crate::logprobs::{self, Legacy, TokenTexts};
use crate::params::LogprobAsk;
use crate::state::AppState;
use crate::tools::{self, Delta, Shaper};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, BoxStream, StreamExt};
use sparrow_protocol::openai::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatDelta, ChatLogprobs, Completion, CompletionLogprobs,
    FunctionCall, FunctionDelta, PromptLogprob, TextChoice, ToolCall, ToolCallDelta, CHAT_COMPLETION,
    CHAT_COMPLETION_CHUNK, TEXT_COMPLETION,
};
use sparrow_protocol::openai_request::StreamOptionsIn;
use sparrow_protocol::Usage;

mod chat;
mod completions;
mod responses;

pub(super) use chat::chat;
pub(super) use completions::completions;
pub(super) use responses::{create as responses_create, delete as responses_delete, get as responses_get};

/// `stream_options` flags.
#[derive(Debug, Clone, Copy, Default)]
struct StreamOpts {
    include_usage: bool,
    continuous: bool,
}

fn stream_opts(o: Option<StreamOptionsIn>, stream: bool) -> Result<StreamOpts, ApiError> {
    match o {
        None => Ok(StreamOpts::default()),
        Some(_) if !stream => {
            Err(ApiError::bad("stream_options", "stream_options is only allowed when stream is true"))
        }
        Some(o) => Ok(StreamOpts {
            include_usage: o.include_usage.unwrap_or(false),
            continuous: o.continuous_usage_stats.unwrap_or(false),
        }),
    }
}

/// Which OpenAI object a response is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Completion,
    Chat,
}

struct OaiRun {
    kind: Kind,
    id: String,
    model: String,
    created: u64,
    /// Prompt tokens of each prompt; choices `p·n … p·n + n − 1` belong to prompt `p`.
    prompt_tokens: Vec<usize>,
    /// Choices per prompt.
    n: usize,
    /// The `echo` text of each prompt.
    echo: Vec<Option<String>>,
    ask: LogprobAsk,
    texts: TokenTexts,
    /// How chat text becomes content, reasoning and tool calls.
    shape: ChatShape,
    /// The server has the hierarchical cache: usage splits cached tokens by tier.
    tiers: bool,
}

/// Element-wise sums of `(cached, from the file tier)` pairs.
fn sum2(v: &[(usize, usize)]) -> (usize, usize) {
    v.iter().fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// A finished chat choice's reason: `tool_calls` when it made calls and ended by itself.
fn chat_reason(f: &Finish, calls: usize) -> &'static str {
    if calls > 0 && f.reason == EndReason::Stop {
        "tool_calls"
    } else {
        f.reason.as_str()
    }
}

/// What one chunk says about one choice.
#[derive(Clone, Copy)]
enum Piece<'a> {
    /// The choice's opening chunk: the assistant role (chat, with this as its content) or the
    /// echoed prompt (completions).
    Start(&'a str),
    /// New text.
    Text(&'a str),
    /// New content, reasoning or tool-call text of a chat choice.
    Delta(&'a Delta),
    /// The choice's end, with its chat `finish_reason`.
    Finish(&'a Finish, &'a str),
}

/// The logprobs a chunk or choice carries.
#[derive(Clone, Copy, Default)]
struct ChunkLp<'a> {
    legacy: Option<&'a CompletionLogprobs>,
    chat: Option<&'a ChatLogprobs>,
    prompt: Option<&'a [Option<PromptLogprob>]>,
}

impl OaiRun {
    fn choices(&self) -> usize {
        self.prompt_tokens.len() * self.n
    }

    /// Usage of the whole request; `cached` is `(cached, of which from the file tier)`.
    fn usage(&self, completion: usize, cached: (usize, usize)) -> Usage {
        let u = Usage::new(self.prompt_tokens.iter().sum::<usize>() as u64, completion as u64, cached.0 as u64);
        if self.tiers {
            u.with_storage(cached.1 as u64)
        } else {
            u
        }
    }

    fn echo_of(&self, index: usize) -> Option<&str> {
        self.echo[index / self.n].as_deref()
    }

    /// True when a completions choice opens with its prompt's logprobs, so its first chunk
    /// waits for them.
    fn opens_with_prompt(&self) -> bool {
        self.kind == Kind::Completion && (self.ask.prompt.is_some() || self.ask.vllm_prompt.is_some())
    }

    fn object<'a, C>(&'a self, object: &'a str, choices: &'a [C], usage: Option<Usage>) -> Completion<'a, C> {
        Completion { id: &self.id, object, created: self.created, model: &self.model, choices, usage }
    }

    /// Appends the chunk that carries `piece` of choice `index`.
    fn push_chunk(&self, out: &mut Vec<u8>, index: usize, piece: Piece<'_>, usage: Option<Usage>, lp: ChunkLp<'_>) {
        match self.kind {
            Kind::Completion => {
                let (text, finish_reason, matched_stop) = match piece {
                    Piece::Start(t) | Piece::Text(t) => (t, None, None),
                    Piece::Delta(_) => ("", None, None),
                    Piece::Finish(f, _) => ("", Some(f.reason.as_str()), Some(f.matched.as_ref())),
                };
                let c = TextChoice {
                    index,
                    text,
                    logprobs: lp.legacy,
                    finish_reason,
                    matched_stop,
                    prompt_logprobs: lp.prompt,
                };
                push_frame(out, &self.object(TEXT_COMPLETION, &[c], usage));
            }
            Kind::Chat => {
                let call;
                let (delta, finish_reason, matched_stop) = match piece {
                    Piece::Start(t) => {
                        (ChatDelta { role: Some("assistant"), content: Some(t), ..Default::default() }, None, None)
                    }
                    Piece::Text(t) => (ChatDelta { content: Some(t), ..Default::default() }, None, None),
                    Piece::Delta(Delta::Content(t)) => {
                        (ChatDelta { content: Some(t), ..Default::default() }, None, None)
                    }
                    Piece::Delta(Delta::Reasoning(t)) => {
                        (ChatDelta { reasoning_content: Some(t), ..Default::default() }, None, None)
                    }
                    Piece::Delta(Delta::CallStart { index, id, name }) => {
                        call = [ToolCallDelta {
                            index: *index,
                            id: Some(id),
                            kind: Some("function"),
                            function: FunctionDelta { name: Some(name), arguments: "" },
                        }];
                        (ChatDelta { tool_calls: Some(&call), ..Default::default() }, None, None)
                    }
                    Piece::Delta(Delta::CallArgs { index, text }) => {
                        call = [ToolCallDelta {
                            index: *index,
                            id: None,
                            kind: None,
                            function: FunctionDelta { name: None, arguments: text },
                        }];
                        (ChatDelta { tool_calls: Some(&call), ..Default::default() }, None, None)
                    }
                    Piece::Finish(f, reason) => (ChatDelta::default(), Some(reason), Some(f.matched.as_ref())),
                };
                let c = ChatChunkChoice { index, delta, logprobs: lp.chat, finish_reason, matched_stop };
                push_frame(out, &self.object(CHAT_COMPLETION_CHUNK, &[c], usage));
            }
        }
    }

    /// Appends the usage-only chunk (`choices: []`).
    fn push_usage(&self, out: &mut Vec<u8>, usage: Usage) {
        match self.kind {
            Kind::Completion => push_frame(out, &self.object::<TextChoice<'_>>(TEXT_COMPLETION, &[], Some(usage))),
            Kind::Chat => push_frame(out, &self.object::<ChatChunkChoice<'_>>(CHAT_COMPLETION_CHUNK, &[], Some(usage))),
        }
    }
}

/// Renders an OpenAI stream from choice events.
fn oai_stream(run: OaiRun, events: BoxStream<'static, ChoiceEvent>, opts: StreamOpts) -> Response {
    struct St {
        run: OaiRun,
        events: Option<BoxStream<'static, ChoiceEvent>>,
        opts: StreamOpts,
        tokens: Vec<usize>,
        /// Radix-cached prompt tokens of each prompt (the most any of its choices saw), and
        /// of those the ones from the file tier.
        cached: Vec<(usize, usize)>,
        done: Vec<bool>,
        legacy: Vec<Legacy>,
        /// Chat choices' content / reasoning / tool-call machines.
        shapers: Vec<Shaper>,
        prologue: bool,
        finished: bool,
    }
    impl St {
        fn continuous(&self) -> Option<Usage> {
            self.opts.continuous.then(|| self.run.usage(self.tokens.iter().sum(), sum2(&self.cached)))
        }
    }
    let total = run.choices();
    let st = St {
        events: Some(events),
        opts,
        tokens: vec![0; total],
        cached: vec![(0, 0); run.prompt_tokens.len()],
        done: vec![false; total],
        legacy: vec![Legacy::default(); total],
        shapers: (0..total).map(|_| run.shape.shaper()).collect(),
        prologue: true,
        finished: false,
        run,
    };
    let body = stream::unfold(st, |mut st| async move {
        if st.finished {
            return None;
        }
        let mut out = Vec::new();
        if st.prologue {
            st.prologue = false;
            let u = st.opts.continuous.then(|| st.run.usage(0, (0, 0)));
            for i in 0..st.run.choices() {
                let start = match st.run.kind {
                    Kind::Chat => Some(""),
                    Kind::Completion if st.run.opens_with_prompt() => None,
                    Kind::Completion => st.run.echo_of(i),
                };
                if let Some(text) = start {
                    st.run.push_chunk(&mut out, i, Piece::Start(text), u, ChunkLp::default());
                }
            }
            return Some((out, st));
        }
        let next = match st.events.as_mut() {
            Some(ev) => ev.next().await,
            None => None,
        };
        let texts = st.run.texts.clone();
        match next {
            Some(ChoiceEvent::Started { .. }) => {}
            Some(ChoiceEvent::Prompt { index, entries, .. }) => {
                if st.run.opens_with_prompt() {
                    let legacy = st.run.ask.prompt.map(|k| {
                        for e in &entries {
                            st.legacy[index].push(e, k, &texts);
                        }
                        st.legacy[index].take()
                    });
                    let prompt = st.run.ask.vllm_prompt.map(|k| logprobs::vllm_prompt(&entries, k, &texts));
                    let text = st.run.echo_of(index).unwrap_or("");
                    let lp = ChunkLp { legacy: legacy.as_ref(), prompt: prompt.as_deref(), chat: None };
                    st.run.push_chunk(&mut out, index, Piece::Start(text), st.continuous(), lp);
                }
            }
            Some(ChoiceEvent::Text { index, text, tokens, logprob }) => {
                st.tokens[index] = tokens;
                match (st.run.kind, logprob, st.run.ask.output) {
                    (Kind::Completion, Some(e), Some(k)) => {
                        st.legacy[index].push(&e, k, &texts);
                        let l = st.legacy[index].take();
                        let lp = ChunkLp { legacy: Some(&l), ..Default::default() };
                        st.run.push_chunk(&mut out, index, Piece::Text(&text), st.continuous(), lp);
                    }
                    (Kind::Chat, lpe, k) if !st.shapers[index].is_plain() => {
                        let c = lpe.zip(k).map(|(e, k)| ChatLogprobs {
                            content: vec![logprobs::chat_entry(&e, k, &texts)],
                            refusal: None,
                        });
                        let deltas = st.shapers[index].push(&text);
                        let u = st.continuous();
                        if deltas.is_empty() && c.is_some() {
                            let lp = ChunkLp { chat: c.as_ref(), ..Default::default() };
                            st.run.push_chunk(&mut out, index, Piece::Text(""), u, lp);
                        }
                        for (i, d) in deltas.iter().enumerate() {
                            let lp = ChunkLp { chat: c.as_ref().filter(|_| i == 0), ..Default::default() };
                            st.run.push_chunk(&mut out, index, Piece::Delta(d), u, lp);
                        }
                    }
                    (Kind::Chat, Some(e), Some(k)) => {
                        let c = ChatLogprobs { content: vec![logprobs::chat_entry(&e, k, &texts)], refusal: None };
                        let lp = ChunkLp { chat: Some(&c), ..Default::default() };
                        st.run.push_chunk(&mut out, index, Piece::Text(&text), st.continuous(), lp);
                    }
                    _ if !text.is_empty() => {
                        st.run.push_chunk(&mut out, index, Piece::Text(&text), st.continuous(), ChunkLp::default());
                    }
                    _ => {}
                }
            }
            Some(ChoiceEvent::Done { index, finish }) => {
                st.tokens[index] = finish.completion_tokens;
                let p = index / st.run.n;
                st.cached[p] = st.cached[p].max((finish.cached_tokens, finish.storage_cached_tokens));
                st.done[index] = true;
                if let Some(e) = finish.api_error() {
                    push_api_error(&mut out, &e);
                }
                let u = st.continuous();
                for d in st.shapers[index].finish() {
                    st.run.push_chunk(&mut out, index, Piece::Delta(&d), u, ChunkLp::default());
                }
                let reason = chat_reason(&finish, st.shapers[index].calls_made());
                st.run.push_chunk(&mut out, index, Piece::Finish(&finish, reason), u, ChunkLp::default());
            }
            None => {
                // All choices ended (or the engine went away mid-stream).
                st.events = None;
                st.finished = true;
                if st.done.iter().any(|d| !d) {
                    push_error(&mut out, "the engine stopped before the request finished");
                }
                if st.opts.include_usage {
                    st.run.push_usage(&mut out, st.run.usage(st.tokens.iter().sum(), sum2(&st.cached)));
                }
                push_done(&mut out);
            }
        }
        Some((out, st))
    })
    .filter(|s| std::future::ready(!s.is_empty()))
    .boxed();
    sse_response(body)
}

/// Collects a non-streamed OpenAI answer.
async fn oai_collect(run: OaiRun, events: BoxStream<'static, ChoiceEvent>) -> Result<Response, ApiError> {
    let all = collect(events, run.choices()).await;
    let mut finishes = Vec::with_capacity(all.len());
    let mut completion = 0;
    let mut cached = vec![(0, 0); run.prompt_tokens.len()];
    for (i, c) in all.iter().enumerate() {
        let f = c.finish.clone().ok_or(ApiError::Unavailable)?;
        if let Some(e) = f.api_error() {
            return Err(e);
        }
        completion += f.completion_tokens;
        cached[i / run.n] = cached[i / run.n].max((f.cached_tokens, f.storage_cached_tokens));
        finishes.push(f);
    }
    let usage = Some(run.usage(completion, sum2(&cached)));
    let texts = &run.texts;
    Ok(match run.kind {
        Kind::Completion => {
            let mut bodies = Vec::with_capacity(all.len());
            for (i, c) in all.iter().enumerate() {
                let text = format!("{}{}", run.echo_of(i).unwrap_or(""), c.text);
                let legacy = run.ask.output.map(|k| {
                    let mut l = Legacy::default();
                    if let Some(kp) = run.ask.prompt {
                        for e in &c.prompt {
                            l.push(e, kp, texts);
                        }
                    }
                    for e in &c.tokens {
                        l.push(e, k, texts);
                    }
                    l.take()
                });
                let prompt = run.ask.vllm_prompt.map(|k| logprobs::vllm_prompt(&c.prompt, k, texts));
                bodies.push((text, legacy, prompt));
            }
            let choices: Vec<TextChoice<'_>> = bodies
                .iter()
                .zip(&finishes)
                .enumerate()
                .map(|(index, ((text, legacy, prompt), f))| TextChoice {
                    index,
                    text,
                    logprobs: legacy.as_ref(),
                    finish_reason: Some(f.reason.as_str()),
                    matched_stop: Some(f.matched.as_ref()),
                    prompt_logprobs: prompt.as_deref(),
                })
                .collect();
            Json(run.object(TEXT_COMPLETION, &choices, usage)).into_response()
        }
        Kind::Chat => {
            let lps: Vec<Option<ChatLogprobs>> = all
                .iter()
                .map(|c| {
                    run.ask.output.map(|k| ChatLogprobs {
                        content: c.tokens.iter().map(|e| logprobs::chat_entry(e, k, texts)).collect(),
                        refusal: None,
                    })
                })
                .collect();
            let shaped: Vec<(tools::Message, bool, Vec<ToolCall>)> = all
                .iter()
                .map(|c| {
                    let mut sh = run.shape.shaper();
                    let mut m = tools::Message::default();
                    m.add(&sh.push(&c.text));
                    m.add(&sh.finish());
                    let calls = m
                        .calls
                        .iter()
                        .map(|(id, name, arguments)| ToolCall {
                            id: id.clone(),
                            kind: "function",
                            function: FunctionCall { name: name.clone(), arguments: arguments.clone() },
                        })
                        .collect();
                    (m, sh.reasons(), calls)
                })
                .collect();
            let choices: Vec<ChatChoice<'_>> = shaped
                .iter()
                .zip(&finishes)
                .zip(&lps)
                .enumerate()
                .map(|(index, (((m, reasons, calls), f), lp))| ChatChoice {
                    index,
                    message: AssistantMessage {
                        role: "assistant",
                        content: Some(m.content.as_str()).filter(|c| !c.is_empty() || calls.is_empty()),
                        reasoning_content: reasons.then_some(m.reasoning.as_deref()),
                        tool_calls: (!calls.is_empty()).then_some(calls.as_slice()),
                    },
                    logprobs: lp.as_ref(),
                    finish_reason: chat_reason(f, calls.len()),
                    matched_stop: f.matched.as_ref(),
                })
                .collect();
            Json(run.object(CHAT_COMPLETION, &choices, usage)).into_response()
        }
    })
}

/// Starts prepared OpenAI requests (one per prompt, each with its `echo` text) and answers
/// them as one stream or one JSON body, choices numbered prompt-major.
async fn oai_respond(
    s: &AppState,
    kind: Kind,
    preps: Vec<(gen::Prepared, Option<String>)>,
    ask: LogprobAsk,
    shape: ChatShape,
    stream: bool,
    opts: StreamOpts,
) -> Result<Response, ApiError> {
    let prefix = match kind {
        Kind::Completion => "cmpl",
        Kind::Chat => "chatcmpl",
    };
    let n = preps.first().map_or(1, |p| p.0.params.n);
    let run = OaiRun {
        kind,
        id: format!("{prefix}-{:016x}", s.next_engine_id()),
        model: s.model_id.clone(),
        created: now_secs(),
        prompt_tokens: preps.iter().map(|p| p.0.prompt_ids.len()).collect(),
        n,
        echo: preps.iter().map(|p| p.1.clone()).collect(),
        ask,
        texts: TokenTexts(s.bytes_all.clone()),
        shape,
        tiers: s.engine.hicache().is_some(),
    };
    let over_limit = gen::admit(s)?;
    let mut streams = Vec::with_capacity(preps.len());
    for (i, (mut prep, _)) in preps.into_iter().enumerate() {
        let off = i * n;
        prep.over_limit = over_limit;
        streams.push(gen::start(s, prep)?.map(move |e| e.offset(off)).boxed());
    }
    let events = stream::select_all(streams).boxed();
    if stream {
        Ok(oai_stream(run, events, opts))
    } else {
        oai_collect(run, events).await
    }
}
