//! Sparrow's HTTP server: OpenAI (`/v1/completions`, `/v1/chat/completions`, `/v1/responses`,
//! `/v1/models`), Anthropic (`/v1/messages`, `/v1/messages/count_tokens`) and SGLang-native
//! (`/generate`, `/get_model_info`, `/get_server_info`, `/flush_cache`, `/tokenize`,
//! `/detokenize`, `/health`, `/health_generate`, `/metrics`) routes over one
//! [`Engine`](sparrow_engine::engine::Engine).
//!
//! Modules: [`routes`] reads each API's typed request (from `sparrow_protocol`) and renders its
//! bodies and SSE streams; [`chat`] is the one internal chat request every chat-like API lowers
//! into; [`params`] types each API's generation fields at its edge and validates them in one
//! place; [`gen`] runs a request on the engine and turns tokens into text ([`detok`]); [`tools`]
//! parses tool calls and reasoning; [`grammar`] compiles structured-output constraints (GBNF
//! through [`gbnf`]); [`logprobs`] shapes logprobs per API; [`store`] keeps stored Responses;
//! [`error`] maps every failure to a status and error JSON; [`metrics`] is the Prometheus
//! registry; [`conn`] is the connection layer (timeouts, connection cap); [`state`] is what
//! every handler shares ([`AppState`], re-exported here). `app(state)` builds the router apart
//! from any socket, so tests can drive it directly.
//!
//! ```text
//! body -> routes (typed request) -> chat::ChatRequest (chat-like APIs) -> params (validate)
//!      -> chat template -> gen (NewRequest per choice) -> Engine -> Output events
//!      -> gen + detok (text, stop strings) -> ChoiceEvent -> one renderer per API (JSON or SSE)
//! ```

pub mod budget;
pub mod chat;
pub mod conn;
pub mod detok;
pub mod embed;
pub mod error;
pub mod gbnf;
pub mod gen;
pub mod grammar;
pub mod logprobs;
pub mod metrics;
pub mod params;
pub mod reqlog;
pub mod routes;
pub mod state;
pub mod store;
pub mod tools;

pub use state::{AppState, Inner, ServerOptions};

/// Serves `app(state)` on `listener` under `limits` until `shutdown` resolves (see
/// [`conn::serve`] for the timeouts, the connection cap and shutdown).
///
/// # Errors
/// The listener failed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    limits: conn::ConnLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let open = state.metrics.open_connections.clone();
    let refused = state.metrics.refused_connections.clone();
    conn::serve(listener, routes::app(state), limits, open, refused, shutdown).await
}
