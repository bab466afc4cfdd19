//! The frames every streamed answer is made of (OpenAI chunks and SGLang's `/generate`
//! frames alike): `data: ` lines, the error frame, `[DONE]`, the SSE response, and a whole
//! answer collected from its choice events for a non-streamed reply.

use crate::gen::{ChoiceEvent, Finish};
use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::stream::{BoxStream, StreamExt};
use serde::Serialize;
use sparrow_engine::scheduler::TokenLogprob;
use sparrow_protocol::{sse, ErrorBody};
use std::convert::Infallible;

/// Appends `v` as an SSE frame. Our bodies always serialize (string keys, no paths); were one
/// not to, the client would get an in-band error instead of a broken frame.
pub(super) fn push_frame<T: Serialize>(out: &mut Vec<u8>, v: &T) {
    if let Err(e) = sse::push_json(out, v) {
        push_error(out, &format!("cannot render a response frame: {e}"));
    }
}

/// Appends an in-band error frame (OpenAI error JSON), for a failure after the stream started.
pub(super) fn push_error(out: &mut Vec<u8>, message: &str) {
    // An `ErrorBody` has string fields only: it cannot fail to serialize.
    let _ = sse::push_json(out, &ErrorBody::new(message, "server_error", 500));
}

/// An in-band error event of an API error (its own type and status code: a 503 for an
/// overloaded server, not a 500).
pub(super) fn push_api_error(out: &mut Vec<u8>, e: &crate::error::ApiError) {
    let _ = sse::push_json(out, &e.body());
}

pub(super) fn push_done(out: &mut Vec<u8>) {
    out.extend_from_slice(sse::frame(sse::DONE).as_bytes());
}

pub(super) fn sse_response(body: BoxStream<'static, Vec<u8>>) -> Response {
    let body = Body::from_stream(body.map(|s| Ok::<_, Infallible>(Bytes::from(s))));
    ([(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

/// One choice, drained: its whole text, its end, and the logprobs it got.
#[derive(Default)]
pub(super) struct Collected {
    pub(super) text: String,
    pub(super) finish: Option<Finish>,
    pub(super) prompt: Vec<TokenLogprob>,
    pub(super) tokens: Vec<TokenLogprob>,
}

/// Drains a request's events into each of its `total` choices.
pub(super) async fn collect(mut events: BoxStream<'static, ChoiceEvent>, total: usize) -> Vec<Collected> {
    let mut c: Vec<Collected> = (0..total).map(|_| Collected::default()).collect();
    while let Some(e) = events.next().await {
        match e {
            ChoiceEvent::Text { index, text, logprob, .. } => {
                c[index].text.push_str(&text);
                c[index].tokens.extend(logprob.map(|b| *b));
            }
            ChoiceEvent::Prompt { index, entries, .. } => c[index].prompt = entries,
            ChoiceEvent::Done { index, finish } => c[index].finish = Some(finish),
            ChoiceEvent::Started { .. } => {}
        }
    }
    c
}
