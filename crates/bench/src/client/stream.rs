//! Reading an answer's frames: each SSE data line (or a whole non-streamed answer's fields)
//! parsed in place into a borrowed [`Frame`], with a lenient `Value`-based reading for shapes
//! the fast one refuses, and accumulated into the text, the server's token counts and the
//! finish reason. Apart from the HTTP exchange so the frame semantics of every dialect can be
//! tested without a server.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::Value;

use super::Api;

/// One stream frame, parsed in place from the SSE data: only what the client reads, text
/// borrowed when it has no escapes. Every OpenAI and SGLang frame shape fits it; one that
/// does not (a field of an unexpected type) is read through [`Frame::from_value`] instead.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Frame<'a> {
    /// `choices[0]`; the other choices are skipped unread.
    #[serde(default, borrow, deserialize_with = "first_choice")]
    choices: Option<ChoiceF<'a>>,
    #[serde(default)]
    usage: Option<Counts>,
    #[serde(default)]
    meta_info: Option<MetaF>,
    /// `/generate`: the cumulative text.
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    /// TensorRT-LLM: the new text.
    #[serde(default, borrow)]
    text_output: Option<Cow<'a, str>>,
    /// An in-band error (`null` reads as none, as [`sparrow_protocol::in_band_error`]).
    #[serde(default)]
    pub(super) error: Option<IgnoredAny>,
    #[serde(default, borrow)]
    pub(super) object: Option<Cow<'a, str>>,
}

#[derive(Debug, Default, Deserialize)]
struct ChoiceF<'a> {
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    delta: Option<DeltaF<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Debug, Default, Deserialize)]
struct DeltaF<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
}

/// OpenAI `usage`, or the token counts of SGLang's `meta_info`.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
struct Counts {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
struct MetaF {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    /// `null`, or an object whose `type` names the reason.
    #[serde(default)]
    finish_reason: Option<Value>,
}

/// Deserializes only the first element of `choices` (or `null`).
fn first_choice<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<ChoiceF<'de>>, D::Error> {
    struct First;
    impl<'de> serde::de::Visitor<'de> for First {
        type Value = Option<ChoiceF<'de>>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of choices")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let first = seq.next_element::<ChoiceF<'de>>()?;
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(first)
        }
    }
    d.deserialize_any(First)
}

