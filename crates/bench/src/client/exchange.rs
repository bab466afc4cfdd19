//! One HTTP exchange of a request: the POST (with `--header`s and the routing key), the status,
//! then the whole answer or its stream read frame by frame, every read under
//! `--read-timeout`. Failures come back classified ([`FailureKind`]), never as errors of the
//! run; chunk arrival times go into the record as they are read.

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::Value;
use sparrow_protocol::sse::{SseDecoder, DONE};

use super::stream::{fin_is_some, usage_of, Accumulator, Frame};
use super::{classify, failure, Api, ClientCtx};
use crate::record::{Chunk, Failure, FailureKind, RequestRecord};

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}

async fn next_or_timeout<T>(ctx: &ClientCtx, fut: impl std::future::Future<Output = T>) -> Result<T, Failure> {
    tokio::time::timeout(ctx.read_timeout, fut)
        .await
        .map_err(|_| failure(FailureKind::Timeout, format!("no data for {:.1}s", ctx.read_timeout.as_secs_f64())))
}

/// The header SGLang's client sends a prefix group's routing key in (`serving.py`).
pub const ROUTING_KEY_HEADER: &str = "X-SMG-Routing-Key";

/// How an exchange failed.
pub(super) enum Exchange {
    /// The connection closed before any response byte came (see [`unanswered`]): the request
    /// may be sent again on a fresh connection.
    Unanswered(Failure),
    /// Any other failure, recorded as it is.
    Failed(Failure),
}

impl Exchange {
    /// The failure, whichever way the exchange failed.
    pub(super) fn failure(self) -> Failure {
        match self {
            Exchange::Unanswered(f) | Exchange::Failed(f) => f,
        }
    }
}

impl From<Failure> for Exchange {
    fn from(f: Failure) -> Exchange {
        Exchange::Failed(f)
    }
}

/// Whether a send error is a connection that closed under the request before the response
/// head was read: hyper's incomplete message (the peer closed after the request was written),
/// or a reset, broken pipe or abort. Connect errors and timeouts are not.
fn unanswered(e: &reqwest::Error) -> bool {
    if e.is_timeout() || e.is_connect() {
        return false;
    }
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if s.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_incomplete_message) {
            return true;
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
            if matches!(io.kind(), ConnectionReset | BrokenPipe | ConnectionAborted) {
                return true;
            }
        }
        src = s.source();
    }
    false
}

/// One POST of `body` through `http` (the pooled client or the fresh one), filling `rec` and
/// `acc` as the answer arrives.
/// Applies one SSE event's `data` to `acc`: `[DONE]` ends the answer, a frame adds its text and
/// counts. Returns whether it carried content and, when the frame told it, its token count.
///
/// # Errors
/// A frame that is not JSON, an in-band error, or SGLang's `abort` finish.
pub(super) fn event(api: Api, acc: &mut Accumulator, data: &str) -> Result<(bool, Option<u64>), Failure> {
    let data = data.trim();
    if data.is_empty() {
        return Ok((false, None));
    }
    if data == DONE {
        // Some servers keep the connection open after [DONE]; nothing after it counts.
        acc.done = true;
        return Ok((false, None));
    }
    let parsed = serde_json::from_str::<Frame<'_>>(data);
    let value;
    let frame = match parsed {
        Ok(f) if f.error.is_none() && f.object.as_deref() != Some("error") => f,
        _ => {
            // Rare: an error frame, or a shape the fast reader does not take.
            value = serde_json::from_str::<Value>(data).map_err(|e| {
                let head: String = data.chars().take(200).collect();
                failure(FailureKind::InvalidResponse, format!("{e}: {head}"))
            })?;
            if let Some(msg) = sparrow_protocol::in_band_error(&value) {
                return Err(failure(FailureKind::InBandError, msg));
            }
            Frame::from_value(&value)
        }
    };
    let applied = acc.apply(api, &frame);
    if acc.finish_reason.as_deref() == Some("abort") {
        // SGLang ends an aborted request with finish_reason "abort" (its message in
        // meta_info or the choice); it produced no complete answer.
        return Err(failure(FailureKind::InBandError, format!("request aborted by the server: {data}")));
    }
    Ok(applied)
}

