//! Request fields → validated generation parameters, shared by the OpenAI and native routes.
//!
//! Ranges follow the OpenAI API reference and vLLM's `SamplingParams._verify_args`:
//! `temperature ≥ 0` (0 is greedy), `top_p ∈ [0, 1]` (0 keeps only the most likely token),
//! `top_k ≥ -1` (0 and -1 mean no limit), `min_p ∈ [0, 1]`, `n ∈ [1, 16]`, `logit_bias` values in
//! `[-100, 100]` keyed by token id. `null` means "not given". A value of the wrong type
//! (`"top_p": "NaN"`) or out of range is a 400 naming the field, sent before any stream starts.
//! Penalties: `presence_penalty` and `frequency_penalty` in `[-2, 2]` (OpenAI), `repetition_penalty`
//! in `(0, 2]` (SGLang's bound), `min_tokens` (vLLM; `min_new_tokens` natively) at most the token
//! limit. Logprobs ([`parse_logprobs`]): `logprobs` 0–20 on completions (`echo` adds the
//! prompt's), vLLM's `prompt_logprobs` 0–20, chat's `logprobs: true` with `top_logprobs` 0–20,
//! SGLang's `return_logprob`, `top_logprobs_num`, `logprob_start_len`, `token_ids_logprob`.
//! Features we do not implement (`best_of` ≠ `n`, `suffix`) are refused by name with a 400
//! rather than silently ignored.

use serde_json::{Map, Value};
use sparrow_engine::request::LogprobSpec;
use sparrow_engine::sampler::SamplingParams;

use crate::error::ApiError;
use crate::grammar::Constraint;

mod constraint;
use constraint::parse_constraint;

/// `sampling_params` keys `/generate` understands (SGLang's `SamplingParams` names); others are
/// a 400, as SGLang's constructor rejects them.
pub const NATIVE_SAMPLING_KEYS: &[&str] = &[
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "n",
    "seed",
    "sampling_seed",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "no_stop_trim",
    "json_schema",
    "regex",
    "ebnf",
];

/// Most alternatives per position (vLLM's default `max_logprobs`; OpenAI allows 20 on chat).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Largest `n` accepted.
pub const MAX_N: usize = 16;

/// Validated parameters of one request.
#[derive(Debug, Clone)]
pub struct GenParams {
    /// `max_tokens` as given (`None`: up to the context limit, or `default_max`).
    pub max_tokens: Option<usize>,
    /// Cap applied when `max_tokens` is absent (SGLang's `/generate` default of 128).
    pub default_max: Option<usize>,
    /// The field the client uses for the limit (named in errors).
    pub max_tokens_field: &'static str,
    /// Sampling (the seed is per request; choice `i` of `n` uses `seed + i`).
    pub sampling: SamplingParams,
    /// Stop strings (not included in the output).
    pub stop: Vec<String>,
    /// Extra stop token ids (included in the output's token count, not its text when special).
    pub stop_token_ids: Vec<u32>,
    /// Generate through EOS.
    pub ignore_eos: bool,
    /// Choices.
    pub n: usize,
    /// Drop special tokens from the text (default true, as SGLang and vLLM do).
    pub skip_special_tokens: bool,
    /// Keep the matched stop string or stop token's text in the output (SGLang's
    /// `no_stop_trim`, vLLM's `include_stop_str_in_output`).
    pub no_stop_trim: bool,
    /// The logprobs the engine computes (set by the route from [`parse_logprobs`]).
    pub logprobs: LogprobSpec,
    /// What the output must match (structured output), and the field that asked for it.
    pub constraint: Option<(Constraint, &'static str)>,
    /// The request's scheduling `priority` (SGLang's and vLLM's top-level field; used under
    /// `--enable-priority-scheduling`, ignored otherwise).
    pub priority: Option<i64>,
}

impl GenParams {
    /// Reports the constraint read from `from` as asked by `to` (an API whose structured-output
    /// field is read as chat's `response_format`), so a schema that fails to compile later is
    /// named as the client spelled it.
    pub fn relabel_constraint(&mut self, from: &str, to: &'static str) {
        if let Some((_, field)) = &mut self.constraint {
            if *field == from {
                *field = to;
            }
        }
    }
}

/// A request body's top-level `priority` (an integer, as SGLang's `GenerateReqInput` and
/// vLLM's OpenAI routes take it: a float with no fraction, such as `2.0`, is that integer, as
/// pydantic's lax mode reads it); `null` or absent: none.
///
/// # Errors
/// A 400 naming `priority` when it is not an integer.
pub fn priority(map: &Map<String, Value>) -> Result<Option<i64>, ApiError> {
    let bad = || ApiError::bad("priority", "priority must be an integer");
    match map.get("priority") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match (v.as_i64(), v.as_f64()) {
            (Some(i), _) => Ok(Some(i)),
            (None, Some(f)) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(Some(f as i64)),
            _ => Err(bad()),
        },
    }
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
    let top = |k: &str| -> Result<Option<usize>, ApiError> {
        match f.count(k)? {
            Some(v) if v > MAX_TOP_LOGPROBS => {
                Err(ApiError::bad(k, format!("{k} must be between 0 and {MAX_TOP_LOGPROBS}, got {v}")))
            }
            v => Ok(v),
        }
    };
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

/// Typed access to a JSON object with errors that name the field.
pub struct Fields<'a>(pub &'a Map<String, Value>);

