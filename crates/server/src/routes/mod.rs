//! Route handlers and wire rendering, one module per API: `openai` (`/v1/completions`,
//! `/v1/chat/completions`, `/v1/responses`), `anthropic` (`/v1/messages`), `native`
//! (SGLang's `/generate`), `admin` (health, info, tokenize, metrics), over the shared frames
//! of `frames`.
//!
//! Bodies are read into the typed requests of [`sparrow_protocol`] (`typed_body`); every
//! chat-like API lowers into the one internal [`crate::chat::ChatRequest`]; each API renders
//! the same choice events ([`crate::gen::ChoiceEvent`]) in its own wire format. Every
//! validation error is returned before the first SSE byte, as a JSON error with its status in
//! the API's shape.

use crate::conn;
use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{Map, Value};
use std::time::{SystemTime, UNIX_EPOCH};

mod admin;
mod anthropic;
mod embed;
mod frames;
mod native;
mod openai;

use admin::{
    detokenize, flush_cache, get_load, health, health_generate, metrics, model_info, models, server_info, tokenize,
};
use native::generate;
use openai::{chat, completions, responses_create, responses_delete, responses_get};

/// Largest request body accepted (a prompt at the context limit is far smaller).
pub const BODY_LIMIT: usize = 16 << 20;

/// The router, apart from any socket.
pub fn app(state: AppState) -> Router {
    // The generating routes, refused up front on an embedding server (before a chat template
    // or a grammar is even looked at).
    let generation = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/responses", post(responses_create))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/generate", post(generate))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), generation_only));
    Router::new()
        .route("/health", get(health))
        .route("/health_generate", get(health_generate))
        .route("/v1/models", get(models))
        .route("/get_model_info", get(model_info))
        // sglang-router asks `/model_info` first, then `/get_model_info`.
        .route("/model_info", get(model_info))
        .route("/get_load", get(get_load))
        .route("/get_server_info", get(server_info))
        .route("/server_info", get(server_info))
        .route("/flush_cache", post(flush_cache).get(flush_cache))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .merge(generation)
        .route("/v1/responses/{id}", get(responses_get).delete(responses_delete))
        .route("/v1/embeddings", post(embed::embeddings))
        .route("/encode", post(embed::encode))
        .route("/v1/rerank", post(embed::rerank))
        .route("/rerank", post(embed::rerank))
        .route("/v2/rerank", post(embed::rerank))
        .route("/v1/score", post(embed::score))
        .route("/score", post(embed::score))
        .fallback(|uri: Uri| async move { in_shape_of(&uri, ApiError::NotFound("no such route".into())) })
        .method_not_allowed_fallback(|uri: Uri| async move { in_shape_of(&uri, ApiError::MethodNotAllowed) })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn_with_state(state.clone(), require_api_key))
        .with_state(state)
}

/// A 400 naming `model` for a generation request to a server that serves embeddings.
async fn generation_only(
    State(s): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if s.engine.embedding().is_none() {
        return next.run(req).await;
    }
    let e = ApiError::bad(
        "model",
        format!(
            "model: {} serves embeddings and generates no text (use /v1/embeddings, /v1/rerank, /v1/score or /encode)",
            s.model_id
        ),
    );
    in_shape_of(req.uri(), e)
}

/// Reads a JSON object body into the typed request `T` (unknown fields ignored), keeping the
/// object for the fields read by name. A field of the wrong shape is a 400 naming its path
/// (`input[0].content: …`).
fn typed_body<T: serde::de::DeserializeOwned>(
    body: &Result<Bytes, BytesRejection>,
) -> Result<(T, Map<String, Value>), ApiError> {
    let m = json_object(body)?;
    let t = serde_path_to_error::deserialize(&m).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let inner = if inner.contains("did not match any variant") {
            "has the wrong type (see the API reference for its forms)".to_owned()
        } else {
            inner
        };
        if path == "." {
            // serde's "missing field `x`" at the top level: the field is `x`.
            match inner.strip_prefix("missing field `").and_then(|r| r.split_once('`')) {
                Some((field, _)) => ApiError::bad(field, inner.clone()),
                None => ApiError::bad_body(inner),
            }
        } else {
            ApiError::bad(&path, format!("{path}: {inner}"))
        }
    })?;
    Ok((t, m))
}

/// An error in the shape of the API `uri` belongs to: Anthropic's under `/v1/messages`, else
/// OpenAI's.
fn in_shape_of(uri: &Uri, e: ApiError) -> Response {
    if uri.path().starts_with("/v1/messages") {
        anthropic::AnthropicError(e).into_response()
    } else {
        e.into_response()
    }
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Parses a JSON object body; malformed JSON is a 400, an oversized body a 413 and a stalled one
/// a 408, all as OpenAI error JSON (not axum's plain-text rejections).
fn json_object(body: &Result<Bytes, BytesRejection>) -> Result<Map<String, Value>, ApiError> {
    let body = match body {
        Ok(b) => b,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return Err(ApiError::TooLarge(format!("the request body is larger than {} MiB", BODY_LIMIT >> 20)))
        }
        Err(e) if conn::is_body_timeout(e) => return Err(ApiError::BodyTimeout),
        Err(e) => return Err(ApiError::bad_body(format!("cannot read the request body: {e}"))),
    };
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad_body("the request body must be a JSON object")),
        Err(e) => Err(ApiError::bad_body(format!("invalid JSON body: {e}"))),
    }
}

/// `--api-key`, as SGLang's `add_api_key_middleware` checks it: `OPTIONS`, `/health*` and
/// `/metrics*` pass (load balancers and scrapers hold no key), everything else needs
/// `Authorization: Bearer <key>` or, as Anthropic's SDKs send it, `x-api-key: <key>`, or gets a
/// 401 (in Anthropic's error shape on `/v1/messages*`). sglang-router sends its own
/// `Authorization` and also forwards the client's, so a request passes when any value is right.
async fn require_api_key(
    State(s): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(key) = s.api_key.as_deref() else { return next.run(req).await };
    let path = req.uri().path();
    if req.method() == axum::http::Method::OPTIONS || path.starts_with("/health") || path.starts_with("/metrics") {
        return next.run(req).await;
    }
    let want = format!("Bearer {key}");
    let h = req.headers();
    let ok = h.get_all(header::AUTHORIZATION).iter().any(|v| constant_time_eq(v.as_bytes(), want.as_bytes()))
        || h.get_all("x-api-key").iter().any(|v| constant_time_eq(v.as_bytes(), key.as_bytes()));
    if ok {
        next.run(req).await
    } else {
        in_shape_of(req.uri(), ApiError::Unauthorized)
    }
}

/// Byte equality whose time does not depend on where the inputs differ (only on their
/// lengths), so a wrong key cannot be found a byte at a time by timing.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn token_ids(v: &Value, field: &str) -> Result<Vec<u32>, ApiError> {
    let arr = v.as_array().ok_or_else(|| ApiError::bad(field, format!("{field} must be a list of token ids")))?;
    arr.iter()
        .map(|x| {
            x.as_u64()
                .filter(|&t| t <= u32::MAX as u64)
                .map(|t| t as u32)
                .ok_or_else(|| ApiError::bad(field, format!("{field} must be a list of token ids")))
        })
        .collect()
}
