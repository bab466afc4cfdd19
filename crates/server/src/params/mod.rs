//! Generation parameters, typed once at each API's edge and validated in one place.
//!
//! Every route fills one [`Sampling`], the typed generation fields of its request named as its
//! API names them: the OpenAI and SGLang bodies by name ([`Sampling::from_body`]), the
//! Responses and Messages requests from their typed wire structs. [`Sampling::validate`] then
//! checks them all, in one order, into [`GenParams`] (after TGI's `router/src/validation.rs`:
//! every API's request becomes one validated request), each error naming the field as the
//! client spelled it (`stop_sequences`, `max_output_tokens`, `text.format`).
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

mod body;
mod constraint;
mod logprobs;

pub use body::Fields;
pub use constraint::json_schema;
pub use logprobs::{parse_logprobs, top_logprobs, LogprobAsk, MAX_TOP_LOGPROBS};

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

/// Largest `n` accepted.
pub const MAX_N: usize = 16;

/// Validated parameters of one request.
#[derive(Debug, Clone)]
pub struct GenParams {
    /// `max_tokens` as given (`None`: up to the context limit, or `default_max`).
    pub max_tokens: Option<usize>,
    /// Cap applied when `max_tokens` is absent: SGLang's `/generate` default of 128, or
    /// Anthropic's required `max_tokens`, a ceiling clamped to the context.
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
    /// The thinking budget (Anthropic's `thinking.budget_tokens`): reasoning tokens before the
    /// end-of-thinking tag is forced ([`crate::budget`]). Kept only where a `<think>` reasoning
    /// parser runs and no grammar constrains the answer.
    pub reasoning_budget: Option<ReasoningBudget>,
    /// `tool_choice: auto` under a Hermes parser: the tools whose calls a lazy grammar
    /// constrains once the model opens one ([`crate::tools::LazyCalls`]).
    pub lazy_calls: Option<std::sync::Arc<[crate::tools::ToolSpec]>>,
}

/// A thinking budget, as [`crate::chat::lower`] settles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningBudget {
    /// Reasoning tokens allowed.
    pub tokens: usize,
    /// The template opened the reasoning: counting starts with the first generated token.
    pub inside: bool,
}

/// One field as an API's edge read it: absent (`Ok(None)`), its typed value, or why it did not
/// read. A read error waits in its field, so [`Sampling::validate`] reports the first bad field
/// in the same order whatever went wrong with it.
pub type Read<T> = Result<Option<T>, ApiError>;

