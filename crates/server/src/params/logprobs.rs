//! The logprobs a request asks for ([`LogprobAsk`]), read from the OpenAI and SGLang bodies by
//! name ([`parse_logprobs`]); the engine's [`LogprobSpec`] follows once the prompt is known.

use serde_json::{Map, Value};
use sparrow_engine::request::LogprobSpec;

use super::{Api, Fields};
use crate::error::ApiError;

/// Most alternatives per position (vLLM's default `max_logprobs`; OpenAI allows 20 on chat).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A count of alternatives per position, `field` named when it is over [`MAX_TOP_LOGPROBS`].
///
/// # Errors
/// A 400 naming `field`.
pub fn top_logprobs(field: &str, n: usize) -> Result<usize, ApiError> {
    if n > MAX_TOP_LOGPROBS {
        return Err(ApiError::bad(field, format!("{field} must be between 0 and {MAX_TOP_LOGPROBS}, got {n}")));
    }
    Ok(n)
}

/// The logprobs a request asked for, in the route's terms; [`LogprobAsk::spec`] turns them into
/// the engine's [`LogprobSpec`] once the prompt length is known.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogprobAsk {
    /// Logprobs of generated tokens with this many alternatives.
    pub output: Option<usize>,
    /// Prompt logprobs shown the way the route shows its output ones (`echo` with `logprobs`,
    /// SGLang's `input_*` lists), with this many alternatives.
    pub prompt: Option<usize>,
    /// vLLM's `prompt_logprobs` with this many alternatives.
    pub vllm_prompt: Option<usize>,
    /// First prompt position reported; negative counts from the prompt's end (SGLang's
    /// default −1 is the last prompt token).
    pub prompt_start: i64,
    /// SGLang's `token_ids_logprob`.
    pub token_ids: Vec<u32>,
    /// SGLang's `return_text_in_logprobs`.
    pub with_text: bool,
    /// SGLang's rule: the entry at `logprob_start_len` itself is `null` (its scheduler pads the
    /// first input logprob with `None`), values start one position later.
    pub null_first: bool,
}

impl LogprobAsk {
    /// The first prompt position reported for a prompt of `prompt_len` tokens (negative starts
    /// count from the end).
    pub fn start(&self, prompt_len: usize) -> usize {
        let s = if self.prompt_start < 0 { prompt_len as i64 + self.prompt_start } else { self.prompt_start };
        s.max(0) as usize
    }

    /// The engine's spec for a prompt of `prompt_len` tokens. Under [`LogprobAsk::null_first`]
    /// the engine starts one position later: the route renders the `null` itself, and the
    /// default (the last prompt token) costs no extra logits row.
    pub fn spec(&self, prompt_len: usize) -> LogprobSpec {
        let prompt_start = if self.vllm_prompt.is_some() {
            Some(0)
        } else if self.prompt.is_some() {
            Some(self.start(prompt_len) + usize::from(self.null_first))
        } else {
            None
        };
        LogprobSpec {
            output: self.output.is_some(),
            prompt_start,
            top_n: [self.output, self.prompt, self.vllm_prompt].into_iter().flatten().max().unwrap_or(0),
            token_ids: self.token_ids.clone(),
        }
    }
}

