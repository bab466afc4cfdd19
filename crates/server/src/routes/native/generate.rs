//! SGLang's native `POST /generate`: text or `input_ids`, `sampling_params`, and a stream that
//! sends the whole text so far with `meta_info` in every frame.

use super::super::frames::{collect, push_api_error, push_done, push_frame, sse_response};
use super::super::typed_body;
use crate::error::ApiError;
use crate::gen::{self, ChoiceEvent, EndReason, Finish};
use crate::logprobs::{self, TokenTexts};
use crate::params::{self, Api, LogprobAsk};
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, StreamExt};
use sparrow_engine::scheduler::TokenLogprob;
use sparrow_protocol::sglang::{
    GenerateBody, GenerateResponse, GenerateText, MetaFinishReason, MetaInfo, NativeLogprobs, SpecMeta,
};
use sparrow_protocol::CachedTokensDetails;

fn native_finish(f: &Finish) -> MetaFinishReason<'_> {
    match f.reason {
        EndReason::Stop => MetaFinishReason::Stop { matched: f.matched.as_ref() },
        EndReason::Length => MetaFinishReason::Length { length: f.completion_tokens },
        EndReason::Abort => MetaFinishReason::Abort { message: f.error.as_deref() },
    }
}

/// The per-request part of every `/generate` answer and frame.
struct NativeRun {
    /// `meta_info.id` of each choice.
    ids: Vec<String>,
    prompt_tokens: usize,
    ask: LogprobAsk,
    texts: TokenTexts,
    /// The token at `logprob_start_len`, whose input entry is `null` (SGLang pads it); `None`
    /// without `return_logprob` or with a start beyond the prompt.
    null_first: Option<u32>,
    /// The server has the hierarchical cache: `cached_tokens_details` is reported.
    tiers: bool,
}

impl NativeRun {
    fn answer<'a>(
        &'a self,
        index: usize,
        text: &'a str,
        tokens: usize,
        fin: Option<&'a Finish>,
        lp: &'a NativeLogprobs,
    ) -> GenerateResponse<'a> {
        let on = self.ask.output.is_some();
        let top = on && self.ask.output.unwrap_or(0) > 0;
        let ids = on && !self.ask.token_ids.is_empty();
        let meta_info = MetaInfo {
            id: &self.ids[index],
            prompt_tokens: self.prompt_tokens,
            completion_tokens: tokens,
            // Reported on a choice's last frame; the frames before it say 0.
            cached_tokens: fin.map_or(0, |f| f.cached_tokens),
            cached_tokens_details: fin
                .filter(|_| self.tiers)
                .map(|f| CachedTokensDetails::new(f.cached_tokens as u64, f.storage_cached_tokens as u64)),
            finish_reason: fin.map(native_finish),
            input_token_logprobs: on.then_some(&lp.input_token_logprobs[..]),
            output_token_logprobs: on.then_some(&lp.output_token_logprobs[..]),
            input_top_logprobs: top.then_some(&lp.input_top_logprobs[..]),
            output_top_logprobs: top.then_some(&lp.output_top_logprobs[..]),
            input_token_ids_logprobs: ids.then_some(&lp.input_token_ids_logprobs[..]),
            output_token_ids_logprobs: ids.then_some(&lp.output_token_ids_logprobs[..]),
            spec: fin.and_then(|f| {
                SpecMeta::new(f.completion_tokens, f.spec.verify_ct, f.spec.draft_tokens, f.spec.accepted_tokens)
            }),
        };
        GenerateResponse { text, meta_info, index }
    }

    /// Adds prompt entries (after the `null` one at `logprob_start_len`) or one generated
    /// token's entry to a choice's lists.
    fn add(&self, acc: &mut NativeLogprobs, entries: &[TokenLogprob], input: bool) {
        if let Some(token) = self.null_first.filter(|_| input) {
            let null = TokenLogprob { token, logprob: None, rank: 0, top: Vec::new(), ids: Vec::new() };
            logprobs::native_push(acc, &null, true, &self.ask, &self.texts);
        }
        for e in entries {
            logprobs::native_push(acc, e, input, &self.ask, &self.texts);
        }
    }
}