impl<'a> Frame<'a> {
    /// The lenient reading of a frame: fields of unexpected types count as absent.
    pub(super) fn from_value(v: &'a Value) -> Frame<'a> {
        let s = |x: Option<&'a Value>| x.and_then(Value::as_str).map(Cow::Borrowed);
        let counts = |x: Option<&Value>| Counts {
            prompt_tokens: x.and_then(|u| u.get("prompt_tokens")).and_then(Value::as_u64),
            completion_tokens: x.and_then(|u| u.get("completion_tokens")).and_then(Value::as_u64),
        };
        let c = v.get("choices").and_then(|c| c.get(0));
        let d = c.and_then(|c| c.get("delta"));
        let m = v.get("meta_info").filter(|m| m.is_object());
        Frame {
            choices: c.map(|c| ChoiceF {
                text: s(c.get("text")),
                delta: d
                    .map(|d| DeltaF { content: s(d.get("content")), reasoning_content: s(d.get("reasoning_content")) }),
                finish_reason: s(c.get("finish_reason")),
            }),
            usage: v.get("usage").filter(|u| !u.is_null()).map(|u| counts(Some(u))),
            meta_info: m.map(|m| {
                let Counts { prompt_tokens, completion_tokens } = counts(Some(m));
                MetaF { prompt_tokens, completion_tokens, finish_reason: m.get("finish_reason").cloned() }
            }),
            text: s(v.get("text")),
            text_output: s(v.get("text_output")),
            error: None,
            object: s(v.get("object")),
        }
    }

    /// Token counts: `usage` when present, else `meta_info`.
    fn counts(&self) -> Option<Counts> {
        self.usage.or_else(|| {
            self.meta_info
                .as_ref()
                .map(|m| Counts { prompt_tokens: m.prompt_tokens, completion_tokens: m.completion_tokens })
        })
    }
}

/// Running state of one answer.
#[derive(Debug, Default)]
pub(super) struct Accumulator {
    pub(super) text: String,
    /// Latest cumulative completion-token count the server reported.
    pub(super) completion_tokens: Option<u64>,
    /// Cumulative count at the previous content chunk.
    tokens_at_last_chunk: u64,
    pub(super) prompt_tokens: Option<u64>,
    pub(super) finish_reason: Option<String>,
    pub(super) done: bool,
}

impl Accumulator {
    /// Applies one frame; returns whether it carried new content and, when the frame told
    /// it, the number of tokens that content carries.
    pub(super) fn apply(&mut self, api: Api, f: &Frame<'_>) -> (bool, Option<u64>) {
        let counts = f.counts();
        let cum = counts.and_then(|u| u.completion_tokens);
        if let Some(p) = counts.and_then(|u| u.prompt_tokens) {
            self.prompt_tokens = Some(p);
        }
        let choice = f.choices.as_ref();
        let (new, finish): (bool, Option<&str>) = match api {
            Api::Generate => {
                let full = f.text.as_deref().unwrap_or("");
                let fin = f.meta_info.as_ref().and_then(|m| m.finish_reason.as_ref()).filter(|x| !x.is_null());
                let fin_s =
                    fin.map(|x| x.get("type").and_then(Value::as_str).map_or_else(|| x.to_string(), str::to_owned));
                if fin_is_some(&fin_s) {
                    self.finish_reason = fin_s;
                }
                // `text` is cumulative; what is new is past what we have.
                let new = if let Some(rest) = full.strip_prefix(self.text.as_str()) {
                    self.text.push_str(rest);
                    !rest.is_empty()
                } else {
                    self.text.clear();
                    self.text.push_str(full);
                    !full.is_empty()
                };
                (new, None)
            }
            Api::Completions => {
                let t = choice.and_then(|c| c.text.as_deref()).unwrap_or("");
                self.text.push_str(t);
                (!t.is_empty(), choice.and_then(|c| c.finish_reason.as_deref()))
            }
            Api::Trt => {
                let t = f.text_output.as_deref().unwrap_or("");
                self.text.push_str(t);
                (!t.is_empty(), None)
            }
            Api::Chat => {
                let d = choice.and_then(|c| c.delta.as_ref());
                let content = d.and_then(|d| d.content.as_deref()).unwrap_or("");
                let reasoning = d.and_then(|d| d.reasoning_content.as_deref()).unwrap_or("");
                // Reasoning tokens are output tokens: keep them for counting.
                self.text.push_str(reasoning);
                self.text.push_str(content);
                (!content.is_empty() || !reasoning.is_empty(), choice.and_then(|c| c.finish_reason.as_deref()))
            }
        };
        if let Some(fin) = finish.filter(|f| !f.is_empty()) {
            self.finish_reason = Some(fin.to_owned());
        }
        let mut tokens = None;
        if let Some(c) = cum {
            if new {
                tokens = Some(c.saturating_sub(self.tokens_at_last_chunk));
                self.tokens_at_last_chunk = c;
            }
            self.completion_tokens = Some(c);
        }
        (new, tokens)
    }
}

/// Token accounting of a frame or answer: OpenAI `usage`, else SGLang `meta_info`.
pub(super) fn usage_of(v: &Value) -> Option<&Value> {
    v.get("usage").filter(|u| !u.is_null()).or_else(|| v.get("meta_info"))
}

pub(super) fn fin_is_some(f: &Option<String>) -> bool {
    f.as_deref().is_some_and(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Applies `v` through the fast reader, checking the lenient reader agrees.
    fn ap(a: &mut Accumulator, api: Api, v: &Value) -> (bool, Option<u64>) {
        let text = v.to_string();
        let fast: Frame<'_> = serde_json::from_str(&text).expect("fast reader takes it");
        let mut b =
            Accumulator { text: a.text.clone(), tokens_at_last_chunk: a.tokens_at_last_chunk, ..Default::default() };
        let slow = b.apply(api, &Frame::from_value(v));
        let got = a.apply(api, &fast);
        assert_eq!(got, slow, "fast and lenient readers agree on {v}");
        assert_eq!(a.text, b.text);
        got
    }

    #[test]
    fn generate_text_is_cumulative() {
        let mut a = Accumulator::default();
        let f = |t: &str, n: u64| json!({"text": t, "meta_info": {"completion_tokens": n, "prompt_tokens": 7, "finish_reason": null, "id": "x", "e2e_latency": 0.1}});
        assert_eq!(ap(&mut a, Api::Generate, &f("He", 1)), (true, Some(1)));
        assert_eq!(ap(&mut a, Api::Generate, &f("Hello wor", 3)), (true, Some(2)));
        // A frame with no new text adds no chunk; its tokens count towards the next one.
        assert_eq!(ap(&mut a, Api::Generate, &f("Hello wor", 4)), (false, None));
        assert_eq!(ap(&mut a, Api::Generate, &f("Hello world", 5)), (true, Some(2)));
        assert_eq!(a.text, "Hello world");
        assert_eq!(a.completion_tokens, Some(5));
        assert_eq!(a.prompt_tokens, Some(7));
        let end = json!({"text": "Hello world", "meta_info": {"completion_tokens": 5, "finish_reason": {"type": "length", "length": 5}}});
        assert_eq!(ap(&mut a, Api::Generate, &end), (false, None));
        assert_eq!(a.finish_reason.as_deref(), Some("length"));
    }

    #[test]
    fn completions_usage_only_chunk() {
        let mut a = Accumulator::default();
        assert_eq!(
            ap(
                &mut a,
                Api::Completions,
                &json!({"choices": [{"index": 0, "text": "a b", "finish_reason": null}, {"index": 1, "text": "other"}]})
            ),
            (true, None)
        );
        assert_eq!(
            ap(&mut a, Api::Completions, &json!({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]})),
            (false, None)
        );
        assert_eq!(
            ap(
                &mut a,
                Api::Completions,
                &json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
            ),
            (false, None)
        );
        assert_eq!(a.text, "a b", "only the first choice counts");
        assert_eq!(a.completion_tokens, Some(2));
        assert_eq!(a.finish_reason.as_deref(), Some("stop"));
    }

    #[test]
    fn continuous_usage_counts_tokens_per_chunk_and_escapes_decode() {
        let mut a = Accumulator::default();
        let f = |t: &str, n: u64| json!({"choices": [{"index": 0, "text": t}], "usage": {"prompt_tokens": 4, "completion_tokens": n}});
        assert_eq!(ap(&mut a, Api::Completions, &f("x\"y", 2)), (true, Some(2)));
        assert_eq!(ap(&mut a, Api::Completions, &f("é", 3)), (true, Some(1)));
        assert_eq!(a.text, "x\"y\u{e9}");
    }

    #[test]
    fn odd_shapes_fall_back_to_the_lenient_reader() {
        // A completion count that is not an integer: the fast reader refuses, the lenient
        // one reads it as absent.
        let v = json!({"choices": [{"index": 0, "text": "a"}], "usage": {"completion_tokens": 1.5}});
        assert!(serde_json::from_str::<Frame<'_>>(&v.to_string()).is_err());
        let mut a = Accumulator::default();
        assert_eq!(a.apply(Api::Completions, &Frame::from_value(&v)), (true, None));
        // An error frame is seen by the fast reader, so the caller takes the slow path.
        let e: Frame<'_> = serde_json::from_str(r#"{"error": {"message": "boom"}}"#).expect("parses");
        assert!(e.error.is_some());
        let n: Frame<'_> = serde_json::from_str(r#"{"error": null, "choices": null}"#).expect("parses");
        assert!(n.error.is_none() && n.choices.is_none());
    }

    #[test]
    fn chat_reasoning_counts_as_content() {
        let mut a = Accumulator::default();
        let (c, _) = ap(
            &mut a,
            Api::Chat,
            &json!({"choices": [{"index": 0, "delta": {"reasoning_content": "think"}, "finish_reason": null}]}),
        );
        assert!(c);
        assert_eq!(a.text, "think", "reasoning tokens are counted as output");
    }
}
