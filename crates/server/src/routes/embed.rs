//! The embedding routes: OpenAI's `/v1/embeddings`, SGLang's `/encode`, vLLM's `/v1/rerank`
//! (also `/rerank`, `/v2/rerank`) and `/v1/score` (also `/score`). Each reads its typed body
//! ([`sparrow_protocol::embeddings`]), turns every input into token ids (checked and fitted to the
//! model's maximum by [`crate::embed::fit`]), runs them together ([`crate::embed::run`]) and
//! renders the answer. A bi-encoder's scores are cosine similarities of normalized embeddings; a
//! cross-encoder scores each pair jointly (`[CLS] a [SEP] b [SEP]`).

use super::{now_secs, typed_body};
use crate::embed::{self, Embedded};
use crate::error::ApiError;
use crate::AppState;
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
    let (req, _) = typed_body::<EmbeddingRequest>(&body)?;
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
    let t = req.truncate_prompt_tokens;
    let inputs: Vec<Vec<u32>> = match &req.input {
        EmbeddingInput::Text(x) => {
            if x.is_empty() {
                return Err(ApiError::bad("input", "input: the text is empty"));
            }
            vec![embed::fit(&s, "input", embed::encode(&s, "input", x)?, t)?]
        }
        EmbeddingInput::Texts(xs) => {
            count_ok("input", xs.len())?;
            let mut v = Vec::with_capacity(xs.len());
            for (i, x) in xs.iter().enumerate() {
                let f = format!("input[{i}]");
                if x.is_empty() {
                    return Err(ApiError::bad(&f, format!("{f}: the text is empty")));
                }
                v.push(embed::fit(&s, &f, embed::encode(&s, &f, x)?, t)?);
            }
            v
        }
        EmbeddingInput::Ids(ids) => vec![embed::fit(&s, "input", embed::checked_ids(&s, "input", ids)?, t)?],
        EmbeddingInput::IdLists(ls) => {
            count_ok("input", ls.len())?;
            let mut v = Vec::with_capacity(ls.len());
            for (i, ids) in ls.iter().enumerate() {
                let f = format!("input[{i}]");
                v.push(embed::fit(&s, &f, embed::checked_ids(&s, &f, ids)?, t)?);
            }
            v
        }
    };
    let results = embed::run(&s, inputs).await?;
    let prompt_tokens: usize = results.iter().map(|r| r.prompt_tokens).sum();
    let data = results
        .into_iter()
        .enumerate()
        .map(|(index, Embedded { mut values, .. })| {
            if let Some(d) = dims {
                embed::truncate_dims(&mut values, d);
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
    let (req, _) = typed_body::<EncodeRequest>(&body)?;
    if spec.labels {
        return Err(ApiError::bad(
            "model",
            "model: a cross-encoder scores pairs; it has no embeddings (use /v1/score)",
        ));
    }
    let (inputs, single) = match (&req.text, &req.input_ids) {
        (Some(_), Some(_)) => return Err(ApiError::bad("text", "send either text or input_ids, not both")),
        (None, None) => return Err(ApiError::bad("text", "text: missing (or send input_ids)")),
        (Some(TextOrTexts::One(x)), None) => {
            if x.is_empty() {
                return Err(ApiError::bad("text", "text: the text is empty"));
            }
            (vec![embed::fit(&s, "text", embed::encode(&s, "text", x)?, None)?], true)
        }
        (Some(TextOrTexts::Many(xs)), None) => {
            count_ok("text", xs.len())?;
            let mut v = Vec::new();
            for (i, x) in xs.iter().enumerate() {
                let f = format!("text[{i}]");
                if x.is_empty() {
                    return Err(ApiError::bad(&f, format!("{f}: the text is empty")));
                }
                v.push(embed::fit(&s, &f, embed::encode(&s, &f, x)?, None)?);
            }
            (v, false)
        }
        (None, Some(IdsOrIdLists::One(ids))) => {
            (vec![embed::fit(&s, "input_ids", embed::checked_ids(&s, "input_ids", ids)?, None)?], true)
        }
        (None, Some(IdsOrIdLists::Many(ls))) => {
            count_ok("input_ids", ls.len())?;
            let mut v = Vec::new();
            for (i, ids) in ls.iter().enumerate() {
                let f = format!("input_ids[{i}]");
                v.push(embed::fit(&s, &f, embed::checked_ids(&s, &f, ids)?, None)?);
            }
            (v, false)
        }
    };
    let results = embed::run(&s, inputs).await?;
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

/// Scores of `pairs` (`(text_1, text_2)` index pairs into `a` and `b`): cosine similarities of
/// the embeddings of every distinct text (each embedded once), or one cross-encoder run per
/// pair. Returns the scores in pair order and the tokens run.
async fn pair_scores(
    s: &AppState,
    a: &[&str],
    b: &[&str],
    pairs: &[(usize, usize)],
    truncate: Option<i64>,
    (fa, fb): (&str, &str),
) -> Result<(Vec<f64>, usize), ApiError> {
    let spec = embed::spec(s)?;
    let field =
        |name: &str, list: &[&str], i: usize| if list.len() == 1 { name.to_owned() } else { format!("{name}[{i}]") };
    if spec.labels {
        let mut inputs = Vec::with_capacity(pairs.len());
        for &(i, j) in pairs {
            let f = field(fb, b, j);
            inputs.push(embed::fit(s, &f, embed::encode_pair(s, &f, a[i], b[j])?, truncate)?);
        }
        let rs = embed::run(s, inputs).await?;
        let tokens = rs.iter().map(|r| r.prompt_tokens).sum();
        return Ok((rs.iter().map(|r| embed::pair_score(&r.values)).collect(), tokens));
    }
    let mut inputs = Vec::with_capacity(a.len() + b.len());
    for (i, x) in a.iter().enumerate() {
        let f = field(fa, a, i);
        inputs.push(embed::fit(s, &f, embed::encode(s, &f, x)?, truncate)?);
    }
    for (j, x) in b.iter().enumerate() {
        let f = field(fb, b, j);
        inputs.push(embed::fit(s, &f, embed::encode(s, &f, x)?, truncate)?);
    }
    let rs = embed::run(s, inputs).await?;
    let tokens = rs.iter().map(|r| r.prompt_tokens).sum();
    let (ea, eb) = rs.split_at(a.len());
    Ok((pairs.iter().map(|&(i, j)| embed::cosine(&ea[i].values, &eb[j].values)).collect(), tokens))
}

/// `POST /v1/rerank`: documents by relevance to the query, best first.
pub(super) async fn rerank(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    embed::spec(&s)?;
    let (req, _) = typed_body::<RerankRequest>(&body)?;
    if req.query.is_empty() {
        return Err(ApiError::bad("query", "query: the text is empty"));
    }
    if req.documents.is_empty() {
        return Err(ApiError::bad("documents", "documents: the list is empty; send at least one document"));
    }
    count_ok("documents", req.documents.len())?;
    let docs: Vec<&str> = req.documents.iter().map(|d| d.text()).collect();
    if let Some(i) = docs.iter().position(|d| d.is_empty()) {
        return Err(ApiError::bad(&format!("documents[{i}]"), format!("documents[{i}]: the text is empty")));
    }
    let top_n = match req.top_n {
        None | Some(0) => docs.len(),
        Some(n) if n > 0 => (n as usize).min(docs.len()),
        Some(n) => return Err(ApiError::bad("top_n", format!("top_n: {n} must not be negative"))),
    };
    let pairs: Vec<(usize, usize)> = (0..docs.len()).map(|j| (0, j)).collect();
    let (scores, tokens) =
        pair_scores(&s, &[req.query.as_str()], &docs, &pairs, req.truncate_prompt_tokens, ("query", "documents"))
            .await?;
    let mut order: Vec<usize> = (0..docs.len()).collect();
    // Best first; equal scores keep the documents' order.
    order.sort_by(|&x, &y| scores[y].total_cmp(&scores[x]).then(x.cmp(&y)));
    let with_docs = req.return_documents.unwrap_or(true);
    let results = order
        .into_iter()
        .take(top_n)
        .map(|j| RerankResult {
            index: j,
            document: with_docs.then(|| RerankDocumentOut { text: docs[j] }),
            relevance_score: scores[j],
        })
        .collect();
    let usage = RerankUsage { prompt_tokens: tokens as u64, total_tokens: tokens as u64 };
    let id = format!("rerank-{}", s.next_engine_id());
    Ok(Json(RerankResponse { id, model: &s.model_id, usage, results }).into_response())
}

/// `POST /v1/score`: `text_1` against `text_2`, one to one, one to many, or pairwise for lists
/// of one length (vLLM's rule).
pub(super) async fn score(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    embed::spec(&s)?;
    let (req, _) = typed_body::<ScoreRequest>(&body)?;
    let list = |t: &TextOrTexts| -> Vec<String> {
        match t {
            TextOrTexts::One(x) => vec![x.clone()],
            TextOrTexts::Many(xs) => xs.clone(),
        }
    };
    let (a, b) = (list(&req.text_1), list(&req.text_2));
    count_ok("text_1", a.len())?;
    count_ok("text_2", b.len())?;
    for (name, l) in [("text_1", &a), ("text_2", &b)] {
        if let Some(i) = l.iter().position(|x| x.is_empty()) {
            let f = if l.len() == 1 { name.to_owned() } else { format!("{name}[{i}]") };
            return Err(ApiError::bad(&f, format!("{f}: the text is empty")));
        }
    }
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
    let (ar, br): (Vec<&str>, Vec<&str>) =
        (a.iter().map(String::as_str).collect(), b.iter().map(String::as_str).collect());
    let (scores, tokens) = pair_scores(&s, &ar, &br, &pairs, req.truncate_prompt_tokens, ("text_1", "text_2")).await?;
    let data =
        scores.into_iter().enumerate().map(|(index, score)| ScoreData { index, object: "score", score }).collect();
    let usage = ScoreUsage { prompt_tokens: tokens as u64, total_tokens: tokens as u64, completion_tokens: 0 };
    let id = format!("score-{}", s.next_engine_id());
    Ok(Json(ScoreResponse { id, object: "list", created: now_secs(), model: &s.model_id, data, usage }).into_response())
}