/// The generation fields of one request, typed, before any range check: what every API's edge
/// reads its request into, with the names of the fields whose names differ between APIs. Range
/// checks are [`Sampling::validate`]'s. [`Sampling::default`] is every field absent, named as
/// OpenAI's chat names them.
#[derive(Debug)]
pub struct Sampling {
    /// The token limit.
    pub max_tokens: Read<usize>,
    /// The limit's name (`max_tokens`, `max_completion_tokens`, `max_new_tokens`,
    /// `max_output_tokens`).
    pub max_tokens_field: &'static str,
    /// The limit when none is given (SGLang's `/generate`: 128; Anthropic's `max_tokens`, a
    /// ceiling).
    pub default_max: Option<usize>,
    /// `temperature`.
    pub temperature: Read<f64>,
    /// `top_p`.
    pub top_p: Read<f64>,
    /// `top_k`.
    pub top_k: Read<i64>,
    /// `min_p`.
    pub min_p: Read<f64>,
    /// `seed` (SGLang's `sampling_seed`).
    pub seed: Read<i64>,
    /// `n`.
    pub n: Read<usize>,
    /// `logit_bias`: token id → bias, each in `[-100, 100]`.
    pub logit_bias: Read<Vec<(u32, f32)>>,
    /// Stop strings.
    pub stop: Read<Vec<String>>,
    /// Their field (`stop`, Anthropic's `stop_sequences`).
    pub stop_field: &'static str,
    /// `stop_token_ids`.
    pub stop_token_ids: Read<Vec<u32>>,
    /// `presence_penalty`.
    pub presence_penalty: Read<f64>,
    /// `frequency_penalty`.
    pub frequency_penalty: Read<f64>,
    /// `repetition_penalty`.
    pub repetition_penalty: Read<f64>,
    /// Tokens before EOS or a stop may end the answer.
    pub min_tokens: Read<usize>,
    /// Their field (vLLM's `min_tokens`, SGLang's `min_new_tokens`).
    pub min_tokens_field: &'static str,
    /// A field the API has and this server refuses (`suffix`), reported in its place.
    pub refused: Result<(), ApiError>,
    /// `best_of` (it must equal `n`).
    pub best_of: Read<usize>,
    /// The top-level `priority` ([`priority`]).
    pub priority: Read<i64>,
    /// `ignore_eos`.
    pub ignore_eos: Read<bool>,
    /// `skip_special_tokens`.
    pub skip_special_tokens: Read<bool>,
    /// `no_stop_trim` (vLLM's `include_stop_str_in_output`).
    pub no_stop_trim: Read<bool>,
    /// The structured-output constraint and the field that asked for it.
    pub constraint: Read<(Constraint, &'static str)>,
}

impl Default for Sampling {
    fn default() -> Sampling {
        Sampling {
            max_tokens: Ok(None),
            max_tokens_field: "max_tokens",
            default_max: None,
            temperature: Ok(None),
            top_p: Ok(None),
            top_k: Ok(None),
            min_p: Ok(None),
            seed: Ok(None),
            n: Ok(None),
            logit_bias: Ok(None),
            stop: Ok(None),
            stop_field: "stop",
            stop_token_ids: Ok(None),
            presence_penalty: Ok(None),
            frequency_penalty: Ok(None),
            repetition_penalty: Ok(None),
            min_tokens: Ok(None),
            min_tokens_field: "min_tokens",
            refused: Ok(()),
            best_of: Ok(None),
            priority: Ok(None),
            ignore_eos: Ok(None),
            skip_special_tokens: Ok(None),
            no_stop_trim: Ok(None),
            constraint: Ok(None),
        }
    }
}

/// A number of `field` within `[lo, hi]`.
fn within(field: &str, v: Option<f64>, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
    match v {
        Some(v) if v < lo || v > hi => Err(ApiError::bad(field, format!("{field} must be in [{lo}, {hi}], got {v}"))),
        v => Ok(v),
    }
}

impl Sampling {
    /// The fields the request left out, from the server's `defaults`.
    pub fn defaulted(mut self, d: &SamplingDefaults) -> Sampling {
        fn fill<T: Copy>(field: &mut Read<T>, v: Option<T>) {
            if let (Ok(None), Some(v)) = (&field, v) {
                *field = Ok(Some(v));
            }
        }
        fill(&mut self.temperature, d.temperature);
        fill(&mut self.top_p, d.top_p);
        fill(&mut self.top_k, d.top_k);
        fill(&mut self.min_p, d.min_p);
        fill(&mut self.repetition_penalty, d.repetition_penalty);
        fill(&mut self.presence_penalty, d.presence_penalty);
        fill(&mut self.frequency_penalty, d.frequency_penalty);
        self
    }

