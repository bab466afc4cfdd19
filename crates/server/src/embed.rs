//! Running embedding inputs on the engine: each input is one prefill-only engine request
//! ([`NewRequest::embedding`]); the inputs of one HTTP request are submitted together, so they
//! share steps with each other and with other clients' inputs up to the step's token budget.
//! The engine answers each with the model's row ([`Output::Embedding`]), which is normalized here
//! (L2, as sentence-transformers' `Normalize` and vLLM's default pooler do) unless the model is a
//! cross-encoder, whose rows are label logits turned into a score.
//!
//! Also the math the routes share: Matryoshka truncation (`dimensions`), base64 encoding,
//! cosine similarity, the cross-encoder's score.

use std::time::Instant;

use sparrow_engine::request::{FinishReason, NewRequest, Output};

use crate::error::ApiError;
use crate::state::AppState;

/// One input's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedded {
    /// The model's row: a unit-length embedding, or a cross-encoder's label logits as returned.
    pub values: Vec<f32>,
    /// Tokens of the input (after truncation).
    pub prompt_tokens: usize,
}

/// The embedding model's facts, or the 400 every embedding route gives a generating server.
///
/// # Errors
/// [`ApiError::BadRequest`] naming `model` when the server generates text.
pub fn spec(state: &AppState) -> Result<sparrow_engine::model::EmbeddingSpec, ApiError> {
    state.engine.embedding().copied().ok_or_else(|| {
        ApiError::bad(
            "model",
            format!(
                "model: {} generates text and serves no embeddings, rerank or scores (start an embedding model, \
                 or a decoder with --is-embedding)",
                state.model_id
            ),
        )
    })
}

/// `truncate_prompt_tokens` (vLLM's): `None` when absent, else how many tokens an input may
/// keep (`-1`: the model's maximum).
///
/// # Errors
/// [`ApiError::BadRequest`] naming `truncate_prompt_tokens` below -1 or above the maximum.
pub fn truncation(state: &AppState, truncate: Option<i64>) -> Result<Option<usize>, ApiError> {
    let max = state.engine.config().context_length;
    match truncate {
        None => Ok(None),
        Some(-1) => Ok(Some(max)),
        Some(k) if k >= 1 && k as usize <= max => Ok(Some(k as usize)),
        Some(k) => Err(ApiError::bad(
            "truncate_prompt_tokens",
            format!("truncate_prompt_tokens: {k} must be -1 (the model's maximum) or between 1 and {max}"),
        )),
    }
}

/// A text input (`b`: the second text of a cross-encoder's pair) as token ids with the model's
/// special tokens (`[CLS] … [SEP]` for BERT, a decoder's BOS), as sentence-transformers and vLLM
/// tokenize it; with `keep`, cut from the left to `keep` tokens, special tokens kept (HF's
/// left truncation, what vLLM does with `truncate_prompt_tokens`).
///
/// # Errors
/// [`ApiError::BadRequest`] naming `field`: an empty text, a tokenizer failure, an input longer
/// than the model's maximum without truncation.
pub fn text_input(
    state: &AppState,
    field: &str,
    a: &str,
    b: Option<&str>,
    keep: Option<usize>,
) -> Result<Vec<u32>, ApiError> {
    if a.is_empty() || b.is_some_and(str::is_empty) {
        return Err(ApiError::bad(field, format!("{field}: the text is empty")));
    }
    let t = &state.tokenizer;
    let ids = match (keep, b) {
        (Some(k), _) => t.encode_truncated(a, b, k),
        (None, Some(b)) => t.encode_pair(a, b),
        (None, None) => t.encode(a, true),
    };
    checked_len(state, field, ids.map_err(|e| ApiError::bad(field, format!("{field}: {e}")))?)
}

/// A token-id input, each id checked against the vocabulary; with `keep`, its last `keep`
/// ids (vLLM's `truncate_prompt_tokens` on token prompts).
///
/// # Errors
/// [`ApiError::BadRequest`] naming `field`: no ids, a negative id or one outside the vocabulary,
/// an input longer than the model's maximum without truncation.
pub fn ids_input(state: &AppState, field: &str, ids: &[i64], keep: Option<usize>) -> Result<Vec<u32>, ApiError> {
    let vocab = state.engine.info().vocab_size;
    let ids: Vec<u32> = ids
        .iter()
        .map(|&t| {
            u32::try_from(t).ok().filter(|&t| (t as usize) < vocab).ok_or_else(|| {
                ApiError::bad(field, format!("{field}: token id {t} is outside the vocabulary (0..{vocab})"))
            })
        })
        .collect::<Result<_, _>>()?;
    let ids = match keep {
        Some(k) if ids.len() > k => ids[ids.len() - k..].to_vec(),
        _ => ids,
    };
    checked_len(state, field, ids)
}

/// `ids` when the model can take them: not empty, not past its maximum.
fn checked_len(state: &AppState, field: &str, ids: Vec<u32>) -> Result<Vec<u32>, ApiError> {
    let max = state.engine.config().context_length;
    if ids.is_empty() {
        return Err(ApiError::bad(field, format!("{field}: the input is empty (no tokens)")));
    }
    if ids.len() > max {
        return Err(ApiError::bad(
            field,
            format!(
                "{field}: {} tokens exceed the model's maximum of {max}; shorten it or set truncate_prompt_tokens",
                ids.len()
            ),
        ));
    }
    Ok(ids)
}

