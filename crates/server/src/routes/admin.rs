//! The routes that are no API of their own: health, the model list and model info, load and
//! server info (SGLang's and sglang-router's spellings), cache flush, tokenize / detokenize and
//! Prometheus `/metrics`.

use super::{json_object, now_secs, token_ids};
use crate::error::ApiError;
use crate::gen::{self, ChoiceEvent};
use crate::params::{self, Fields};
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::StreamExt;
use serde_json::Value;
use sparrow_protocol::openai::{ModelCard, ModelList};
use sparrow_protocol::sglang::{DetokenizeResponse, LoadReport, ModelInfoResponse, ServerInfo, TokenizeResponse};
use std::time::Duration;

pub(super) async fn health() -> StatusCode {
    StatusCode::OK
}

/// Runs one greedy token through the engine (SGLang's `/health_generate`).
pub(super) async fn health_generate(State(s): State<AppState>) -> Response {
    let params = params::GenParams {
        max_tokens: Some(1),
        default_max: None,
        max_tokens_field: "max_tokens",
        sampling: sparrow_engine::sampler::SamplingParams { temperature: 0.0, ..Default::default() },
        stop: Vec::new(),
        stop_token_ids: Vec::new(),
        ignore_eos: true,
        n: 1,
        skip_special_tokens: true,
        no_stop_trim: false,
        logprobs: Default::default(),
        constraint: None,
        priority: None,
        reasoning_budget: None,
        lazy_calls: None,
    };
    let ids = s.tokenizer.encode("ping", false).unwrap_or_else(|_| vec![0]);
    let run = async {
        if s.engine.embedding().is_some() {
            // An embedding server's health check embeds one input instead.
            return crate::embed::run(&s, vec![ids], true, None).await.map(|_| ());
        }
        let prep = gen::prepare(&s, ids, params)?;
        let mut ev = gen::start(&s, prep)?;
        while let Some(e) = ev.next().await {
            if let ChoiceEvent::Done { finish, .. } = e {
                return match finish.error {
                    None => Ok(()),
                    Some(m) => Err(ApiError::Engine(m)),
                };
            }
        }
        Err(ApiError::Unavailable)
    };
    match tokio::time::timeout(Duration::from_secs(20), run).await {
        Ok(Ok(())) => StatusCode::OK.into_response(),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, Json(e.body())).into_response(),
        Err(_) => {
            (StatusCode::SERVICE_UNAVAILABLE, Json(ApiError::Engine("health generation timed out".into()).body()))
                .into_response()
        }
    }
}

pub(super) async fn models(State(s): State<AppState>) -> Response {
    let card = ModelCard {
        id: &s.model_id,
        object: "model",
        created: now_secs(),
        owned_by: "sparrow",
        root: &s.model_id,
        max_model_len: s.engine.config().context_length,
    };
    Json(ModelList { object: "list", data: std::slice::from_ref(&card) }).into_response()
}

pub(super) async fn model_info(State(s): State<AppState>) -> Response {
    let i = s.engine.info();
    Json(ModelInfoResponse {
        model_path: &s.model_path,
        tokenizer_path: s.tokenizer.source(),
        is_generation: s.engine.embedding().is_none(),
        architecture: &i.architecture,
        name: &i.name,
        vocab_size: i.vocab_size,
        context_length: s.engine.config().context_length,
        model_type: &i.architecture,
        architectures: [hf_architecture(&i.architecture)],
        preferred_sampling_params: s.server_info.get("preferred_sampling_params").filter(|v| !v.is_null()).cloned(),
        weight_version: "default",
    })
    .into_response()
}

/// The HF class of a model whose architecture (a GGUF `general.architecture` or an HF
/// `model_type`) is `name`, from the architecture table; `unknown` for one it lacks.
fn hf_architecture(name: &str) -> &'static str {
    sparrow_engine::model::arch::hf_class(name).unwrap_or("unknown")
}

