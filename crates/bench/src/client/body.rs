//! The JSON body of one request, per API: SGLang's `/generate`, OpenAI's `/v1/completions` and
//! `/v1/chat/completions` (the request types of [`sparrow_protocol`]), TensorRT-LLM's Triton
//! `generate_stream`; then `--extra-request-body` and a dataset row's own fields merged over
//! them, as SGLang's `bench_serving` does.

use serde::Serialize;
use serde_json::{json, Map, Value};
use sparrow_protocol::openai::{ChatCompletionRequest, ChatMessage, CompletionRequest, Prompt, StreamOptions};
use sparrow_protocol::sglang::{GenerateRequest, SamplingParams};

use super::Api;

/// How requests are sent in one run.
#[derive(Debug, Clone)]
pub struct RequestOptions {
    /// The API dialect.
    pub api: Api,
    /// `model` field of OpenAI requests.
    pub model: String,
    /// Stream the answers.
    pub stream: bool,
    /// Send `ignore_eos: true`.
    pub ignore_eos: bool,
    /// `--temperature`.
    pub temperature: f64,
    /// `--top-p`, sent only below 1.
    pub top_p: f64,
    /// `--return-logprob` and its companions.
    pub logprobs: LogprobOptions,
    /// Merged into every body last, so it overrides our fields.
    pub extra_body: Map<String, Value>,
}

/// SGLang `bench_serving`'s logprob flags.
#[derive(Debug, Clone, Default)]
pub struct LogprobOptions {
    /// `--return-logprob`.
    pub return_logprob: bool,
    /// `--top-logprobs-num`.
    pub top_logprobs_num: u32,
    /// `--token-ids-logprob`.
    pub token_ids_logprob: Option<Vec<u32>>,
    /// `--logprob-start-len`.
    pub logprob_start_len: i64,
}