impl Fields<'_> {
    /// The value of `k`, `None` when absent or null.
    pub fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }

    /// A finite number, or `None` when absent.
    pub fn num(&self, k: &str) -> Result<Option<f64>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(f) if f.is_finite() => Ok(Some(f)),
                _ => Err(ApiError::bad(k, format!("{k} must be a finite number"))),
            },
            Some(other) => Err(ApiError::bad(k, format!("{k} must be a number, got {other}"))),
        }
    }

    /// A number within `[lo, hi]`.
    pub fn num_in(&self, k: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
        match self.num(k)? {
            Some(v) if v < lo || v > hi => Err(ApiError::bad(k, format!("{k} must be in [{lo}, {hi}], got {v}"))),
            v => Ok(v),
        }
    }

    /// An integer, or `None` when absent.
    pub fn int(&self, k: &str) -> Result<Option<i64>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_i64()
                .or_else(|| n.as_u64().map(|u| u as i64))
                .map(Some)
                .ok_or_else(|| ApiError::bad(k, format!("{k} must be an integer, got {n}"))),
            Some(other) => Err(ApiError::bad(k, format!("{k} must be an integer, got {other}"))),
        }
    }

    /// A non-negative integer.
    pub fn count(&self, k: &str) -> Result<Option<usize>, ApiError> {
        match self.int(k)? {
            Some(v) if v < 0 => Err(ApiError::bad(k, format!("{k} must be non-negative, got {v}"))),
            v => Ok(v.map(|v| v as usize)),
        }
    }

    /// A boolean.
    pub fn bool(&self, k: &str) -> Result<Option<bool>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(ApiError::bad(k, format!("{k} must be a boolean, got {other}"))),
        }
    }

    /// Refuses a field we do not implement unless it holds its neutral value.
    pub fn refuse_unless(&self, k: &str, neutral: &[Value], what: &str) -> Result<(), ApiError> {
        match self.get(k) {
            Some(v) if !neutral.contains(v) => {
                Err(ApiError::bad(k, format!("{k} is not supported by this server ({what})")))
            }
            _ => Ok(()),
        }
    }
}

/// Which API the fields come from (they differ in names and defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
    /// SGLang `/generate` `sampling_params`.
    Native,
}

