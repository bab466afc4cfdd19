//! The edge of the OpenAI and SGLang bodies, whose generation fields are read by name: typed
//! access to a JSON object with errors that name the field ([`Fields`]), and
//! [`Sampling::from_body`], which reads a body's fields (or `/generate`'s `sampling_params`)
//! into the typed [`Sampling`].

use serde_json::{Map, Value};

use super::constraint::parse_constraint;
use super::{Api, Sampling};
use crate::error::ApiError;

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

    /// A list of token ids.
    fn ids(&self, k: &str) -> Result<Option<Vec<u32>>, ApiError> {
        let bad = || ApiError::bad(k, format!("{k} must be a list of token ids"));
        match self.get(k) {
            None => Ok(None),
            Some(Value::Array(a)) => {
                a.iter().map(|v| v.as_u64().map(|x| x as u32).ok_or_else(bad)).collect::<Result<_, _>>().map(Some)
            }
            Some(_) => Err(bad()),
        }
    }
}

impl Sampling {
    /// The generation fields of an OpenAI body (`/v1/completions`, `/v1/chat/completions`) or
    /// of `/generate`'s `sampling_params`, by the names `api` gives them: OpenAI's
    /// `max_tokens` (chat's `max_completion_tokens` first), vLLM's `min_tokens`,
    /// `include_stop_str_in_output` and `structured_outputs` / `guided_*`, SGLang's
    /// `max_new_tokens`, `min_new_tokens`, `sampling_seed` and `no_stop_trim`. A field that
    /// does not read waits in its place as its error.
    pub fn from_body(map: &Map<String, Value>, api: Api) -> Sampling {
        let f = Fields(map);
        let max_tokens = match api {
            Api::Native => f.count("max_new_tokens"),
            Api::Chat => match f.count("max_completion_tokens") {
                Ok(None) => f.count("max_tokens"),
                v => v,
            },
            Api::Completions => f.count("max_tokens"),
        };
        let seed_field = if f.get("sampling_seed").is_some() { "sampling_seed" } else { "seed" };
        let min_tokens_field = if api == Api::Native { "min_new_tokens" } else { "min_tokens" };
        Sampling {
            max_tokens,
            max_tokens_field: match api {
                Api::Native => "max_new_tokens",
                Api::Chat if f.get("max_completion_tokens").is_some() => "max_completion_tokens",
                _ => "max_tokens",
            },
            default_max: (api == Api::Native).then_some(128),
            temperature: f.num("temperature"),
            top_p: f.num("top_p"),
            top_k: f.int("top_k"),
            min_p: f.num("min_p"),
            seed: f.int(seed_field),
            n: f.count("n"),
            logit_bias: logit_bias(&f),
            stop: stop(&f),
            stop_field: "stop",
            stop_token_ids: f.ids("stop_token_ids"),
            presence_penalty: f.num("presence_penalty"),
            frequency_penalty: f.num("frequency_penalty"),
            repetition_penalty: f.num("repetition_penalty"),
            min_tokens: f.count(min_tokens_field),
            min_tokens_field,
            refused: f.refuse_unless("suffix", &[Value::from("")], "insertion is not implemented"),
            best_of: f.count("best_of"),
            priority: super::priority(map),
            ignore_eos: f.bool("ignore_eos"),
            skip_special_tokens: f.bool("skip_special_tokens"),
            no_stop_trim: match f.bool("no_stop_trim") {
                Ok(None) => f.bool("include_stop_str_in_output"),
                v => v,
            },
            constraint: parse_constraint(&f, api),
        }
    }
}

/// `logit_bias`: an object of token id → bias in `[-100, 100]`.
fn logit_bias(f: &Fields<'_>) -> Result<Option<Vec<(u32, f32)>>, ApiError> {
    let Some(v) = f.get("logit_bias") else { return Ok(None) };
    let obj =
        v.as_object().ok_or_else(|| ApiError::bad("logit_bias", "logit_bias must be an object of token id → bias"))?;
    let mut out = Vec::with_capacity(obj.len());
    for (k, b) in obj {
        let id: u32 =
            k.parse().map_err(|_| ApiError::bad("logit_bias", format!("logit_bias key {k:?} is not a token id")))?;
        let b = b
            .as_f64()
            .filter(|b| (-100.0..=100.0).contains(b))
            .ok_or_else(|| ApiError::bad("logit_bias", format!("logit_bias[{k}] must be a number in [-100, 100]")))?;
        out.push((id, b as f32));
    }
    Ok(Some(out))
}

/// `stop`: a string or a list of strings.
fn stop(f: &Fields<'_>) -> Result<Option<Vec<String>>, ApiError> {
    let bad = || ApiError::bad("stop", "stop must be a string or a list of strings");
    match f.get("stop") {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(vec![s.clone()])),
        Some(Value::Array(a)) => {
            a.iter().map(|v| v.as_str().map(str::to_owned).ok_or_else(bad)).collect::<Result<_, _>>().map(Some)
        }
        Some(_) => Err(bad()),
    }
}
