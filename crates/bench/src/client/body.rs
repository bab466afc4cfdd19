//! The JSON body of one request, per API dialect: SGLang's `/generate` (`sampling_params`),
//! the OpenAI completions and chat endpoints (always asking for usage when streaming, since
//! output counts must come from the server), and TensorRT-LLM's Triton ensemble. Built once
//! per request before the clock starts, so the send path does no JSON work.

use serde_json::{json, Map, Value};

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
    /// Merged into every body last, so it overrides our fields.
    pub extra_body: Map<String, Value>,
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
    let mut body = match o.api {
        Api::Generate => {
            let mut sp = json!({
                "temperature": o.temperature,
                "max_new_tokens": max_tokens,
                "ignore_eos": o.ignore_eos,
            });
            if o.top_p < 1.0 {
                sp["top_p"] = json!(o.top_p);
            }
            let mut b = json!({"sampling_params": sp, "stream": o.stream});
            match input {
                PromptInput::Text(t) => b["text"] = json!(t),
                PromptInput::Ids(ids) => b["input_ids"] = json!(ids),
                PromptInput::Messages(m) => b["text"] = json!(messages_text(m)),
            }
            b
        }
        Api::Trt => {
            // SGLang's async_request_trt_llm: TensorRT-LLM has no ignore_eos, so a minimum
            // length and an unreachable end id stand in for it.
            let mut b = json!({
                "accumulate_tokens": true,
                "text_input": match input {
                    PromptInput::Text(t) => t.to_owned(),
                    PromptInput::Messages(m) => messages_text(m),
                    PromptInput::Ids(_) => String::new(),
                },
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
        Api::Completions | Api::Chat => {
            let mut b = json!({
                "model": o.model,
                "temperature": o.temperature,
                "max_tokens": max_tokens,
                "stream": o.stream,
                "ignore_eos": o.ignore_eos,
            });
            if o.top_p < 1.0 {
                b["top_p"] = json!(o.top_p);
            }
            match (o.api, input) {
                (Api::Chat, PromptInput::Messages(m)) => b["messages"] = json!(m),
                (Api::Chat, PromptInput::Text(t)) => b["messages"] = json!([{"role": "user", "content": t}]),
                (_, PromptInput::Ids(ids)) => b["prompt"] = json!(ids),
                (_, PromptInput::Text(t)) => b["prompt"] = json!(t),
                (_, PromptInput::Messages(m)) => b["prompt"] = json!(messages_text(m)),
            }
            if o.stream {
                b["stream_options"] = json!({"include_usage": true, "continuous_usage_stats": true});
            }
            b
        }
    };
    if let Value::Object(map) = &mut body {
        for (k, v) in o.extra_body.iter().chain(row_extra) {
            map.insert(k.clone(), v.clone());
        }
    }
    body
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
    }
}