/// Parses the logprob fields of `api` (`echo` on completions adds the prompt's logprobs when
/// `logprobs` is set, as OpenAI and vLLM do).
///
/// # Errors
/// A 400 naming the field: a count outside 0–20, `top_logprobs` without `logprobs: true`, a bad
/// `token_ids_logprob`.
pub fn parse_logprobs(map: &Map<String, Value>, api: Api, echo: bool) -> Result<LogprobAsk, ApiError> {
    let f = Fields(map);
    let top = |k: &str| -> Result<Option<usize>, ApiError> { f.count(k)?.map(|v| top_logprobs(k, v)).transpose() };
    let mut ask = LogprobAsk { prompt_start: 0, ..Default::default() };
    match api {
        Api::Completions => {
            ask.output = top("logprobs")?;
            ask.prompt = ask.output.filter(|_| echo);
            ask.vllm_prompt = top("prompt_logprobs")?;
        }
        Api::Chat => {
            let on = f.bool("logprobs")?.unwrap_or(false);
            let n = top("top_logprobs")?;
            if n.is_some_and(|n| n > 0) && !on {
                return Err(ApiError::bad("top_logprobs", "top_logprobs requires logprobs to be true"));
            }
            ask.output = on.then(|| n.unwrap_or(0));
            f.refuse_unless("prompt_logprobs", &[], "prompt_logprobs is answered on /v1/completions")?;
        }
        Api::Native => {
            if f.bool("return_logprob")?.unwrap_or(false) {
                let n = top("top_logprobs_num")?.unwrap_or(0);
                ask.output = Some(n);
                ask.prompt = Some(n);
                ask.null_first = true;
                ask.prompt_start = f.int("logprob_start_len")?.unwrap_or(-1);
                if ask.prompt_start < -1 {
                    return Err(ApiError::bad(
                        "logprob_start_len",
                        "logprob_start_len must be -1 or a prompt position",
                    ));
                }
                ask.with_text = f.bool("return_text_in_logprobs")?.unwrap_or(false);
                ask.token_ids = match f.get("token_ids_logprob") {
                    None => Vec::new(),
                    Some(Value::Array(a)) => a
                        .iter()
                        .map(|v| {
                            v.as_u64().filter(|&t| t <= u32::MAX as u64).map(|t| t as u32).ok_or_else(|| {
                                ApiError::bad("token_ids_logprob", "token_ids_logprob must be a list of token ids")
                            })
                        })
                        .collect::<Result<_, _>>()?,
                    Some(_) => {
                        return Err(ApiError::bad("token_ids_logprob", "token_ids_logprob must be a list of token ids"))
                    }
                };
            }
        }
    }
    Ok(ask)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn logprob_fields() {
        let lp = |v: Value, api, echo| parse_logprobs(v.as_object().expect("object"), api, echo);
        let a = lp(json!({"logprobs": 3}), Api::Completions, true).expect("echo");
        assert_eq!((a.output, a.prompt), (Some(3), Some(3)));
        let s = a.spec(10);
        assert_eq!((s.output, s.prompt_start, s.top_n), (true, Some(0), 3));
        let a = lp(json!({"logprobs": 0}), Api::Completions, false).expect("no echo");
        assert_eq!(a.spec(10).prompt_start, None);
        assert_eq!(lp(json!({"logprobs": null}), Api::Completions, true).expect("null"), LogprobAsk::default());
        assert!(lp(json!({"logprobs": 21}), Api::Completions, false).is_err());
        assert!(lp(json!({"logprobs": true}), Api::Completions, false).is_err());
        let v = lp(json!({"prompt_logprobs": 2, "logprobs": 1}), Api::Completions, false).expect("vllm");
        assert_eq!(v.spec(5), LogprobSpec { output: true, prompt_start: Some(0), top_n: 2, token_ids: vec![] });
        let c = lp(json!({"logprobs": true, "top_logprobs": 4}), Api::Chat, false).expect("chat");
        assert_eq!(c.output, Some(4));
        assert_eq!(lp(json!({"logprobs": true}), Api::Chat, false).expect("chat").output, Some(0));
        let e = lp(json!({"top_logprobs": 2}), Api::Chat, false).expect_err("needs logprobs");
        assert!(e.to_string().contains("top_logprobs"));
        let n =
            lp(json!({"return_logprob": true, "top_logprobs_num": 2, "token_ids_logprob": [5, 7]}), Api::Native, false)
                .expect("native");
        // SGLang's default start (-1) is the last prompt token, whose entry is `null`: the
        // engine computes none.
        assert_eq!(n.start(8), 7);
        assert_eq!(n.spec(8), LogprobSpec { output: true, prompt_start: Some(8), top_n: 2, token_ids: vec![5, 7] });
        let n = lp(json!({"return_logprob": true, "logprob_start_len": 0}), Api::Native, false).expect("start 0");
        assert_eq!(n.spec(8).prompt_start, Some(1));
        assert_eq!(
            lp(json!({"top_logprobs_num": 2}), Api::Native, false).expect("off").spec(8),
            LogprobSpec::default()
        );
    }
}
