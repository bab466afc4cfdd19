//! The embedding routes: OpenAI's `/v1/embeddings`, SGLang's `/encode`, vLLM's `/v1/rerank`
//! (also `/rerank`, `/v2/rerank`) and `/v1/score` (also `/score`). Each reads its typed body
//! ([`sparrow_protocol::embeddings`]), turns every input into token ids (checked against the
//! model's maximum, or cut to `truncate_prompt_tokens`, by [`crate::embed::text_input`] and
//! [`crate::embed::ids_input`]), runs them together ([`crate::embed::run`]) and
//! renders the answer. A bi-encoder's scores are cosine similarities of normalized embeddings; a
//! cross-encoder scores each pair jointly (`[CLS] a [SEP] b [SEP]`).

use super::{now_secs, typed_body};
use crate::embed::{self, Embedded};
use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use sparrow_protocol::embeddings::{
    EmbeddingData, EmbeddingInput, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage, EmbeddingValues, EncodeMeta,
    EncodeRequest, EncodeResponse, IdsOrIdLists, RerankDocumentOut, RerankRequest, RerankResponse, RerankResult,
    RerankUsage, ScoreData, ScoreRequest, ScoreResponse, ScoreUsage, TextOrTexts,
};
use std::time::Instant;

/// Most inputs one request may carry (OpenAI's limit for `/v1/embeddings`).
pub const MAX_INPUTS: usize = 2048;

fn count_ok(field: &str, n: usize) -> Result<(), ApiError> {
    if n == 0 {
        return Err(ApiError::bad(field, format!("{field}: the list is empty")));
    }
    if n > MAX_INPUTS {
        return Err(ApiError::bad(field, format!("{field}: {n} inputs; at most {MAX_INPUTS} per request")));
    }
    Ok(())
}

/// `POST /v1/embeddings`.
pub(super) async fn embeddings(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let spec = embed::spec(&s)?;
    let (req, raw) = typed_body::<EmbeddingRequest>(&body)?;
    let priority = crate::params::priority(&raw)?;
    if spec.labels {
        return Err(ApiError::bad(
            "model",
            "model: a cross-encoder scores pairs; it has no embeddings (use /v1/score or /v1/rerank)",
        ));
    }
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(o) => {
            return Err(ApiError::bad(
                "encoding_format",
                format!("encoding_format: {o:?} is not \"float\" or \"base64\""),
            ))
        }
    };
    let dims = match req.dimensions {
        None => None,
        Some(d) if d >= 1 && d as usize <= spec.dim => Some(d as usize),
        Some(d) => {
            return Err(ApiError::bad(
                "dimensions",
                format!("dimensions: {d} must be between 1 and the model's {} dimensions", spec.dim),
            ))
        }
    };
    let keep = embed::truncation(&s, req.truncate_prompt_tokens)?;
    let inputs: Vec<Vec<u32>> = match &req.input {
        EmbeddingInput::Text(x) => vec![embed::text_input(&s, "input", x, None, keep)?],
        EmbeddingInput::Texts(xs) => {
            count_ok("input", xs.len())?;
            let f = |i| format!("input[{i}]");
            xs.iter().enumerate().map(|(i, x)| embed::text_input(&s, &f(i), x, None, keep)).collect::<Result<_, _>>()?
        }
        EmbeddingInput::Ids(ids) => vec![embed::ids_input(&s, "input", ids, keep)?],
        EmbeddingInput::IdLists(ls) => {
            count_ok("input", ls.len())?;
            let f = |i| format!("input[{i}]");
            ls.iter().enumerate().map(|(i, ids)| embed::ids_input(&s, &f(i), ids, keep)).collect::<Result<_, _>>()?
        }
    };
    let normalize = req.normalize.unwrap_or(true);
    let results = embed::run(&s, inputs, normalize, priority).await?;
    let prompt_tokens: usize = results.iter().map(|r| r.prompt_tokens).sum();
    let data = results
        .into_iter()
        .enumerate()
        .map(|(index, Embedded { mut values, .. })| {
            match (dims, normalize) {
                (Some(d), true) => embed::truncate_dims(&mut values, d),
                (Some(d), false) => values.truncate(d),
                (None, _) => {}
            }
            let embedding = match base64 {
                true => EmbeddingValues::Base64(embed::base64_f32(&values)),
                false => EmbeddingValues::Float(values),
            };
            EmbeddingData { object: "embedding", embedding, index }
        })
        .collect();
    let id = format!("embd-{}", s.next_engine_id());
    let usage = EmbeddingUsage { prompt_tokens: prompt_tokens as u64, total_tokens: prompt_tokens as u64 };
    Ok(Json(EmbeddingResponse { id, object: "list", created: now_secs(), model: &s.model_id, data, usage })
        .into_response())
}

