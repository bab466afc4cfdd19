//! `POST /v1/completions`: prompts as text, token ids or lists of either; `n` choices each.

use super::{oai_respond, stream_opts, Kind};
use crate::chat::ChatShape;
use crate::error::ApiError;
use crate::gen::{self};
use crate::params::{self, Api};
use crate::routes::typed_body;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;
use sparrow_protocol::openai_request::{CompletionBody, OnePrompt, PromptIn};

/// Most choices one `/v1/completions` request may ask for (prompts × `n`).
pub const MAX_CHOICES: usize = 1024;

/// The prompts of `/v1/completions` (a string, token ids, or a batch of either, answered
/// prompt-major), each with the text `echo` shows.
fn completion_prompts(s: &AppState, p: Option<PromptIn>) -> Result<Vec<(Vec<u32>, String)>, ApiError> {
    let p = p.ok_or_else(|| ApiError::bad("prompt", "prompt is required"))?;
    let one = |p: OnePrompt, i: Option<usize>| -> Result<(Vec<u32>, String), ApiError> {
        let at = i.map_or(String::new(), |i| format!("prompt[{i}]: "));
        match p {
            OnePrompt::Text(t) if t.is_empty() => {
                Err(ApiError::bad("prompt", format!("{at}the prompt is empty; send at least one token")))
            }
            OnePrompt::Ids(ids) if ids.is_empty() => {
                Err(ApiError::bad("prompt", format!("{at}the prompt is empty; send at least one token")))
            }
            OnePrompt::Text(t) => {
                let ids = s.tokenizer.encode(&t, true).map_err(|e| ApiError::bad("prompt", format!("{at}{e}")))?;
                Ok((ids, t))
            }
            OnePrompt::Ids(ids) => {
                let text = decode_all(s, &ids);
                Ok((ids, text))
            }
        }
    };
    match p {
        PromptIn::One(p) => Ok(vec![one(p, None)?]),
        PromptIn::Batch(b) => b.into_iter().enumerate().map(|(i, p)| one(p, Some(i))).collect(),
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
    let (b, m): (CompletionBody, _) = typed_body(&body)?;
    let stream = b.stream.unwrap_or(false);
    let opts = stream_opts(b.stream_options, stream)?;
    let echo = b.echo.unwrap_or(false);
    let ask = params::parse_logprobs(&m, Api::Completions, echo)?;
    let p = params::parse(&m, Api::Completions, &s.sampling_defaults)?;
    let prompts = completion_prompts(&s, b.prompt)?;
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
