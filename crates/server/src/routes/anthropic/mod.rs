//! Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`
//! ([`messages`]), rendered by [`render`], with errors in Anthropic's shape and status codes
//! (`{"type": "error", "error": {"type": "invalid_request_error", "message"}}`, its "Errors" page).

use crate::error::ApiError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use sparrow_protocol::anthropic::ErrorBody;

mod messages;
mod render;

pub(super) use messages::{count_tokens, messages};

/// An [`ApiError`] answered in Anthropic's error shape.
#[derive(Debug)]
pub(crate) struct AnthropicError(pub(crate) ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

/// Anthropic's error `type` for an error (its "Errors" page: 400 `invalid_request_error`,
/// 401 `authentication_error`, 404 `not_found_error`, 413 `request_too_large`, 500
/// `api_error`, 529 `overloaded_error`).
pub(crate) fn error_type(e: &ApiError) -> &'static str {
    match e {
        ApiError::BadRequest { .. } | ApiError::MethodNotAllowed | ApiError::BodyTimeout => "invalid_request_error",
        ApiError::Unauthorized => "authentication_error",
        ApiError::NotFound(_) => "not_found_error",
        ApiError::TooLarge(_) => "request_too_large",
        ApiError::Engine(_) => "api_error",
        ApiError::Unavailable | ApiError::TooManyConnections(_) | ApiError::Overloaded(_) => "overloaded_error",
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let kind = error_type(&self.0);
        // Anthropic answers "overloaded" with its own 529.
        let status = if kind == "overloaded_error" {
            StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
        } else {
            self.0.status()
        };
        let mut r = (status, Json(ErrorBody::new(kind, self.0.to_string()))).into_response();
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert("www-authenticate", axum::http::HeaderValue::from_static("x-api-key"));
        }
        if matches!(self.0, ApiError::Overloaded(_)) {
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(crate::error::RETRY_AFTER_S),
            );
        }
        r
    }
}