pub(super) async fn exchange(
    ctx: &ClientCtx,
    http: &reqwest::Client,
    body: Bytes,
    rec: &mut RequestRecord,
    acc: &mut Accumulator,
    routing_key: Option<&str>,
) -> Result<(), Exchange> {
    let mut req = http
        .post(&ctx.url)
        .headers(ctx.headers.clone())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body);
    if let Some(k) = routing_key {
        req = req.header(ROUTING_KEY_HEADER, k);
    }
    // Without streaming the headers come only once the whole answer is generated, so only
    // the overall deadline applies to them.
    let resp = match if ctx.stream { next_or_timeout(ctx, req.send()).await? } else { req.send().await } {
        Ok(r) => r,
        Err(e) => {
            let f = failure(classify(&e), error_chain(&e));
            return Err(if unanswered(&e) { Exchange::Unanswered(f) } else { Exchange::Failed(f) });
        }
    };
    ctx.activity.touch();
    rec.first_byte_s = Some(ctx.now());
    let status = resp.status();
    if !status.is_success() {
        let text = next_or_timeout(ctx, resp.text()).await?.unwrap_or_default();
        let msg = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| sparrow_protocol::in_band_error(&v))
            .unwrap_or_else(|| text.chars().take(500).collect());
        return Err(failure(FailureKind::Http(status.as_u16()), msg).into());
    }
    if !ctx.stream {
        let bytes = next_or_timeout(ctx, resp.bytes()).await?.map_err(|e| failure(classify(&e), error_chain(&e)))?;
        let t = ctx.now();
        let v: Value =
            serde_json::from_slice(&bytes).map_err(|e| failure(FailureKind::InvalidResponse, e.to_string()))?;
        if let Some(msg) = sparrow_protocol::in_band_error(&v) {
            return Err(failure(FailureKind::InBandError, msg).into());
        }
        let text = match ctx.api {
            Api::Generate => v.get("text").and_then(Value::as_str),
            Api::Completions => v.pointer("/choices/0/text").and_then(Value::as_str),
            Api::Chat => v.pointer("/choices/0/message/content").and_then(Value::as_str),
            Api::Trt => v.get("text_output").and_then(Value::as_str),
        }
        .ok_or_else(|| failure(FailureKind::InvalidResponse, "answer has no text".into()))?;
        acc.text = text.to_owned();
        let usage = usage_of(&v);
        acc.completion_tokens = usage.and_then(|u| u.get("completion_tokens")).and_then(Value::as_u64);
        acc.prompt_tokens = usage.and_then(|u| u.get("prompt_tokens")).and_then(Value::as_u64);
        // The whole answer arrives at once: it is the first (and only) chunk.
        rec.chunks.push(Chunk { t, tokens: acc.completion_tokens });
        return Ok(());
    }
    let mut stream = resp.bytes_stream();
    let mut sse = SseDecoder::new();
    rec.chunks.reserve(rec.requested_output_len.min(1 << 16) as usize + 1);
    let mut err: Option<Failure> = None;
    loop {
        let Some(item) = next_or_timeout(ctx, stream.next()).await? else {
            break;
        };
        let bytes = item.map_err(|e| failure(classify(&e), error_chain(&e)))?;
        ctx.activity.touch();
        // Frames of one read arrived together: one timestamp for all of them.
        let t = ctx.now();
        let framed = sse.feed_with(&bytes, |data| {
            if err.is_some() || acc.done {
                return;
            }
            match event(ctx.api, acc, data) {
                Ok((true, tokens)) => rec.chunks.push(Chunk { t, tokens }),
                Ok((false, _)) => {}
                Err(f) => err = Some(f),
            }
        });
        if let (None, Err(e)) = (&err, framed) {
            err = Some(failure(FailureKind::InvalidResponse, e.to_string()));
        }
        if let Some(e) = err {
            return Err(e.into());
        }
        if acc.done {
            break;
        }
    }
    let cut = sse.finish();
    // TensorRT-LLM ends a stream with its body: a clean end is the answer's end.
    if acc.done || ((fin_is_some(&acc.finish_reason) || ctx.api == Api::Trt) && !cut) {
        Ok(())
    } else {
        Err(failure(
            FailureKind::StreamEndedEarly,
            if cut { "body ended mid-frame" } else { "body ended without [DONE] or finish_reason" }.into(),
        )
        .into())
    }
}
