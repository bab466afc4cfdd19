//! `POST /v1/completions`: prompts as text, token ids or lists of either; `n` choices each.

use super::{oai_respond, stream_opts, Kind};
use crate::chat::ChatShape;
use crate::error::ApiError;
use crate::gen::{self};
use crate::params::{self, Api, Fields};
use crate::routes::{json_object, token_ids};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;
use serde_json::Value;

/// Most choices one `/v1/completions` request may ask for (prompts × `n`).
pub const MAX_CHOICES: usize = 1024;

/// The prompts of `/v1/completions`: a string, a list of token ids, or a list of either
/// (batched, answered prompt-major); each with the text `echo` shows.
fn completion_prompts(s: &AppState, v: Option<&Value>) -> Result<Vec<(Vec<u32>, String)>, ApiError> {
    let v = v.ok_or_else(|| ApiError::bad("prompt", "prompt is required"))?;
    let one = |v: &Value, i: Option<usize>| -> Result<(Vec<u32>, String), ApiError> {
        let at = i.map_or(String::new(), |i| format!("prompt[{i}]: "));
        match v {
            Value::String(t) if t.is_empty() => {
                Err(ApiError::bad("prompt", format!("{at}the prompt is empty; send at least one token")))
            }
            Value::String(t) => {
                let ids = s.tokenizer.encode(t, true).map_err(|e| ApiError::bad("prompt", format!("{at}{e}")))?;
                Ok((ids, t.clone()))
            }
            Value::Array(a) if a.is_empty() => {
                Err(ApiError::bad("prompt", format!("{at}the prompt is empty; send at least one token")))
            }
            Value::Array(_) => {
                let ids = token_ids(v, "prompt")?;
                let text = decode_all(s, &ids);
                Ok((ids, text))
            }
            _ => Err(ApiError::bad("prompt", format!("{at}a prompt must be a string or a list of token ids"))),
        }
    };
    match v {
        Value::Array(a) if a.is_empty() => Err(ApiError::bad("prompt", "the prompt is empty; send at least one token")),
        Value::Array(a) if a.iter().all(Value::is_number) => Ok(vec![one(v, None)?]),
        Value::Array(a) => a.iter().enumerate().map(|(i, p)| one(p, Some(i))).collect(),
        _ => Ok(vec![one(v, None)?]),
    }
}

fn decode_all(s: &AppState, ids: &[u32]) -> String {
    let raw: Vec<u8> = ids.iter().flat_map(|&t| s.bytes_all.get(t as usize).into_iter().flatten().copied()).collect();
    String::from_utf8_lossy(&raw).into_owned()
}

/// OpenAI's `POST /v1/completions`.
pub(crate) async fn completions(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let m = json_object(&body)?;
    let f = Fields(&m);
    let stream = f.bool("stream")?.unwrap_or(false);
    let opts = stream_opts(&m, stream)?;
    let echo = f.bool("echo")?.unwrap_or(false);
    let ask = params::parse_logprobs(&m, Api::Completions, echo)?;
    let p = params::parse(&m, Api::Completions)?;
    let prompts = completion_prompts(&s, m.get("prompt"))?;
    if prompts.len() * p.n > MAX_CHOICES {
        return Err(ApiError::bad(
            "prompt",
            format!("{} prompts × n = {} ask for more than {MAX_CHOICES} choices", prompts.len(), p.n),
        ));
    }
    let mut preps = Vec::with_capacity(prompts.len());
    for (ids, text) in prompts {
        let mut p = p.clone();
        p.logprobs = ask.spec(ids.len());
        preps.push((gen::prepare(&s, ids, p)?, echo.then_some(text)));
    }
    oai_respond(&s, Kind::Completion, preps, ask, ChatShape::default(), stream, opts).await
}