/// SGLang's `POST /generate`.
pub(crate) async fn generate(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (b, m): (GenerateBody, _) = typed_body(&body)?;
    let stream = b.stream.unwrap_or(false);
    let sp = b.sampling_params.unwrap_or_default();
    let ask = params::parse_logprobs(&m, Api::Native, false)?;
    let vocab = s.engine.info().vocab_size;
    if let Some(bad) = ask.token_ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad(
            "token_ids_logprob",
            format!("token id {bad} is outside the vocabulary (size {vocab})"),
        ));
    }
    if let Some(k) = sp.keys().find(|k| !params::NATIVE_SAMPLING_KEYS.contains(&k.as_str())) {
        return Err(ApiError::bad("sampling_params", format!("unknown sampling parameter {k:?}")));
    }
    let mut p = params::parse(&sp, Api::Native, &s.sampling_defaults)?;
    p.priority = params::priority(&m)?;
    let ids = match (b.text, b.input_ids) {
        (Some(GenerateText(t)), None) => {
            if t.is_empty() {
                return Err(ApiError::bad("text", "the prompt is empty; send at least one token"));
            }
            s.tokenizer.encode(&t, true).map_err(|e| ApiError::bad("text", e.to_string()))?
        }
        (None, Some(ids)) => ids,
        (Some(_), Some(_)) => return Err(ApiError::bad_body("send either text or input_ids, not both")),
        (None, None) => return Err(ApiError::bad_body("text or input_ids is required")),
    };
    p.logprobs = ask.spec(ids.len());
    let null_first = ask.output.and_then(|_| ids.get(ask.start(ids.len())).copied());
    let prep = gen::prepare(&s, ids, p)?;
    let rid = format!("{:032x}", s.next_engine_id());
    let n = prep.params.n;
    let ids = if n > 1 { (0..n).map(|i| format!("{rid}-{i}")).collect() } else { vec![rid] };
    let texts = TokenTexts(s.bytes_all.clone());
    let tiers = s.engine.hicache().is_some();
    let run = NativeRun { ids, prompt_tokens: prep.prompt_ids.len(), ask, texts, null_first, tiers };
    let mut prep = prep;
    prep.over_limit = gen::admit(&s)?;
    let mut events = gen::start(&s, prep)?;
    if !stream {
        let all = collect(events, n).await;
        let mut done = Vec::with_capacity(n);
        let mut lps = Vec::with_capacity(n);
        for c in &all {
            let fin = c.finish.clone().ok_or(ApiError::Unavailable)?;
            if let Some(e) = fin.api_error() {
                return Err(e);
            }
            done.push(fin);
            let mut acc = NativeLogprobs::default();
            run.add(&mut acc, &c.prompt, true);
            run.add(&mut acc, &c.tokens, false);
            lps.push(acc);
        }
        let outs: Vec<GenerateResponse<'_>> = all
            .iter()
            .zip(&done)
            .zip(&lps)
            .enumerate()
            .map(|(i, ((c, fin), lp))| run.answer(i, &c.text, fin.completion_tokens, Some(fin), lp))
            .collect();
        // One prompt, one choice: the object itself, as SGLang answers; else the list.
        return Ok(match outs.as_slice() {
            [one] => Json(one).into_response(),
            all => Json(all).into_response(),
        });
    }
    let mut acc: Vec<String> = vec![String::new(); n];
    let mut lps: Vec<NativeLogprobs> = vec![NativeLogprobs::default(); n];
    let mut ended = false;
    let body = stream::poll_fn(move |cx| {
        use std::task::Poll;
        if ended {
            return Poll::Ready(None);
        }
        let mut out = Vec::new();
        match events.poll_next_unpin(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(ChoiceEvent::Prompt { index, entries, .. })) => {
                run.add(&mut lps[index], &entries, true);
            }
            Poll::Ready(Some(ChoiceEvent::Started { .. })) => {}
            Poll::Ready(Some(ChoiceEvent::Text { index, text, tokens, logprob })) => {
                let has_lp = logprob.is_some();
                if let Some(e) = logprob {
                    run.add(&mut lps[index], std::slice::from_ref(&*e), false);
                }
                if !text.is_empty() || has_lp {
                    acc[index].push_str(&text);
                    push_frame(&mut out, &run.answer(index, &acc[index], tokens, None, &lps[index]));
                }
            }
            Poll::Ready(Some(ChoiceEvent::Done { index, finish })) => {
                if let Some(e) = finish.api_error() {
                    push_api_error(&mut out, &e);
                }
                let frame = run.answer(index, &acc[index], finish.completion_tokens, Some(&finish), &lps[index]);
                push_frame(&mut out, &frame);
            }
            Poll::Ready(None) => {
                ended = true;
                push_done(&mut out);
            }
        }
        Poll::Ready(Some(out))
    })
    .filter(|s| std::future::ready(!s.is_empty()))
    .boxed();
    Ok(sse_response(body))
}
