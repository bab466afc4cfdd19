//! The shared state of every handler: [`AppState`], a cheap handle on [`Inner`] (the engine,
//! the tokenizer and its token bytes, metrics, server info, parsers, `--api-key`, the Responses
//! store, the grammar compiler built on first use), made from the engine, the tokenizer and
//! [`ServerOptions`].

use std::ops::Deref;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sparrow_engine::engine::Engine;
use sparrow_tokenizer::Tokenizer;

use crate::error::ApiError;
use crate::{grammar, metrics, store, tools};

/// Shared state of all handlers.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

/// What [`AppState`] holds.
pub struct Inner {
    /// The engine handle.
    pub engine: Engine,
    /// Tokenizer and chat template.
    pub tokenizer: Tokenizer,
    /// Token id → bytes, special tokens empty.
    pub bytes_skip: Arc<Vec<Vec<u8>>>,
    /// Token id → bytes, special tokens spelled out.
    pub bytes_all: Arc<Vec<Vec<u8>>>,
    /// The id clients put in `model`.
    pub model_id: String,
    /// Model file.
    pub model_path: PathBuf,
    /// Metrics registry.
    pub metrics: metrics::Metrics,
    /// `/get_server_info` body (flags and derived numbers).
    pub server_info: serde_json::Value,
    /// `--tool-call-parser` and `--reasoning-parser`.
    pub parsers: tools::ChatParsers,
    /// `--api-key`: when set, every route but `/health*` and `/metrics` needs
    /// `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// The Responses API's stored responses.
    pub responses: store::ResponseStore,
    /// `--log-requests-level` when `--log-requests` is on.
    pub log_requests: Option<u8>,
    /// `--preferred-sampling-params`: the sampling fields a request leaves out.
    pub sampling_defaults: crate::params::SamplingDefaults,
    next_id: AtomicU64,
    next_log: AtomicU64,
    /// The last lazy tool-call grammar compiled, by its source: an agent sends the same tools
    /// every turn.
    lazy: std::sync::Mutex<Option<(String, Arc<grammar::Compiled>)>>,
    grammars: std::sync::OnceLock<Result<Arc<grammar::Grammars>, String>>,
}

impl Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("model_id", &self.model_id).finish()
    }
}

/// The server's settings beside the engine and the model: what `sparrow serve`'s flags set.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// `/get_server_info` body (flags and derived numbers).
    pub server_info: serde_json::Value,
    /// `--tool-call-parser` and `--reasoning-parser`.
    pub parsers: tools::ChatParsers,
    /// `--api-key`.
    pub api_key: Option<String>,
    /// `--responses-store-size`: stored Responses API responses (0: none).
    pub responses_store_size: usize,
    /// `--log-requests` on: its `--log-requests-level` (0–3).
    pub log_requests: Option<u8>,
    /// `--preferred-sampling-params`.
    pub sampling_defaults: crate::params::SamplingDefaults,
}

impl AppState {
    /// Builds the state.
    ///
    /// # Errors
    /// The tokenizer is neither byte-level BPE nor SentencePiece (incremental decoding needs
    /// [`Tokenizer::token_bytes`]).
    pub fn new(
        engine: Engine,
        tokenizer: Tokenizer,
        model_id: String,
        model_path: PathBuf,
        opts: ServerOptions,
    ) -> Result<Self, sparrow_tokenizer::TokenizerError> {
        let ServerOptions { server_info, parsers, api_key, responses_store_size, log_requests, sampling_defaults } =
            opts;
        // An embedding server detokenizes nothing incrementally: a WordPiece vocabulary (BERT),
        // which has no byte spelling per token, is fine there.
        let embedding = engine.embedding().is_some();
        let bytes = |skip: bool| match tokenizer.token_bytes(skip) {
            Err(_) if embedding => Ok(Vec::new()),
            r => r,
        };
        let bytes_skip = Arc::new(bytes(true)?);
        let bytes_all = Arc::new(bytes(false)?);
        let metrics = metrics::Metrics::new();
        let info = engine.info();
        metrics.weight_bytes.set(info.weight_bytes as i64);
        metrics.active_weight_bytes.set(info.active_weight_bytes.unwrap_or(info.weight_bytes) as i64);
        Ok(AppState(Arc::new(Inner {
            engine,
            tokenizer,
            bytes_skip,
            bytes_all,
            model_id,
            model_path,
            metrics,
            server_info,
            parsers,
            api_key,
            responses: store::ResponseStore::new(responses_store_size),
            log_requests,
            sampling_defaults,
            next_id: AtomicU64::new(1),
            next_log: AtomicU64::new(1),
            lazy: std::sync::Mutex::new(None),
            grammars: std::sync::OnceLock::new(),
        })))
    }

    /// The grammar compiler over this vocabulary, built on the first constrained request.
    ///
    /// # Errors
    /// llguidance could not build its token trie.
    pub fn grammars(&self) -> Result<Arc<grammar::Grammars>, String> {
        self.grammars
            .get_or_init(|| {
                let special: Vec<bool> = self
                    .bytes_skip
                    .iter()
                    .zip(self.bytes_all.iter())
                    .map(|(s, a)| s.is_empty() && !a.is_empty())
                    .collect();
                let eos = self.tokenizer.eos().map_or(0, |e| e.0);
                grammar::Grammars::new(&self.bytes_all, &special, eos).map(Arc::new)
            })
            .clone()
    }

    /// The next request's tag in the request log, when `--log-requests` is on.
    pub fn log_tag(&self) -> Option<crate::reqlog::LogTag> {
        let level = self.log_requests?;
        Some(crate::reqlog::LogTag { id: self.next_log.fetch_add(1, Ordering::Relaxed), level })
    }

    /// The lazy tool-call grammar of `specs` ([`crate::tools::rest_of_call`]), compiled once
    /// for as long as requests keep sending the same tools.
    ///
    /// # Errors
    /// A 400 naming `tools`: a schema past the limits or that does not compile.
    pub fn lazy_grammar(&self, specs: &[tools::ToolSpec]) -> Result<Arc<grammar::Compiled>, ApiError> {
        let src = tools::rest_of_call(specs);
        let lock = || self.lazy.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((s, c)) = lock().as_ref() {
            if *s == src {
                return Ok(c.clone());
            }
        }
        let schemas: Vec<&serde_json::Value> = specs.iter().map(|t| &t.parameters).collect();
        let c = self
            .grammars()
            .map_err(ApiError::Engine)?
            .compiled(&src, &schemas)
            .map(Arc::new)
            .map_err(|e| ApiError::bad("tools", format!("tools: {e}")))?;
        *lock() = Some((src, c.clone()));
        Ok(c)
    }

    /// A fresh engine request id.
    pub fn next_engine_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }
}