/// `POST /encode` (SGLang): one answer for one input, a list for a list.
pub(super) async fn encode(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let spec = embed::spec(&s)?;
    let start = Instant::now();
    let (req, raw) = typed_body::<EncodeRequest>(&body)?;
    let priority = crate::params::priority(&raw)?;
    if spec.labels {
        return Err(ApiError::bad(
            "model",
            "model: a cross-encoder scores pairs; it has no embeddings (use /v1/score)",
        ));
    }
    let (inputs, single) = match (&req.text, &req.input_ids) {
        (Some(_), Some(_)) => return Err(ApiError::bad("text", "send either text or input_ids, not both")),
        (None, None) => return Err(ApiError::bad("text", "text: missing (or send input_ids)")),
        (Some(TextOrTexts::One(x)), None) => (vec![embed::text_input(&s, "text", x, None, None)?], true),
        (Some(TextOrTexts::Many(xs)), None) => {
            count_ok("text", xs.len())?;
            let f = |i| format!("text[{i}]");
            let v = xs.iter().enumerate().map(|(i, x)| embed::text_input(&s, &f(i), x, None, None));
            (v.collect::<Result<_, _>>()?, false)
        }
        (None, Some(IdsOrIdLists::One(ids))) => (vec![embed::ids_input(&s, "input_ids", ids, None)?], true),
        (None, Some(IdsOrIdLists::Many(ls))) => {
            count_ok("input_ids", ls.len())?;
            let f = |i| format!("input_ids[{i}]");
            let v = ls.iter().enumerate().map(|(i, ids)| embed::ids_input(&s, &f(i), ids, None));
            (v.collect::<Result<_, _>>()?, false)
        }
    };
    let results = embed::run(&s, inputs, true, priority).await?;
    let e2e = start.elapsed().as_secs_f64();
    let mut out: Vec<EncodeResponse> = results
        .into_iter()
        .map(|r| EncodeResponse {
            embedding: r.values,
            meta_info: EncodeMeta {
                id: format!("{:032x}", s.next_engine_id()),
                prompt_tokens: r.prompt_tokens,
                e2e_latency: e2e,
            },
        })
        .collect();
    Ok(match (single, out.pop()) {
        (true, Some(one)) => Json(one).into_response(),
        (_, last) => {
            out.extend(last);
            Json(out).into_response()
        }
    })
}

/// A text of a scoring request and the field name its errors carry (`query`, `documents[2]`).
type Named<'a> = (&'a str, String);