/// SGLang's `GET /get_load`: a list with one [`LoadReport`] (one engine, dp rank 0).
pub(super) async fn get_load(State(s): State<AppState>) -> Response {
    let st = s.engine.stats();
    let held = st.used_pages.saturating_sub(st.evictable_pages);
    Json([LoadReport {
        dp_rank: 0,
        num_reqs: st.num_running_reqs + st.num_queue_reqs,
        num_waiting_reqs: st.num_queue_reqs,
        num_tokens: held * s.engine.config().page_size,
    }])
    .into_response()
}

pub(super) async fn server_info(State(s): State<AppState>) -> Response {
    match &s.server_info {
        Value::Object(args) => {
            let st = s.engine.stats();
            Json(ServerInfo { args, internal_states: std::slice::from_ref(&st) }).into_response()
        }
        // The binary always passes an object; anything else is shown as it is.
        other => Json(other).into_response(),
    }
}

pub(super) async fn flush_cache(State(s): State<AppState>) -> Result<String, ApiError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    s.engine.flush_cache(Box::new(move |n| {
        let _ = tx.send(n);
    }))?;
    let n = rx.await.map_err(|_| ApiError::Unavailable)?;
    Ok(format!("Cache flushed: {n} pages freed.\n"))
}

pub(super) async fn tokenize(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let m = json_object(&body)?;
    let text = m
        .get("text")
        .or_else(|| m.get("prompt"))
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad("text", "send the text to tokenize as a string in `text` (or `prompt`)"))?;
    let add = Fields(&m).bool("add_special_tokens")?.unwrap_or(true);
    let ids = s.tokenizer.encode(text, add).map_err(|e| ApiError::bad("text", e.to_string()))?;
    let max_model_len = s.engine.config().context_length;
    Ok(Json(TokenizeResponse { tokens: &ids, count: ids.len(), max_model_len }).into_response())
}

pub(super) async fn detokenize(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let m = json_object(&body)?;
    let ids = token_ids(m.get("tokens").unwrap_or(&Value::Null), "tokens")?;
    let vocab = s.engine.info().vocab_size;
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad("tokens", format!("token id {bad} is outside the vocabulary (size {vocab})")));
    }
    let skip = Fields(&m).bool("skip_special_tokens")?.unwrap_or(false);
    let bytes = if skip { &s.bytes_skip } else { &s.bytes_all };
    if bytes.is_empty() {
        // A vocabulary without byte spellings (WordPiece, on an embedding server).
        let text = s.tokenizer.decode(&ids, skip).map_err(|e| ApiError::bad("tokens", e.to_string()))?;
        return Ok(Json(DetokenizeResponse { text: &text }).into_response());
    }
    let raw: Vec<u8> = ids.iter().flat_map(|&t| bytes.get(t as usize).into_iter().flatten().copied()).collect();
    Ok(Json(DetokenizeResponse { text: &String::from_utf8_lossy(&raw) }).into_response())
}

pub(super) async fn metrics(State(s): State<AppState>) -> Response {
    let body = s.metrics.render(&s.engine.stats());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sparrow_engine::model::arch::ARCHITECTURES;

    /// Every architecture of the table has its HF class in `/get_model_info` (for a GGUF file
    /// of it, whose architecture is the row's name, and for each of its HF `model_type`s), and
    /// a row in the families table of `docs/serve.md`.
    #[test]
    fn every_architecture_has_its_class_and_a_docs_row() {
        let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/serve.md"))
            .expect("docs/serve.md");
        for a in ARCHITECTURES {
            assert_ne!(hf_architecture(a.name), "unknown", "{}", a.name);
            assert_eq!(hf_architecture(a.name), a.class_of(a.name), "{}", a.name);
            for (mt, class) in a.hf {
                assert_eq!(hf_architecture(mt), *class, "{mt}");
            }
            assert!(docs.contains(&format!("\n  | `{}` |", a.name)), "docs/serve.md has no row for {}", a.name);
        }
        assert_eq!(hf_architecture("rwkv7"), "unknown");
    }
}