    /// Checks every field, in one order, into the validated parameters (defaults filled in: a
    /// random seed, one choice, skip special tokens).
    ///
    /// # Errors
    /// A 400 naming the first bad field as the request spelled it.
    pub fn validate(self) -> Result<GenParams, ApiError> {
        let max_tokens = self.max_tokens?;
        let temperature = self.temperature?.unwrap_or(1.0);
        if temperature < 0.0 {
            return Err(ApiError::bad("temperature", format!("temperature must be ≥ 0, got {temperature}")));
        }
        let top_p = within("top_p", self.top_p?, 0.0, 1.0)?.unwrap_or(1.0);
        let top_k = match self.top_k? {
            Some(k) if k < -1 => {
                return Err(ApiError::bad("top_k", format!("top_k must be -1, 0 or positive, got {k}")))
            }
            Some(k) => k.clamp(-1, i32::MAX as i64) as i32,
            None => 0,
        };
        let min_p = within("min_p", self.min_p?, 0.0, 1.0)?.unwrap_or(0.0);
        let seed = self.seed?.map(|s| s as u64).unwrap_or_else(rand::random::<u64>);
        let n = self.n?.unwrap_or(1);
        if !(1..=MAX_N).contains(&n) {
            return Err(ApiError::bad("n", format!("n must be between 1 and {MAX_N}, got {n}")));
        }
        let logit_bias = self.logit_bias?.unwrap_or_default();
        let stop = self.stop?.unwrap_or_default();
        if stop.iter().any(String::is_empty) {
            let field = self.stop_field;
            return Err(ApiError::bad(field, format!("{field} strings must not be empty")));
        }
        let stop_token_ids = self.stop_token_ids?.unwrap_or_default();
        // OpenAI's ranges for the additive penalties; SGLang's upper bound for the repetition
        // penalty, which must be positive (it divides).
        let presence_penalty = within("presence_penalty", self.presence_penalty?, -2.0, 2.0)?.unwrap_or(0.0);
        let frequency_penalty = within("frequency_penalty", self.frequency_penalty?, -2.0, 2.0)?.unwrap_or(0.0);
        let repetition_penalty = within("repetition_penalty", self.repetition_penalty?, 0.0, 2.0)?.unwrap_or(1.0);
        if repetition_penalty <= 0.0 {
            return Err(ApiError::bad("repetition_penalty", "repetition_penalty must be in (0, 2]"));
        }
        let min_tokens = self.min_tokens?.unwrap_or(0);
        if let Some(m) = max_tokens.filter(|&m| min_tokens > m) {
            let field = self.min_tokens_field;
            return Err(ApiError::bad(field, format!("{field} ({min_tokens}) must not exceed the token limit ({m})")));
        }
        self.refused?;
        if let Some(b) = self.best_of? {
            if b != n {
                return Err(ApiError::bad("best_of", "best_of is not supported (it must equal n)"));
            }
        }
        Ok(GenParams {
            max_tokens,
            default_max: self.default_max,
            max_tokens_field: self.max_tokens_field,
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
            priority: self.priority?,
            reasoning_budget: None,
            lazy_calls: None,
            ignore_eos: self.ignore_eos?.unwrap_or(false),
            n,
            skip_special_tokens: self.skip_special_tokens?.unwrap_or(true),
            no_stop_trim: self.no_stop_trim?.unwrap_or(false),
            logprobs: LogprobSpec::default(),
            constraint: self.constraint?,
        })
    }
}

/// A request body's top-level `priority` (an integer, as SGLang's `GenerateReqInput` and
/// vLLM's OpenAI routes take it: a float with no fraction, such as `2.0`, is that integer, as
/// pydantic's lax mode reads it); `null` or absent: none. Every route reads it so.
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

/// Parses and checks the generation fields of an OpenAI body (or of `/generate`'s
/// `sampling_params`): [`Sampling::from_body`], the server's defaults for what it leaves out,
/// then [`Sampling::validate`].
///
/// # Errors
/// A 400 naming the first bad field.
pub fn parse(map: &Map<String, Value>, api: Api, defaults: &SamplingDefaults) -> Result<GenParams, ApiError> {
    Sampling::from_body(map, api).defaulted(defaults).validate()
}

/// The server's sampling defaults (SGLang's `--preferred-sampling-params`, a JSON object of
/// SGLang's sampling-parameter names): each applies to a request that leaves its field out, on
/// every API. Without the flag every field keeps the API's own default (temperature 1, no
/// top-k, …), as SGLang's does.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingDefaults {
    /// `temperature`.
    pub temperature: Option<f64>,
    /// `top_p`.
    pub top_p: Option<f64>,
    /// `top_k`.
    pub top_k: Option<i64>,
    /// `min_p`.
    pub min_p: Option<f64>,
    /// `repetition_penalty`.
    pub repetition_penalty: Option<f64>,
    /// `presence_penalty`.
    pub presence_penalty: Option<f64>,
    /// `frequency_penalty`.
    pub frequency_penalty: Option<f64>,
}

