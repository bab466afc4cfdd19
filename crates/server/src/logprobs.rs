//! The engine's [`TokenLogprob`]s in each API's shape: OpenAI's legacy completions object
//! (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`), chat's `logprobs.content`,
//! vLLM's `prompt_logprobs` and SGLang's `meta_info` tuples (`[logprob, token_id, text]`).
//!
//! Token texts are the token's bytes decoded lossily (a token holding part of a character shows
//! U+FFFD; chat's `bytes` carries the exact bytes). Special tokens show their text.

use std::sync::Arc;

use sparrow_engine::logprobs::LOGPROB_FLOOR;
use sparrow_engine::scheduler::TokenLogprob;
use sparrow_protocol::openai::{
    ChatTokenLogprob, ChatTopLogprob, CompletionLogprobs, KeyedLogprobs, PromptLogprob, VllmLogprob,
};
use sparrow_protocol::sglang::{LogprobTuple, NativeLogprobs};

use crate::params::LogprobAsk;

/// Token texts and bytes by id.
#[derive(Debug, Clone)]
pub struct TokenTexts(pub Arc<Vec<Vec<u8>>>);

impl TokenTexts {
    /// The token's bytes (empty for an id outside the vocabulary).
    pub fn bytes(&self, t: u32) -> &[u8] {
        self.0.get(t as usize).map_or(&[], Vec::as_slice)
    }

    /// The token's text, lossily decoded.
    pub fn text(&self, t: u32) -> String {
        String::from_utf8_lossy(self.bytes(t)).into_owned()
    }
}

/// One choice's legacy completions logprobs, built token by token; `text_offset` counts the
/// characters of the token texts from the first token given (the prompt's first under `echo`),
/// as vLLM does; a special token that `skip_special_tokens` drops from `text` still counts.
#[derive(Debug, Clone, Default)]
pub struct Legacy {
    /// What was pushed since the last [`Legacy::take`].
    pub lp: CompletionLogprobs,
    offset: usize,
}

impl Legacy {
    /// Appends one position: its token, value, the `top_n` alternatives plus the token itself
    /// (OpenAI: "up to `logprobs + 1` elements"), and its offset. A position without a value
    /// (the first prompt token) gets `null` for both.
    pub fn push(&mut self, e: &TokenLogprob, top_n: usize, texts: &TokenTexts) {
        let text = texts.text(e.token);
        self.lp.token_logprobs.push(e.logprob);
        self.lp.top_logprobs.push(e.logprob.map(|own| {
            let mut m = KeyedLogprobs::default();
            for &(t, v) in e.top.iter().take(top_n) {
                m.insert(texts.text(t), v);
            }
            m.insert(text.clone(), own);
            m
        }));
        self.lp.text_offset.push(self.offset);
        // Characters, as vLLM's `len(token)` counts a Python `str`.
        self.offset += text.chars().count();
        self.lp.tokens.push(text);
    }

    /// The positions pushed so far, leaving the offset where it is (for a stream's next chunk).
    pub fn take(&mut self) -> CompletionLogprobs {
        std::mem::take(&mut self.lp)
    }
}

/// A chat `logprobs.content` entry with `top_n` alternatives.
pub fn chat_entry(e: &TokenLogprob, top_n: usize, texts: &TokenTexts) -> ChatTokenLogprob {
    ChatTokenLogprob {
        token: texts.text(e.token),
        logprob: e.logprob.unwrap_or(LOGPROB_FLOOR),
        bytes: texts.bytes(e.token).to_vec(),
        top_logprobs: e
            .top
            .iter()
            .take(top_n)
            .map(|&(t, v)| ChatTopLogprob { token: texts.text(t), logprob: v, bytes: texts.bytes(t).to_vec() })
            .collect(),
    }
}

/// vLLM's `prompt_logprobs` from prompt entries starting at position 0: `null` for the first,
/// then per position the prompt token (with its rank) and the `top_n` most likely (ranks 1…).
pub fn vllm_prompt(entries: &[TokenLogprob], top_n: usize, texts: &TokenTexts) -> Vec<Option<PromptLogprob>> {
    entries
        .iter()
        .map(|e| {
            let own = e.logprob?;
            let mut m = KeyedLogprobs::default();
            let v = |t: u32, logprob: f32, rank: u32| VllmLogprob { logprob, rank, decoded_token: texts.text(t) };
            m.insert(e.token.to_string(), v(e.token, own, e.rank));
            for (r, &(t, lp)) in e.top.iter().take(top_n).enumerate() {
                m.insert(t.to_string(), v(t, lp, r as u32 + 1));
            }
            Some(m)
        })
        .collect()
}

