//! Embedding, rerank and score bodies: OpenAI's `/v1/embeddings` (API reference, "Embeddings"),
//! SGLang's `/encode`, and vLLM's `/v1/rerank` (the Jina/Cohere shape) and `/v1/score`
//! (`vllm/entrypoints/pooling/{embed,score}/protocol.py`). Requests are read leniently (unknown
//! fields ignored); responses render in their field order.

use serde::{Deserialize, Serialize};

/// One text, or several.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum TextOrTexts {
    /// A single text.
    One(String),
    /// Several texts.
    Many(Vec<String>),
}

/// OpenAI's `input`: a string, strings, token ids, or lists of token ids.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingInput {
    /// One text.
    Text(String),
    /// Several texts.
    Texts(Vec<String>),
    /// One input as token ids.
    Ids(Vec<i64>),
    /// Several inputs as token ids.
    IdLists(Vec<Vec<i64>>),
}

/// `POST /v1/embeddings`.
#[derive(Debug, Clone, Deserialize)]
pub struct EmbeddingRequest {
    /// What to embed.
    pub input: EmbeddingInput,
    /// The model id (checked against the served one when given).
    #[serde(default)]
    pub model: Option<String>,
    /// `float` (default) or `base64` (little-endian f32, as OpenAI sends it).
    #[serde(default)]
    pub encoding_format: Option<String>,
    /// Matryoshka truncation: the first `dimensions` values, normalized again.
    #[serde(default)]
    pub dimensions: Option<i64>,
    /// vLLM's: keep only the last `k` tokens of each input (`-1`: the model's maximum).
    #[serde(default)]
    pub truncate_prompt_tokens: Option<i64>,
    /// vLLM's: L2-normalize the embeddings (default true); false returns the pooled values.
    #[serde(default)]
    pub normalize: Option<bool>,
    /// OpenAI's end-user id (accepted, unused).
    #[serde(default)]
    pub user: Option<String>,
}

/// `POST /encode` (SGLang's `EmbeddingReqInput`): `text` or `input_ids`.
#[derive(Debug, Clone, Deserialize)]
pub struct EncodeRequest {
    /// Text(s) to embed.
    #[serde(default)]
    pub text: Option<TextOrTexts>,
    /// Token ids, one input or several.
    #[serde(default)]
    pub input_ids: Option<IdsOrIdLists>,
}

/// One list of token ids, or several.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum IdsOrIdLists {
    /// One input.
    One(Vec<i64>),
    /// Several inputs.
    Many(Vec<Vec<i64>>),
}

/// A rerank document: a string, or an object with `text` (Cohere/Jina).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum RerankDocumentIn {
    /// The text itself.
    Text(String),
    /// `{"text": ...}`.
    Object {
        /// The text.
        text: String,
    },
}

impl RerankDocumentIn {
    /// The document's text.
    pub fn text(&self) -> &str {
        match self {
            RerankDocumentIn::Text(t) | RerankDocumentIn::Object { text: t } => t,
        }
    }
}

/// `POST /v1/rerank` (also `/rerank`, `/v2/rerank`).
#[derive(Debug, Clone, Deserialize)]
pub struct RerankRequest {
    /// The model id.
    #[serde(default)]
    pub model: Option<String>,
    /// The query.
    pub query: String,
    /// The documents to rank.
    pub documents: Vec<RerankDocumentIn>,
    /// Results to return, best first (0 or absent: all).
    #[serde(default)]
    pub top_n: Option<i64>,
    /// Whether each result carries its document (default true, as vLLM always sends it).
    #[serde(default)]
    pub return_documents: Option<bool>,
    /// As [`EmbeddingRequest::truncate_prompt_tokens`].
    #[serde(default)]
    pub truncate_prompt_tokens: Option<i64>,
}

/// `POST /v1/score` (also `/score`): `text_1` against `text_2`, one to one or one to many.
#[derive(Debug, Clone, Deserialize)]
pub struct ScoreRequest {
    /// The model id.
    #[serde(default)]
    pub model: Option<String>,
    /// The first text(s): one, or as many as `text_2`.
    pub text_1: TextOrTexts,
    /// The second text(s).
    pub text_2: TextOrTexts,
    /// As [`EmbeddingRequest::truncate_prompt_tokens`].
    #[serde(default)]
    pub truncate_prompt_tokens: Option<i64>,
}

/// OpenAI's embedding usage: `{"prompt_tokens", "total_tokens"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmbeddingUsage {
    /// Tokens of every input.
    pub prompt_tokens: u64,
    /// The same (nothing is generated).
    pub total_tokens: u64,
}

/// One embedding's values: floats, or base64 of little-endian f32.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum EmbeddingValues {
    /// `encoding_format: "float"`.
    Float(Vec<f32>),
    /// `encoding_format: "base64"`.
    Base64(String),
}

/// One item of `data`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EmbeddingData {
    /// Always `"embedding"`.
    pub object: &'static str,
    /// The values.
    pub embedding: EmbeddingValues,
    /// The input's index.
    pub index: usize,
}

/// `/v1/embeddings` response.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EmbeddingResponse<'a> {
    /// `embd-…`, as vLLM names it.
    pub id: String,
    /// Always `"list"`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model id.
    pub model: &'a str,
    /// One per input, in input order.
    pub data: Vec<EmbeddingData>,
    /// Token accounting.
    pub usage: EmbeddingUsage,
}

/// SGLang `/encode` `meta_info`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EncodeMeta {
    /// Request id.
    pub id: String,
    /// Tokens of the input.
    pub prompt_tokens: usize,
    /// Seconds from arrival to the answer.
    pub e2e_latency: f64,
}

/// One `/encode` answer (a list of them for a batch).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EncodeResponse {
    /// The embedding (normalized).
    pub embedding: Vec<f32>,
    /// Facts about the request.
    pub meta_info: EncodeMeta,
}

/// A rerank result's document.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RerankDocumentOut<'a> {
    /// The document's text.
    pub text: &'a str,
}

/// One rerank result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RerankResult<'a> {
    /// The document's index in the request.
    pub index: usize,
    /// The document, unless `return_documents: false`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub document: Option<RerankDocumentOut<'a>>,
    /// Its score: cosine similarity (an embedding model) or the cross-encoder's probability.
    pub relevance_score: f64,
}

/// Rerank usage (vLLM's `RerankUsage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RerankUsage {
    /// Tokens of every input the model ran.
    pub prompt_tokens: u64,
    /// The same.
    pub total_tokens: u64,
}

/// `/v1/rerank` response.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RerankResponse<'a> {
    /// `rerank-…`.
    pub id: String,
    /// The served model id.
    pub model: &'a str,
    /// Token accounting.
    pub usage: RerankUsage,
    /// Best first.
    pub results: Vec<RerankResult<'a>>,
}

/// One `/v1/score` item.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScoreData {
    /// The pair's index.
    pub index: usize,
    /// Always `"score"`.
    pub object: &'static str,
    /// The pair's score.
    pub score: f64,
}

/// vLLM's `UsageInfo` as its score route fills it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ScoreUsage {
    /// Tokens of every input the model ran.
    pub prompt_tokens: u64,
    /// The same.
    pub total_tokens: u64,
    /// Always 0.
    pub completion_tokens: u64,
}

/// `/v1/score` response.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScoreResponse<'a> {
    /// `score-…`.
    pub id: String,
    /// Always `"list"`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model id.
    pub model: &'a str,
    /// One per pair, in pair order.
    pub data: Vec<ScoreData>,
    /// Token accounting.
    pub usage: ScoreUsage,
}