impl SamplingDefaults {
    /// The keys `--preferred-sampling-params` takes.
    pub const KEYS: &'static [&'static str] =
        &["temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"];

    /// Reads the flag's JSON object; each value is range-checked as a request's would be.
    ///
    /// # Errors
    /// Not a JSON object, a key outside [`Self::KEYS`], a value of the wrong type or range; the
    /// message names the key.
    pub fn parse(json: &str) -> Result<SamplingDefaults, String> {
        let v: Value = serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
        let Value::Object(o) = v else { return Err("must be a JSON object".into()) };
        let mut d = SamplingDefaults::default();
        for (k, v) in &o {
            let num = || v.as_f64().ok_or_else(|| format!("{k} must be a number, got {v}"));
            match k.as_str() {
                "temperature" => d.temperature = Some(num()?),
                "top_p" => d.top_p = Some(num()?),
                "top_k" => d.top_k = Some(v.as_i64().ok_or_else(|| format!("top_k must be an integer, got {v}"))?),
                "min_p" => d.min_p = Some(num()?),
                "repetition_penalty" => d.repetition_penalty = Some(num()?),
                "presence_penalty" => d.presence_penalty = Some(num()?),
                "frequency_penalty" => d.frequency_penalty = Some(num()?),
                other => {
                    return Err(format!("{other:?} is not one sparrow takes ({})", SamplingDefaults::KEYS.join(", ")))
                }
            }
        }
        Sampling::default().defaulted(&d).validate().map_err(|e| e.to_string())?;
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(v: Value) -> Result<GenParams, ApiError> {
        parse(v.as_object().expect("object"), Api::Completions, &SamplingDefaults::default())
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
        let native =
            parse(json!({"min_new_tokens": 3}).as_object().expect("object"), Api::Native, &SamplingDefaults::default())
                .expect("native");
        assert_eq!(native.sampling.min_tokens, 3);
        assert!(p(json!({"no_stop_trim": true})).expect("trim").no_stop_trim);
        assert!(p(json!({"include_stop_str_in_output": true})).expect("vllm").no_stop_trim);
    }

    /// A field that does not read is reported in its place: an earlier field's range error
    /// comes first, whatever went wrong with a later one.
    #[test]
    fn first_bad_field_in_field_order() {
        let param = |v: Value| match p(v) {
            Err(ApiError::BadRequest { param, .. }) => param,
            other => panic!("{other:?}"),
        };
        assert_eq!(param(json!({"temperature": -1, "stop": 5})).as_deref(), Some("temperature"));
        assert_eq!(param(json!({"temperature": "hot", "top_p": 7})).as_deref(), Some("temperature"));
        assert_eq!(param(json!({"top_p": 7, "n": "x"})).as_deref(), Some("top_p"));
    }

    /// Typed fields named as their API names them: the errors say `stop_sequences` and
    /// `max_output_tokens`'s limit directly.
    #[test]
    fn typed_fields_named_by_their_api() {
        let s = Sampling { stop: Ok(Some(vec![String::new()])), stop_field: "stop_sequences", ..Sampling::default() };
        let e = s.validate().expect_err("empty stop");
        assert!(
            matches!(&e, ApiError::BadRequest { param: Some(f), message } if f == "stop_sequences" && message.starts_with("stop_sequences ")),
            "{e:?}"
        );
        let s = Sampling { max_tokens: Ok(Some(5)), max_tokens_field: "max_output_tokens", ..Sampling::default() };
        assert_eq!(s.validate().expect("valid").max_tokens_field, "max_output_tokens");
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

    /// `--preferred-sampling-params` fills what a request leaves out and nothing it sets; a key
    /// sparrow does not take, or a value out of a request's range, is refused by name.
    #[test]
    fn preferred_sampling_params_fill_what_is_left_out() {
        let d =
            SamplingDefaults::parse(r#"{"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}"#)
                .expect("defaults");
        let p = parse(json!({}).as_object().expect("object"), Api::Chat, &d).expect("params");
        assert_eq!((p.sampling.temperature, p.sampling.top_p, p.sampling.top_k), (0.7, 0.8, 20));
        assert!((p.sampling.repetition_penalty - 1.05).abs() < 1e-6);
        let p = parse(json!({"temperature": 0.0, "top_k": 5}).as_object().expect("object"), Api::Chat, &d).expect("p");
        assert_eq!((p.sampling.temperature, p.sampling.top_k, p.sampling.top_p), (0.0, 5, 0.8));
        assert!(SamplingDefaults::parse(r#"{"max_new_tokens": 5}"#).expect_err("refused").contains("max_new_tokens"));
        assert!(SamplingDefaults::parse(r#"{"top_p": 2}"#).expect_err("refused").contains("top_p"));
        assert!(SamplingDefaults::parse("[1]").is_err());
    }
}