/// Appends one position to SGLang's lists, `input_*` for a prompt position and `output_*` for
/// a generated token (`tokenizer_manager.py`'s `add_logprob_to_meta_info`).
pub fn native_push(acc: &mut NativeLogprobs, e: &TokenLogprob, input: bool, ask: &LogprobAsk, texts: &TokenTexts) {
    let text = |t: u32| ask.with_text.then(|| texts.text(t));
    let tuple = |v: Option<f32>, t: u32| -> LogprobTuple { (v, t, text(t)) };
    let own = tuple(e.logprob, e.token);
    let top = e.logprob.map(|_| e.top.iter().take(ask.output.unwrap_or(0)).map(|&(t, v)| tuple(Some(v), t)).collect());
    let ids = e.logprob.map(|_| e.ids.iter().map(|&(t, v)| tuple(Some(v), t)).collect());
    if input {
        acc.input_token_logprobs.push(own);
        acc.input_top_logprobs.push(top);
        acc.input_token_ids_logprobs.push(ids);
    } else {
        acc.output_token_logprobs.push(own);
        acc.output_top_logprobs.push(top);
        acc.output_token_ids_logprobs.push(ids);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts() -> TokenTexts {
        TokenTexts(Arc::new(vec![b"a".to_vec(), b"bc".to_vec(), vec![0xe2, 0x82], b"d".to_vec()]))
    }

    fn entry(token: u32, logprob: Option<f32>, rank: u32) -> TokenLogprob {
        TokenLogprob { token, logprob, rank, top: vec![(1, -0.5), (0, -1.5), (3, -2.0)], ids: vec![(3, -2.0)] }
    }

    /// The shapes of OpenAI's documented legacy example: the own token joins the top dict,
    /// offsets run over the token texts, the first echoed token is `null`.
    #[test]
    fn legacy_shape() {
        let mut l = Legacy::default();
        l.push(&entry(0, None, 0), 2, &texts());
        l.push(&entry(3, Some(-2.0), 3), 2, &texts());
        let chunk = l.take();
        l.push(&entry(1, Some(-0.5), 1), 1, &texts());
        let v = serde_json::to_value(&chunk).expect("json");
        assert_eq!(
            v,
            serde_json::json!({
                "tokens": ["a", "d"],
                "token_logprobs": [null, -2.0],
                "top_logprobs": [null, {"bc": -0.5, "a": -1.5, "d": -2.0}],
                "text_offset": [0, 1],
            })
        );
        assert_eq!(l.lp.text_offset, vec![2]);
        // Characters, not bytes: the partial-byte token is one U+FFFD.
        l.push(&entry(2, Some(-3.0), 4), 0, &texts());
        l.push(&entry(0, Some(-1.5), 2), 0, &texts());
        assert_eq!(l.lp.text_offset, vec![2, 4, 5]);
        assert_eq!(serde_json::to_value(&l.lp.top_logprobs[0]).expect("json"), serde_json::json!({"bc": -0.5}));
    }

    #[test]
    fn chat_vllm_and_native_shapes() {
        let c = serde_json::to_value(chat_entry(&entry(2, Some(-3.0), 4), 1, &texts())).expect("json");
        assert_eq!(
            c,
            serde_json::json!({"token": "\u{fffd}", "logprob": -3.0, "bytes": [226, 130],
                "top_logprobs": [{"token": "bc", "logprob": -0.5, "bytes": [98, 99]}]})
        );
        let p = vllm_prompt(&[entry(0, None, 0), entry(3, Some(-2.0), 3)], 1, &texts());
        assert_eq!(
            serde_json::to_value(&p).expect("json"),
            serde_json::json!([null, {"3": {"logprob": -2.0, "rank": 3, "decoded_token": "d"},
                "1": {"logprob": -0.5, "rank": 1, "decoded_token": "bc"}}])
        );
        let ask = LogprobAsk { output: Some(1), prompt: Some(1), with_text: true, ..Default::default() };
        let mut n = NativeLogprobs::default();
        native_push(&mut n, &entry(0, None, 0), true, &ask, &texts());
        native_push(&mut n, &entry(3, Some(-2.0), 3), false, &ask, &texts());
        assert_eq!(serde_json::to_value(&n.input_token_logprobs).expect("json"), serde_json::json!([[null, 0, "a"]]));
        assert_eq!(n.input_top_logprobs, vec![None]);
        assert_eq!(n.output_top_logprobs, vec![Some(vec![(Some(-0.5), 1, Some("bc".to_owned()))])]);
        assert_eq!(n.output_token_ids_logprobs, vec![Some(vec![(Some(-2.0), 3, Some("d".to_owned()))])]);
    }
}