/// Parses and checks the generation fields of a request body (or of `sampling_params`).
///
/// # Errors
/// A 400 naming the first bad field.
pub fn parse(map: &Map<String, Value>, api: Api) -> Result<GenParams, ApiError> {
    let f = Fields(map);
    let max_tokens = match api {
        Api::Native => f.count("max_new_tokens")?,
        Api::Chat => match f.count("max_completion_tokens")? {
            Some(v) => Some(v),
            None => f.count("max_tokens")?,
        },
        Api::Completions => f.count("max_tokens")?,
    };
    let temperature = f.num("temperature")?.unwrap_or(1.0);
    if temperature < 0.0 {
        return Err(ApiError::bad("temperature", format!("temperature must be ≥ 0, got {temperature}")));
    }
    let top_p = f.num_in("top_p", 0.0, 1.0)?.unwrap_or(1.0);
    let top_k = match f.int("top_k")? {
        Some(k) if k < -1 => return Err(ApiError::bad("top_k", format!("top_k must be -1, 0 or positive, got {k}"))),
        Some(k) => k.clamp(-1, i32::MAX as i64) as i32,
        None => 0,
    };
    let min_p = f.num_in("min_p", 0.0, 1.0)?.unwrap_or(0.0);
    let seed_field = if f.get("sampling_seed").is_some() { "sampling_seed" } else { "seed" };
    let seed = f.int(seed_field)?.map(|s| s as u64).unwrap_or_else(rand::random::<u64>);
    let n = f.count("n")?.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(ApiError::bad("n", format!("n must be between 1 and {MAX_N}, got {n}")));
    }
    let mut logit_bias = Vec::new();
    if let Some(v) = f.get("logit_bias") {
        let obj = v
            .as_object()
            .ok_or_else(|| ApiError::bad("logit_bias", "logit_bias must be an object of token id → bias"))?;
        for (k, b) in obj {
            let id: u32 = k
                .parse()
                .map_err(|_| ApiError::bad("logit_bias", format!("logit_bias key {k:?} is not a token id")))?;
            let b = b.as_f64().filter(|b| (-100.0..=100.0).contains(b)).ok_or_else(|| {
                ApiError::bad("logit_bias", format!("logit_bias[{k}] must be a number in [-100, 100]"))
            })?;
            logit_bias.push((id, b as f32));
        }
    }
    let stop = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| ApiError::bad("stop", "stop must be a string or a list of strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::bad("stop", "stop must be a string or a list of strings")),
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::bad("stop", "stop strings must not be empty"));
    }
    let stop_token_ids = match f.get("stop_token_ids") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_u64()
                    .map(|x| x as u32)
                    .ok_or_else(|| ApiError::bad("stop_token_ids", "stop_token_ids must be a list of token ids"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::bad("stop_token_ids", "stop_token_ids must be a list of token ids")),
    };
    // OpenAI's ranges for the additive penalties; SGLang's upper bound for the repetition
    // penalty, which must be positive (it divides).
    let presence_penalty = f.num_in("presence_penalty", -2.0, 2.0)?.unwrap_or(0.0);
    let frequency_penalty = f.num_in("frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0);
    let repetition_penalty = f.num_in("repetition_penalty", 0.0, 2.0)?.unwrap_or(1.0);
    if repetition_penalty <= 0.0 {
        return Err(ApiError::bad("repetition_penalty", "repetition_penalty must be in (0, 2]"));
    }
    // SGLang's `min_new_tokens` natively, vLLM's `min_tokens` on the OpenAI routes.
    let min_field = if api == Api::Native { "min_new_tokens" } else { "min_tokens" };
    let min_tokens = f.count(min_field)?.unwrap_or(0);
    if let Some(m) = max_tokens.filter(|&m| min_tokens > m) {
        return Err(ApiError::bad(
            min_field,
            format!("{min_field} ({min_tokens}) must not exceed the token limit ({m})"),
        ));
    }
    f.refuse_unless("suffix", &[Value::from("")], "insertion is not implemented")?;
    if let Some(b) = f.count("best_of")? {
        if b != n {
            return Err(ApiError::bad("best_of", "best_of is not supported (it must equal n)"));
        }
    }
    Ok(GenParams {
        max_tokens,
        default_max: (api == Api::Native).then_some(128),
        max_tokens_field: match api {
            Api::Native => "max_new_tokens",
            Api::Chat if f.get("max_completion_tokens").is_some() => "max_completion_tokens",
            _ => "max_tokens",
        },
        sampling: SamplingParams {
            temperature: temperature as f32,
            top_p: top_p as f32,
            top_k,
            min_p: min_p as f32,
            seed,
            logit_bias,
            presence_penalty: presence_penalty as f32,
            frequency_penalty: frequency_penalty as f32,
            repetition_penalty: repetition_penalty as f32,
            min_tokens,
        },
        stop,
        stop_token_ids,
        priority: priority(map)?,
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
        n,
        skip_special_tokens: f.bool("skip_special_tokens")?.unwrap_or(true),
        no_stop_trim: match f.bool("no_stop_trim")? {
            Some(v) => v,
            None => f.bool("include_stop_str_in_output")?.unwrap_or(false),
        },
        logprobs: LogprobSpec::default(),
        constraint: parse_constraint(&f, api)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(v: Value) -> Result<GenParams, ApiError> {
        parse(v.as_object().expect("object"), Api::Completions)
    }

    #[test]
    fn ranges_and_types() {
        assert!(p(json!({"temperature": 0, "top_p": 0})).is_ok());
        assert!(p(json!({"temperature": 0, "top_p": 1})).is_ok());
        let e = p(json!({"top_p": 1.5})).expect_err("out of range");
        assert!(e.to_string().contains("top_p"));
        assert!(p(json!({"temperature": -1})).is_err());
        assert!(p(json!({"top_p": "NaN"})).is_err());
        assert!(p(json!({"logprobs": null, "max_tokens": null})).is_ok());
        assert!(p(json!({"n": 0})).is_err());
        assert!(p(json!({"logit_bias": {"12": 200}})).is_err());
        let ok = p(json!({"logit_bias": {"12": -100}, "stop": "x", "seed": 7})).expect("valid");
        assert_eq!(ok.sampling.logit_bias, vec![(12, -100.0)]);
        assert_eq!(ok.stop, vec!["x".to_owned()]);
        assert_eq!(ok.sampling.seed, 7);
        let pen = p(json!({"presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.3, "min_tokens": 4, "max_tokens": 8}))
            .expect("penalties");
        let s = &pen.sampling;
        assert_eq!((s.presence_penalty, s.frequency_penalty, s.repetition_penalty, s.min_tokens), (0.5, -1.0, 1.3, 4));
        for (bad, field) in [
            (json!({"presence_penalty": 2.5}), "presence_penalty"),
            (json!({"frequency_penalty": -3}), "frequency_penalty"),
            (json!({"repetition_penalty": 0}), "repetition_penalty"),
            (json!({"repetition_penalty": 2.1}), "repetition_penalty"),
            (json!({"min_tokens": 9, "max_tokens": 8}), "min_tokens"),
            (json!({"min_tokens": -1}), "min_tokens"),
        ] {
            assert!(p(bad).expect_err("out of range").to_string().contains(field), "{field}");
        }
        let native = parse(json!({"min_new_tokens": 3}).as_object().expect("object"), Api::Native).expect("native");
        assert_eq!(native.sampling.min_tokens, 3);
        assert!(p(json!({"no_stop_trim": true})).expect("trim").no_stop_trim);
        assert!(p(json!({"include_stop_str_in_output": true})).expect("vllm").no_stop_trim);
    }

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

    /// `priority` is an integer; a float without a fraction is that integer (pydantic's lax
    /// mode, as SGLang and vLLM read it), anything else a 400 naming it.
    #[test]
    fn priority_takes_integers_and_integral_floats() {
        let p = |v: Value| priority(v.as_object().expect("object"));
        assert_eq!(p(json!({"priority": 5})).expect("int"), Some(5));
        assert_eq!(p(json!({"priority": -2.0})).expect("integral float"), Some(-2));
        assert_eq!(p(json!({"priority": null})).expect("null"), None);
        for bad in [json!(1.5), json!("5"), json!(true)] {
            let e = p(json!({ "priority": bad })).expect_err("not an integer");
            assert!(matches!(e, ApiError::BadRequest { param: Some(ref f), .. } if f == "priority"), "{e:?}");
        }
    }
}