/// What a request asks about.
#[derive(Debug, Clone, Copy)]
pub enum PromptInput<'a> {
    /// Text (`text`, `prompt`, or one user message).
    Text(&'a str),
    /// Token ids (`input_ids` of `/generate`, `--tokenize-prompt`).
    Ids(&'a [u32]),
    /// Chat messages, sent as they are.
    Messages(&'a [Value]),
}

/// The JSON body for one request: our fields, then `--extra-request-body`, then the row's
/// own fields (`openai` dataset), each overriding the one before (SGLang's order).
pub fn build_body(
    o: &RequestOptions,
    input: PromptInput<'_>,
    max_tokens: u64,
    row_extra: &Map<String, Value>,
) -> Value {
    let top_p = (o.top_p < 1.0).then_some(o.top_p);
    // An endpoint that takes text gets a conversation's contents, one message a line.
    let joined = match (o.api, input) {
        (Api::Chat, _) | (_, PromptInput::Text(_) | PromptInput::Ids(_)) => String::new(),
        (_, PromptInput::Messages(m)) => messages_text(m),
    };
    let (text, ids) = match input {
        PromptInput::Text(t) => (Some(t), None),
        PromptInput::Ids(ids) => (None, Some(ids)),
        PromptInput::Messages(_) => (Some(joined.as_str()), None),
    };
    let mut body = match (o.api, input) {
        (Api::Generate, _) => {
            let (temperature, ignore_eos) = (o.temperature, o.ignore_eos);
            let sampling_params = SamplingParams { temperature, max_new_tokens: max_tokens, ignore_eos, top_p };
            to_json(&GenerateRequest { sampling_params, stream: o.stream, text, input_ids: ids })
        }
        (Api::Trt, _) => {
            // SGLang's async_request_trt_llm: TensorRT-LLM has no ignore_eos, so a minimum
            // length and an unreachable end id stand in for it.
            let mut b = json!({
                "accumulate_tokens": true,
                "text_input": text.unwrap_or_default(),
                "temperature": if o.temperature > 0.0 { o.temperature } else { 0.000001 },
                "top_p": o.top_p,
                "max_tokens": max_tokens,
                "stream": true,
            });
            if o.ignore_eos {
                b["min_length"] = json!(max_tokens);
                b["end_id"] = json!(1_048_576);
            }
            b
        }
        (Api::Chat, PromptInput::Messages(m)) => chat_body(o, max_tokens, top_p, m),
        (Api::Chat, PromptInput::Text(t)) => {
            chat_body(o, max_tokens, top_p, &[ChatMessage { role: "user", content: t }])
        }
        // Token ids go to a chat endpoint as a completions `prompt` (no message can hold them).
        (Api::Completions | Api::Chat, _) => to_json(&CompletionRequest {
            model: &o.model,
            temperature: o.temperature,
            max_tokens,
            stream: o.stream,
            ignore_eos: o.ignore_eos,
            top_p,
            prompt: ids.map_or(Prompt::Text(text.unwrap_or_default()), Prompt::Ids),
            stream_options: stream_options(o),
        }),
    };
    if let Value::Object(map) = &mut body {
        // SGLang's `bench_serving` always sends `return_logprob` and `logprob_start_len` to
        // `/generate`, the others when set; `/v1/completions` gets `logprobs` only.
        let lp = &o.logprobs;
        match o.api {
            Api::Generate => {
                map.insert("return_logprob".into(), json!(lp.return_logprob));
                map.insert("logprob_start_len".into(), json!(lp.logprob_start_len));
                if lp.top_logprobs_num > 0 {
                    map.insert("top_logprobs_num".into(), json!(lp.top_logprobs_num));
                }
                if let Some(ids) = &lp.token_ids_logprob {
                    map.insert("token_ids_logprob".into(), json!(ids));
                }
            }
            Api::Completions if lp.return_logprob && lp.top_logprobs_num > 0 => {
                map.insert("logprobs".into(), json!(lp.top_logprobs_num));
            }
            _ => {}
        }
        for (k, v) in o.extra_body.iter().chain(row_extra) {
            map.insert(k.clone(), v.clone());
        }
    }
    body
}

fn chat_body<M: Serialize>(o: &RequestOptions, max_tokens: u64, top_p: Option<f64>, messages: &[M]) -> Value {
    let (model, temperature, stream, ignore_eos) = (&o.model, o.temperature, o.stream, o.ignore_eos);
    let b = ChatCompletionRequest {
        model,
        temperature,
        max_tokens,
        stream,
        ignore_eos,
        top_p,
        messages,
        stream_options: None,
    };
    to_json(&ChatCompletionRequest { stream_options: stream_options(o), ..b })
}

/// Usage on every chunk (so each chunk's token count is known) and in a last chunk.
fn stream_options(o: &RequestOptions) -> Option<StreamOptions> {
    o.stream.then_some(StreamOptions { include_usage: true, continuous_usage_stats: true })
}

/// A request as a JSON map, whose keys the overrides replace in place. Request types have
/// string keys only: serializing them cannot fail.
fn to_json(body: &impl Serialize) -> Value {
    serde_json::to_value(body).unwrap_or_default()
}

/// The text contents of chat messages, one per line (for an endpoint that takes text).
fn messages_text(m: &[Value]) -> String {
    m.iter().filter_map(|x| x.get("content").and_then(Value::as_str)).collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_body_overrides() {
        let o = RequestOptions {
            api: Api::Completions,
            model: "m".into(),
            stream: true,
            ignore_eos: true,
            temperature: 0.0,
            top_p: 1.0,
            logprobs: LogprobOptions { return_logprob: true, top_logprobs_num: 2, ..Default::default() },
            extra_body: serde_json::from_str(r#"{"temperature": 0.7, "top_k": 5}"#).expect("json"),
        };
        let row: Map<String, Value> = serde_json::from_str(r#"{"top_k": 2, "tools": []}"#).expect("json");
        let b = build_body(&o, PromptInput::Text("hi"), 9, &row);
        assert_eq!(b["top_k"], json!(2), "the row's own fields win over --extra-request-body");
        assert_eq!(b["tools"], json!([]));
        assert!(b.get("top_p").is_none(), "top_p 1 is not sent");
        assert_eq!(b["temperature"], json!(0.7), "--extra-request-body wins over --temperature");
        assert_eq!(b["max_tokens"], json!(9));
        assert_eq!(b["stream_options"]["include_usage"], json!(true));
        assert_eq!(b["logprobs"], json!(2), "--return-logprob --top-logprobs-num 2 on /v1/completions");
    }
}