/// Runs `inputs` (from [`text_input`] / [`ids_input`]) on the engine together; results in
/// input order. Embeddings come back L2-normalized when `normalize` (vLLM's `normalize`,
/// default true); a cross-encoder's logits as the model gave them.
///
/// # Errors
/// [`ApiError::Engine`] when the engine fails an input (the others are aborted);
/// [`ApiError::Unavailable`] when it stopped.
pub async fn run(
    state: &AppState,
    inputs: Vec<Vec<u32>>,
    normalize: bool,
    priority: Option<i64>,
) -> Result<Vec<Embedded>, ApiError> {
    let spec = spec(state)?;
    let start = Instant::now();
    // A client that goes away aborts every input still queued or running.
    let mut guard = crate::gen::AbortOnDrop { engine: state.engine.clone(), ids: Vec::with_capacity(inputs.len()) };
    let over_limit = crate::gen::admit(state)?;
    let mut rxs = Vec::with_capacity(inputs.len());
    for ids in inputs {
        let id = state.next_engine_id();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let n = ids.len();
        state.metrics.requests.inc();
        let req = NewRequest { priority, ..NewRequest::embedding(id, ids) };
        let sink = Box::new(move |o| tx.send(o).is_ok());
        if over_limit {
            state.engine.submit_over_limit(req, sink)?;
        } else {
            state.engine.submit(req, sink)?;
        }
        guard.ids.push(id);
        rxs.push((rx, n));
    }
    let mut out = Vec::with_capacity(rxs.len());
    for (mut rx, n) in rxs {
        let mut values = None;
        loop {
            match rx.recv().await {
                Some(Output::Embedding { values: v, .. }) => values = Some(v),
                Some(Output::Finished { reason: FinishReason::Error(e), .. }) => return Err(ApiError::Engine(e)),
                Some(Output::Finished { reason: FinishReason::Overloaded(e), .. }) => {
                    return Err(ApiError::Overloaded(e))
                }
                Some(Output::Finished { .. }) => break,
                Some(_) => {}
                None => return Err(ApiError::Unavailable),
            }
        }
        let mut v =
            values.ok_or_else(|| ApiError::Engine("the engine finished an input without its embedding".into()))?;
        if normalize && !spec.labels {
            self::normalize(&mut v);
        }
        state.metrics.e2e.observe(start.elapsed().as_secs_f64());
        out.push(Embedded { values: v, prompt_tokens: n });
    }
    guard.ids.clear();
    Ok(out)
}

/// Scales `v` to unit L2 norm (sums in f64; a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    }
}

/// OpenAI's `dimensions` (Matryoshka representation learning, Kusupati et al. 2022): the first
/// `d` values, normalized again.
pub fn truncate_dims(v: &mut Vec<f32>, d: usize) {
    v.truncate(d);
    normalize(v);
}

/// `encoding_format: "base64"`: the values as little-endian f32 bytes in standard base64, the
/// encoding OpenAI's SDK decodes with `np.frombuffer(base64.b64decode(s), dtype="float32")`.
pub fn base64_f32(v: &[f32]) -> String {
    use base64::Engine as _;
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Cosine similarity of two embeddings (f64 sums), within [−1, 1] (rounding can put a vector's
/// cosine with itself a hair above 1).
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        (dot / (na * nb)).clamp(-1.0, 1.0)
    }
}

/// A cross-encoder's score from its label logits: the sigmoid of a single logit
/// (sentence-transformers' `CrossEncoder` default for one label, vLLM's score), else the softmax
/// probability of the last label (the "relevant" class of a two-label head).
pub fn pair_score(logits: &[f32]) -> f64 {
    match logits {
        [x] => 1.0 / (1.0 + (-(*x as f64)).exp()),
        _ => {
            let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
            let sum: f64 = logits.iter().map(|&x| (x as f64 - m).exp()).sum();
            logits.last().map_or(0.0, |&x| (x as f64 - m).exp() / sum)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectors from Python's `base64.b64encode(np.array(v, "<f4").tobytes())`.
    #[test]
    fn base64_matches_pythons() {
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_f32(&[1.0, -2.5]), "AACAPwAAIMA=");
        assert_eq!(base64_f32(&[0.1, 0.2, 0.3]), "zczMPc3MTD6amZk+");
        assert_eq!(base64_f32(&[]), "");
    }

    #[test]
    fn matryoshka_truncation_renormalizes() {
        let mut v = vec![3.0, 4.0, 12.0];
        truncate_dims(&mut v, 2);
        assert_eq!(v, vec![0.6, 0.8]);
        assert!((cosine(&[1.0, 0.0], &[1.0, 1.0]) - std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-12);
        assert!((pair_score(&[0.0]) - 0.5).abs() < 1e-12);
        assert!((pair_score(&[0.0, 2.0f32.ln()]) - 2.0 / 3.0).abs() < 1e-7);
    }
}
