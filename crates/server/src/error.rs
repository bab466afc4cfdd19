//! API errors: one enum, mapped to an HTTP status and OpenAI's error JSON in one place
//! (`{"error": {"message", "type", "param", "code"}}`, as OpenAI and vLLM send it).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sparrow_protocol::ErrorBody;

/// Every error a handler can return.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed or out-of-range input (400, `invalid_request_error`).
    #[error("{message}")]
    BadRequest {
        /// What is wrong, naming the field.
        message: String,
        /// The offending field, when there is one.
        param: Option<String>,
    },
    /// Unknown route or model (404).
    #[error("{0}")]
    NotFound(String),
    /// Known route, wrong method (405).
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// Body over the size limit (413).
    #[error("{0}")]
    TooLarge(String),
    /// The engine is gone or failed the request (500 / 503).
    #[error("{0}")]
    Engine(String),
    /// The engine thread stopped (503).
    #[error("the engine is not running")]
    Unavailable,
    /// `--api-key` is set and the request carried neither `Authorization: Bearer <key>` nor
    /// `x-api-key: <key>` (401).
    #[error(
        "missing or wrong API key: send `Authorization: Bearer <key>` or `x-api-key: <key>` (the server's --api-key)"
    )]
    Unauthorized,
    /// `--max-connections` connections are open; this one is answered and closed (503).
    #[error("the server has {0} connections open (its --max-connections); retry shortly")]
    TooManyConnections(usize),
    /// The server is too busy to take the request: `--max-queued-requests` waiting, or it
    /// waited past `--queue-timeout` (503 with `Retry-After`, as SGLang refuses a full queue).
    #[error("{0}")]
    Overloaded(String),
    /// The request body stopped arriving for `--timeout-body-read` seconds (408).
    #[error("the request body stopped arriving (nothing for the server's --timeout-body-read seconds)")]
    BodyTimeout,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn bad(param: &str, message: impl Into<String>) -> Self {
        ApiError::BadRequest { message: message.into(), param: Some(param.to_owned()) }
    }

    /// A 400 not tied to one field.
    pub fn bad_body(message: impl Into<String>) -> Self {
        ApiError::BadRequest { message: message.into(), param: None }
    }

    /// HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Engine(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::TooManyConnections(_) | ApiError::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> ErrorBody {
        let kind = match self {
            ApiError::BadRequest { .. }
            | ApiError::MethodNotAllowed
            | ApiError::TooLarge(_)
            | ApiError::Unauthorized
            | ApiError::BodyTimeout => "invalid_request_error",
            ApiError::NotFound(_) => "not_found_error",
            ApiError::Engine(_) | ApiError::Unavailable | ApiError::TooManyConnections(_) | ApiError::Overloaded(_) => {
                "server_error"
            }
        };
        let mut b = ErrorBody::new(self.to_string(), kind, self.status().as_u16());
        if let ApiError::BadRequest { param, .. } = self {
            b.error.param = param.clone();
        }
        b
    }
}

/// Seconds an overloaded server asks a client to wait (`Retry-After` of a 503).
pub const RETRY_AFTER_S: &str = "1";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status(), axum::Json(self.body())).into_response();
        if matches!(self, ApiError::Overloaded(_)) {
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static(RETRY_AFTER_S));
        }
        r
    }
}

impl From<sparrow_engine::EngineError> for ApiError {
    fn from(e: sparrow_engine::EngineError) -> Self {
        use sparrow_engine::EngineError as E;
        match e {
            E::InvalidRequest(m) => ApiError::bad_body(m),
            E::Stopped => ApiError::Unavailable,
            E::QueueFull { .. } => ApiError::Overloaded(e.to_string()),
            other => ApiError::Engine(other.to_string()),
        }
    }
}