/// Scores of `pairs` (`(i, j)`: `a[i]` against `b[j]`): cosine similarities of the embeddings of
/// every distinct text (each embedded once, whichever side it is on), or one cross-encoder run
/// per pair. Returns the scores in pair order and the tokens run.
async fn pair_scores(
    s: &AppState,
    a: &[Named<'_>],
    b: &[Named<'_>],
    pairs: &[(usize, usize)],
    keep: Option<usize>,
    priority: Option<i64>,
) -> Result<(Vec<f64>, usize), ApiError> {
    if embed::spec(s)?.labels {
        let inputs = pairs
            .iter()
            .map(|&(i, j)| embed::text_input(s, &b[j].1, a[i].0, Some(b[j].0), keep))
            .collect::<Result<Vec<_>, _>>()?;
        let rs = embed::run(s, inputs, false, priority).await?;
        let tokens = rs.iter().map(|r| r.prompt_tokens).sum();
        return Ok((rs.iter().map(|r| embed::pair_score(&r.values)).collect(), tokens));
    }
    // Each distinct text once: `slot[k]` is the input that embeds text `k` of `a ++ b`.
    let mut first: std::collections::HashMap<&str, usize> = Default::default();
    let mut inputs = Vec::new();
    let mut slot = Vec::with_capacity(a.len() + b.len());
    for (text, field) in a.iter().chain(b) {
        let k = match first.get(text) {
            Some(&k) => k,
            None => {
                inputs.push(embed::text_input(s, field, text, None, keep)?);
                first.insert(text, inputs.len() - 1);
                inputs.len() - 1
            }
        };
        slot.push(k);
    }
    let rs = embed::run(s, inputs, true, priority).await?;
    let tokens = rs.iter().map(|r| r.prompt_tokens).sum();
    let vec_of = |k: usize| &rs[slot[k]].values;
    Ok((pairs.iter().map(|&(i, j)| embed::cosine(vec_of(i), vec_of(a.len() + j))).collect(), tokens))
}

/// `POST /v1/rerank`: documents by relevance to the query, best first.
pub(super) async fn rerank(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    embed::spec(&s)?;
    let (req, raw) = typed_body::<RerankRequest>(&body)?;
    let priority = crate::params::priority(&raw)?;
    if req.documents.is_empty() {
        return Err(ApiError::bad("documents", "documents: the list is empty; send at least one document"));
    }
    count_ok("documents", req.documents.len())?;
    let docs: Vec<Named<'_>> =
        req.documents.iter().enumerate().map(|(i, d)| (d.text(), format!("documents[{i}]"))).collect();
    let top_n = match req.top_n {
        None | Some(0) => docs.len(),
        Some(n) if n > 0 => (n as usize).min(docs.len()),
        Some(n) => return Err(ApiError::bad("top_n", format!("top_n: {n} must not be negative"))),
    };
    let keep = embed::truncation(&s, req.truncate_prompt_tokens)?;
    let pairs: Vec<(usize, usize)> = (0..docs.len()).map(|j| (0, j)).collect();
    let query = [(req.query.as_str(), "query".to_owned())];
    let (scores, tokens) = pair_scores(&s, &query, &docs, &pairs, keep, priority).await?;
    let mut order: Vec<usize> = (0..docs.len()).collect();
    // Best first; equal scores keep the documents' order.
    order.sort_by(|&x, &y| scores[y].total_cmp(&scores[x]).then(x.cmp(&y)));
    let with_docs = req.return_documents.unwrap_or(true);
    let results = order
        .into_iter()
        .take(top_n)
        .map(|j| RerankResult {
            index: j,
            document: with_docs.then(|| RerankDocumentOut { text: docs[j].0 }),
            relevance_score: scores[j],
        })
        .collect();
    let usage = RerankUsage { prompt_tokens: tokens as u64, total_tokens: tokens as u64 };
    let id = format!("rerank-{}", s.next_engine_id());
    Ok(Json(RerankResponse { id, model: &s.model_id, usage, results }).into_response())
}

/// Borrowed `(text, field)` pairs of owned ones.
fn view(v: &[(String, String)]) -> Vec<Named<'_>> {
    v.iter().map(|(t, f)| (t.as_str(), f.clone())).collect()
}

/// `POST /v1/score`: `text_1` against `text_2`, one to many (one `text_1`, as a string or a list
/// of one) or pair by pair (lists of one length), vLLM's rule.
pub(super) async fn score(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    embed::spec(&s)?;
    let (req, raw) = typed_body::<ScoreRequest>(&body)?;
    let priority = crate::params::priority(&raw)?;
    // A string is named by its field, a list's items by their index.
    let named = |t: &'_ TextOrTexts, name: &str| -> Vec<(String, String)> {
        match t {
            TextOrTexts::One(x) => vec![(x.clone(), name.to_owned())],
            TextOrTexts::Many(xs) => xs.iter().enumerate().map(|(i, x)| (x.clone(), format!("{name}[{i}]"))).collect(),
        }
    };
    let (a, b) = (named(&req.text_1, "text_1"), named(&req.text_2, "text_2"));
    count_ok("text_1", a.len())?;
    count_ok("text_2", b.len())?;
    let pairs: Vec<(usize, usize)> = match (a.len(), b.len()) {
        (1, n) => (0..n).map(|j| (0, j)).collect(),
        (m, n) if m == n => (0..n).map(|j| (j, j)).collect(),
        (m, n) => {
            return Err(ApiError::bad(
                "text_2",
                format!("text_1 has {m} texts and text_2 {n}: send one text_1, or lists of one length"),
            ))
        }
    };
    let keep = embed::truncation(&s, req.truncate_prompt_tokens)?;
    let (va, vb): (Vec<Named<'_>>, Vec<Named<'_>>) = (view(&a), view(&b));
    let (scores, tokens) = pair_scores(&s, &va, &vb, &pairs, keep, priority).await?;
    let data =
        scores.into_iter().enumerate().map(|(index, score)| ScoreData { index, object: "score", score }).collect();
    let usage = ScoreUsage { prompt_tokens: tokens as u64, total_tokens: tokens as u64, completion_tokens: 0 };
    let id = format!("score-{}", s.next_engine_id());
    Ok(Json(ScoreResponse { id, object: "list", created: now_secs(), model: &s.model_id, data, usage }).into_response())
}
