//! Tool calls and reasoning content on the chat-like APIs.
//!
//! - [`ToolRequest`] holds a request's `tools`, `tool_choice` (`none`, `auto`, `required`, a
//!   named function) and `parallel_tool_calls`, read at each API's edge (`ToolRequest::parse`
//!   for chat's body, the typed Responses and Messages requests through `ToolRequest::new`).
//!   `required` and a named function constrain generation ([`ToolRequest::constraint`]) to
//!   vLLM's shapes: a JSON array of `{"name", "parameters"}` objects, or the named function's
//!   arguments object.
//! - `auto` reads the model's own format, chosen by `--tool-call-parser` with SGLang's names
//!   (`sglang/srt/function_call/`): [`ToolParser`] is the table, one row per format, and each
//!   format is one file implementing [`ToolFormat`] (its names, its streaming machine, how a
//!   prompt shows tools and earlier calls to a template that cannot): `qwen25`, `glm45` (both in
//!   `tagged`'s `<tool_call>` block; `qwen25` also reads a call written in a ```` ```json ````
//!   fence instead, `fenced`), `llama3`, `phi4_mini`, `gpt_oss`, `deepseekv3` and
//!   `deepseekv31` (both in `deepseek`'s block). What they share sits below them in `format`
//!   (the trait, [`Ev`], [`ToolSpec`], `partial_suffix`), `json_scan` and `array`; the JSON a
//!   model card writes is `sparrow_tokenizer::pyjson`'s (Python's `json.dumps`).
//! - `--reasoning-parser` (`glm45`, `qwen3`, `deepseek-r1`, `deepseek-v3`, SGLang's
//!   `reasoning_parser.py`) splits `<think>…</think>` into `reasoning_content` (`think`);
//!   `deepseek-r1` starts inside the reasoning (its template opens the `<think>`), as
//!   `deepseek-v3` does when the request asks for `thinking` (else it splits nothing).
//! - `gpt-oss` (either flag) reads gpt-oss's harmony messages by channel and recipient: the
//!   `analysis` channel is reasoning, `final` content, `commentary to=functions.{name}` a call
//!   (`gpt_oss`); the answer is detokenized with its special tokens then, as SGLang does.
//!
//! [`Shaper`] turns a choice's text, piece by piece, into [`Delta`]s. It is one incremental
//! machine for both the stream and the collected answer (fed all at once), so the two agree by
//! construction; its output does not depend on how the text was split (tested char by char).

mod array;
mod deepseek;
mod deepseekv3;
mod deepseekv31;
mod detect;
mod fenced;
mod format;
mod glm45;
mod gpt_oss;
mod json_scan;
mod lazy;
mod llama3;
mod parser;
mod phi4_mini;
mod qwen25;
mod qwen3_coder;
mod request;
mod shaper;
mod tagged;
mod think;

pub use detect::{detect, detect_reasoning, Detected, DetectedReasoning};
pub use format::{CallMachine, Ev, ToolFormat, ToolSpec};
pub use lazy::{rest_of_call, Encode, LazyCalls};
pub use parser::{ChatParsers, ReasoningParser, ToolParser};
pub use request::{history_calls, template_tool, tools_system_prompt, ToolChoice, ToolRequest};
pub use shaper::{Delta, Message, Shaper};
pub use think::{THINK_END, THINK_START};

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{json, Value};

    use super::*;
    use crate::error::ApiError;
    use crate::grammar::Constraint;

    fn weather() -> Arc<[ToolSpec]> {
        vec![ToolSpec {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {"location": {"type": "string"}, "days": {"type": "integer"}}}),
        }]
        .into()
    }

    fn req(choice: ToolChoice, parallel: bool) -> ToolRequest {
        ToolRequest { tools: weather(), raw: json!([]), choice, parallel }
    }

    /// Runs `text` through a shaper whole and char by char; both must fold to one message.
    fn run(parsers: ChatParsers, tools: Option<&ToolRequest>, text: &str) -> Message {
        let mut whole = Shaper::new(parsers, tools, true);
        let mut a = Message::default();
        a.add(&whole.push(text));
        a.add(&whole.finish());
        let mut pieces = Shaper::new(parsers, tools, true);
        let mut b = Message::default();
        for (i, c) in text.char_indices() {
            b.add(&pieces.push(&text[i..i + c.len_utf8()]));
        }
        b.add(&pieces.finish());
        let strip = |m: &Message| m.calls.iter().map(|c| (c.1.clone(), c.2.clone())).collect::<Vec<_>>();
        assert_eq!((&a.content, &a.reasoning, strip(&a)), (&b.content, &b.reasoning, strip(&b)), "{text:?}");
        a
    }

    /// Each text is content as written, with no call.
    fn assert_plain(p: ChatParsers, r: &ToolRequest, texts: &[&str]) {
        for plain in texts {
            assert_eq!(run(p, Some(r), plain), Message { content: (*plain).into(), ..Default::default() }, "{plain:?}");
        }
    }

    fn calls(m: &Message) -> Vec<(&str, Value)> {
        m.calls.iter().map(|c| (c.1.as_str(), serde_json::from_str(&c.2).unwrap_or(Value::Null))).collect()
    }

    #[test]
    fn qwen25_calls_and_content() {
        let p = ChatParsers { tool_call: Some(ToolParser::Qwen25), reasoning: None };
        let r = req(ToolChoice::Auto, true);
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris, \\\"FR\\\" </tool_call>\", \"days\": 3}}\n</tool_call>\n<tool_call>\n{\"arguments\": {\"location\": \"Nice\"}, \"name\": \"get_weather\"}\n</tool_call>";
        let m = run(p, Some(&r), text);
        assert_eq!(m.content, "Let me check.");
        assert_eq!(
            calls(&m),
            vec![
                ("get_weather", json!({"location": "Paris, \"FR\" </tool_call>", "days": 3})),
                ("get_weather", json!({"location": "Nice"}))
            ]
        );
        // The streamed arguments are the model's own text.
        assert_eq!(m.calls[0].2, "{\"location\": \"Paris, \\\"FR\\\" </tool_call>\", \"days\": 3}");
        assert!(m.calls[0].0.starts_with("call_") && m.calls[0].0.len() == 29);
        // No call: the text is unchanged, whitespace and a lone `<` included.
        let plain = "  a < b\n\n";
        assert_eq!(run(p, Some(&r), plain), Message { content: plain.into(), ..Default::default() });
        // Not a call: the block is content.
        let m = run(p, Some(&r), "x <tool_call>oops</tool_call>");
        assert_eq!((m.content.as_str(), m.calls.len()), ("x<tool_call>oops</tool_call>", 0));
        // parallel_tool_calls: false keeps the first call.
        let m = run(p, Some(&req(ToolChoice::Auto, false)), text);
        assert_eq!(m.calls.len(), 1);
    }

    /// Hermes calls in a Markdown fence instead of tags (what Qwen2.5-Coder-1.5B writes for
    /// Claude Code and Codex): one object or a list, the language tag `json` or none; any other
    /// fence, and JSON that names no offered tool, is content unchanged.
    #[test]
    fn qwen25_fenced_calls_and_fenced_content() {
        let p = ChatParsers { tool_call: Some(ToolParser::Qwen25), reasoning: None };
        let r = req(ToolChoice::Auto, true);
        let text = "```json\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n```";
        let m = run(p, Some(&r), text);
        assert_eq!((m.content.as_str(), calls(&m)), ("", vec![("get_weather", json!({"location": "Paris"}))]));
        let text = "I'll look.\n```json {\"arguments\": {\"days\": 2}, \"name\": \"get_weather\"}```\n```\n[{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Oslo\"}}]\n```";
        let m = run(p, Some(&r), text);
        assert_eq!(m.content, "I'll look.");
        assert_eq!(calls(&m), vec![("get_weather", json!({"days": 2})), ("get_weather", json!({"location": "Oslo"}))]);
        let m = run(p, Some(&r), "Writing it.\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Rome\"}}\n");
        assert_eq!(
            (m.content.as_str(), calls(&m)),
            ("Writing it.", vec![("get_weather", json!({"location": "Rome"}))])
        );
        let m = run(p, Some(&r), "```json\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 1}}]}\n```");
        assert_eq!(calls(&m), vec![("get_weather", json!({"days": 1}))], "stray closers after the call");
        let m = run(p, Some(&r), "```json\n{\"name\": \"get_weather\"}\n```");
        assert_eq!(calls(&m), vec![("get_weather", json!({}))], "no arguments: an empty object");
        assert_plain(
            p,
            &r,
            &[
                "```python\nprint(\"hi\")\n```\nDone.",
                "```json\n{\"name\": \"format:write\", \"arguments\": {}}\n```",
                "```json\n{\"a\": 1}\n```",
                "```json\n{\"name\": \"get_weather\", \"city\": \"Oslo\"}\n```",
                "```\nplain\n```",
                "Use `x` and ``y``.",
                "a {\"name\": \"get_weather\", \"arguments\": {}}",
                "{\"name\": \"other\", \"arguments\": {}}\n{ x }",
                "```json\n{\"name\": \"get_weather\"",
            ],
        );
    }

    /// Llama 3's JSON calls (the shapes SGLang's `llama3` detector reads): after
    /// `<|python_tag|>` or bare, several separated by `;`, `parameters` or `arguments`; a reply
    /// that is not a call, even one that starts with JSON, is content.
    #[test]
    fn llama3_calls() {
        let p = ChatParsers { tool_call: Some(ToolParser::Llama3), reasoning: None };
        let r = req(ToolChoice::Auto, true);
        let text = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris; FR\", \"days\": 2}}; {\"name\": \"get_weather\", \"arguments\": {\"location\": \"Oslo\"}}";
        let m = run(p, Some(&r), text);
        assert_eq!(m.content, "");
        assert_eq!(
            calls(&m),
            vec![
                ("get_weather", json!({"location": "Paris; FR", "days": 2})),
                ("get_weather", json!({"location": "Oslo"}))
            ]
        );
        assert_eq!(m.calls[0].2, "{\"location\": \"Paris; FR\", \"days\": 2}");
        let m = run(p, Some(&r), "\n {\"name\": \"get_weather\", \"parameters\": {}}");
        assert_eq!(calls(&m), vec![("get_weather", json!({}))]);
        assert_plain(p, &r, &["The weather is fine.", "{\"answer\": 4}", "  <|python", ""]);
    }

    /// Phi-4-mini's `functools[…]` (the shapes SGLang's `phi4_mini` detector reads): text
    /// before and after the block is content, brackets inside strings do not close it, and a
    /// text that only mentions "functools" is content.
    #[test]
    fn phi4_mini_calls() {
        let p = ChatParsers { tool_call: Some(ToolParser::Phi4Mini), reasoning: None };
        let r = req(ToolChoice::Auto, true);
        let text = "Checking. functools[{\"name\": \"get_weather\", \"arguments\": {\"location\": \"a]b [c\", \"days\": [1, 2]}}, {\"name\": \"get_weather\", \"parameters\": {\"location\": \"Oslo\"}}] Done.";
        let m = run(p, Some(&r), text);
        assert_eq!(m.content, "Checking.  Done.");
        assert_eq!(
            calls(&m),
            vec![
                ("get_weather", json!({"location": "a]b [c", "days": [1, 2]})),
                ("get_weather", json!({"location": "Oslo"}))
            ]
        );
        assert_eq!(m.calls[0].2, "{\"location\": \"a]b [c\", \"days\": [1, 2]}");
        // Not calls: a mention, a held-back prefix at the end, a block with no call in it
        // (closed or cut off) is content as written.
        assert_plain(
            p,
            &r,
            &[
                "No tools: functools is a Python module.",
                "ends on functool",
                "",
                "use functools[0] and x[1] then",
                "functools[ \"not a call ] yet\" ] after",
                "cut off: functools[{\"x\": [1, 2",
            ],
        );
        // parallel_tool_calls: false keeps the first call.
        assert_eq!(run(p, Some(&req(ToolChoice::Auto, false)), text).calls.len(), 1);
        // Cut off inside the block: the call it started, its arguments as far as they came.
        let m = run(p, Some(&r), "functools[{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Ro");
        assert_eq!((m.calls.len(), m.calls[0].2.as_str()), (1, "{\"location\": \"Ro"));
    }

    /// DeepSeek's call blocks in both bodies (the shapes SGLang's `deepseekv3` and
    /// `deepseekv31` detectors read): content before the block, two calls, JSON arguments as
    /// written; text without the block is content; a reply cut off inside a named call keeps
    /// it.
    #[test]
    fn deepseek_calls() {
        let r = req(ToolChoice::Auto, true);
        let v3 = "Let me check.\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"location\": \"Paris\", \"days\": 3}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"location\": \"Oslo\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>\n\nDone.";
        let v31 = "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"location\": \"Paris\", \"days\": 3}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"location\": \"Oslo\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>\n\nDone.";
        for (parser, text) in [(ToolParser::DeepseekV3, v3), (ToolParser::DeepseekV31, v31)] {
            let p = ChatParsers { tool_call: Some(parser), reasoning: None };
            let m = run(p, Some(&r), text);
            // The text after the block is content too, without the whitespace around the block.
            assert_eq!(m.content, "Let me check.Done.", "{parser:?}");
            assert_eq!(
                calls(&m),
                vec![
                    ("get_weather", json!({"location": "Paris", "days": 3})),
                    ("get_weather", json!({"location": "Oslo"}))
                ],
                "{parser:?}"
            );
            assert_eq!(m.calls[0].2, "{\"location\": \"Paris\", \"days\": 3}");
            assert_plain(p, &r, &["No tools needed.", "ends on <｜tool▁calls", ""]);
            assert_eq!(run(p, Some(&req(ToolChoice::Auto, false)), text).calls.len(), 1);
            // Cut off inside the second call: the first whole, the second with its arguments so far.
            let cut = &text[..text.find("Oslo").expect("Oslo")];
            let m = run(p, Some(&r), cut);
            assert_eq!(m.calls.len(), 2, "{parser:?}");
            assert!(m.calls[1].2.ends_with("{\"location\": \""), "{parser:?}: {:?}", m.calls[1].2);
        }
    }

    /// Earlier calls written into the history for a template that cannot show them read back,
    /// through the same parser, as the same calls.
    #[test]
    fn history_calls_read_back() {
        let r = req(ToolChoice::Auto, true);
        let sent = json!([
            {"function": {"name": "get_weather", "arguments": {"location": "Oslo"}}},
            {"function": {"name": "get_weather", "arguments": {"location": "Rome", "days": 2}}}
        ]);
        for parser in [
            ToolParser::Phi4Mini,
            ToolParser::Llama3,
            ToolParser::Qwen25,
            ToolParser::GptOss,
            ToolParser::DeepseekV3,
            ToolParser::DeepseekV31,
        ] {
            let text = history_calls(&sent, Some(parser));
            let m = run(ChatParsers { tool_call: Some(parser), reasoning: None }, Some(&r), &text);
            assert_eq!(
                calls(&m),
                vec![
                    ("get_weather", json!({"location": "Oslo"})),
                    ("get_weather", json!({"location": "Rome", "days": 2}))
                ],
                "{parser:?}: {text}"
            );
        }
        assert_eq!(history_calls(&json!([]), Some(ToolParser::Phi4Mini)), "");
    }

    #[test]
    fn glm45_calls() {
        let p = ChatParsers { tool_call: Some(ToolParser::Glm45), reasoning: Some(ReasoningParser::Glm45) };
        let r = req(ToolChoice::Auto, true);
        let text = "<think>The user wants weather.\n</think>\n\nSure.<tool_call>get_weather\n<arg_key>location</arg_key>\n<arg_value>42</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call><tool_call>get_weather\n</tool_call>";
        let m = run(p, Some(&r), text);
        assert_eq!(m.reasoning.as_deref(), Some("The user wants weather."));
        assert_eq!(m.content, "Sure.");
        // `location` is a string in the schema: "42" stays a string; `days` is parsed.
        assert_eq!(calls(&m), vec![("get_weather", json!({"location": "42", "days": 3})), ("get_weather", json!({}))]);
        assert_eq!(m.calls[0].2, "{\"location\":\"42\",\"days\":3}");
        // Cut off inside a call (max_tokens): the complete pairs, closed.
        let m =
            run(p, Some(&r), "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n<arg_key>loc");
        assert_eq!(calls(&m), vec![("get_weather", json!({"days": 2}))]);
    }

    /// Qwen3-Coder / Qwen3.5 XML calls: multi-line values, values typed by the schema (`location`
    /// a string even when it reads as a number, `days` an integer), text before the calls is
    /// content, a call cut off keeps its complete parameters.
    #[test]
    fn qwen3_coder_calls() {
        let p = ChatParsers { tool_call: Some(ToolParser::Qwen3Coder), reasoning: Some(ReasoningParser::Qwen3) };
        let r = req(ToolChoice::Auto, true);
        let text = "<think>Weather twice.</think>\n\nChecking.\n<tool_call>\n<function=get_weather>\n<parameter=location>\n42\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=location>\nNew\nYork\n</parameter>\n</function>\n</tool_call>";
        let m = run(p, Some(&r), text);
        assert_eq!(m.reasoning.as_deref(), Some("Weather twice."));
        assert_eq!(m.content, "Checking.");
        assert_eq!(
            calls(&m),
            vec![
                ("get_weather", json!({"location": "42", "days": 3})),
                ("get_weather", json!({"location": "New\nYork"}))
            ]
        );
        assert_eq!(m.calls[0].2, "{\"location\":\"42\",\"days\":3}");
        let m =
            run(p, Some(&r), "<tool_call>\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n<parameter=loc");
        assert_eq!(calls(&m), vec![("get_weather", json!({"days": 2}))]);
    }

    /// gpt-oss's harmony messages (the shapes SGLang's `harmony_parser.py` reads): `analysis` is
    /// reasoning, `final` and a recipient-less `commentary` content, `functions.*` calls in both
    /// header orders; built-in tools dropped; whole = char by char (in `run`).
    #[test]
    fn harmony_channels_and_calls() {
        let both = ChatParsers { tool_call: Some(ToolParser::GptOss), reasoning: Some(ReasoningParser::GptOss) };
        let r = req(ToolChoice::Auto, true);
        let m = run(
            both,
            None,
            "<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>",
        );
        assert_eq!((m.reasoning.as_deref(), m.content.as_str()), (Some("User asks 2+2. Easy."), "2 + 2 = 4."));
        let text = "<|channel|>analysis<|message|>Need the weather; call the tool.<|end|>\
                    <|start|>assistant<|channel|>commentary<|message|>Checking both cities.<|end|>\
                    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"Tokyo <|x|>\",\"days\":2}<|call|>\
                    <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"location\":\"Oslo\"}<|call|>\
                    <|start|>assistant<|channel|>analysis to=browser.search<|message|>{\"query\":\"x\"}<|call|>";
        let m = run(both, Some(&r), text);
        assert_eq!(m.reasoning.as_deref(), Some("Need the weather; call the tool."));
        assert_eq!(m.content, "Checking both cities.");
        assert_eq!(
            calls(&m),
            vec![
                ("get_weather", json!({"location": "Tokyo <|x|>", "days": 2})),
                ("get_weather", json!({"location": "Oslo"}))
            ]
        );
        assert_eq!(m.calls[0].2, "{\"location\":\"Tokyo <|x|>\",\"days\":2}");
        // Only the tool parser: analysis is dropped (SGLang's gpt-oss tool parser keeps normal
        // text only); only the reasoning parser, no tools: a call stays content, its body as
        // written.
        let tools_only = ChatParsers { tool_call: Some(ToolParser::GptOss), reasoning: None };
        let m = run(tools_only, Some(&r), text);
        assert_eq!((m.reasoning.as_deref(), m.content.as_str(), m.calls.len()), (None, "Checking both cities.", 2));
        let reasoning_only = ChatParsers { tool_call: None, reasoning: Some(ReasoningParser::GptOss) };
        let m =
            run(reasoning_only, None, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>");
        assert_eq!((m.content.as_str(), m.calls.len()), ("{}", 0));
        // Cut off inside a call (max_tokens): the call with its arguments as far as they came.
        let m = run(both, Some(&r), "<|channel|>commentary to=functions.get_weather<|message|>{\"location\": \"Ro");
        assert_eq!((m.calls.len(), m.calls[0].2.as_str()), (1, "{\"location\": \"Ro"));
        // Text outside messages, a `<|` that is no marker and a held-back `<` at the end stay.
        let m = run(both, None, "plain a <| b <");
        assert_eq!((m.content.as_str(), m.reasoning), ("plain a <| b <", None));
        // A required tool_choice's grammar makes plain JSON: the array shape, not harmony.
        let m = run(both, Some(&req(ToolChoice::Required, true)), "[{\"name\":\"get_weather\",\"parameters\":{}}]");
        assert_eq!(calls(&m), vec![("get_weather", json!({}))]);
    }

    #[test]
    fn reasoning_split() {
        let q = ChatParsers { tool_call: None, reasoning: Some(ReasoningParser::Qwen3) };
        let m = run(q, None, "\n<think>\nstep 1\n\nstep 2  \n</think>\n\nThe answer is 4.");
        assert_eq!((m.reasoning.as_deref(), m.content.as_str()), (Some("step 1\n\nstep 2"), "The answer is 4."));
        // Not forced: no <think>, no reasoning.
        let m = run(q, None, "<thin is not a tag");
        assert_eq!((m.reasoning, m.content.as_str()), (None, "<thin is not a tag"));
        // DeepSeek-R1 starts inside the reasoning; cut off before </think>, all is reasoning.
        let r1 = ChatParsers { tool_call: None, reasoning: Some(ReasoningParser::DeepseekR1) };
        let m = run(r1, None, "hmm </thi");
        assert_eq!((m.reasoning.as_deref(), m.content.as_str()), (Some("hmm </thi"), ""));
        let m = run(r1, None, "a</think>b");
        assert_eq!((m.reasoning.as_deref(), m.content.as_str()), (Some("a"), "b"));
        // DeepSeek-V3.1 thinking (the request's `thinking`; `chat::lower` decides): as R1.
        let v3 = ChatParsers { tool_call: None, reasoning: Some(ReasoningParser::DeepseekV3) };
        let m = run(v3, None, "a</think>b");
        assert_eq!((m.reasoning.as_deref(), m.content.as_str()), (Some("a"), "b"));
    }

    #[test]
    fn constrained_shapes() {
        let none = ChatParsers::default();
        let m = run(none, Some(&req(ToolChoice::Required, true)), "[{\"name\":\"get_weather\",\"parameters\":{\"location\":\"a}\",\"days\":[1,{\"x\":2}]}},{\"name\":\"get_weather\",\"parameters\":{}}]");
        assert_eq!(
            calls(&m),
            vec![("get_weather", json!({"location": "a}", "days": [1, {"x": 2}]})), ("get_weather", json!({}))]
        );
        assert_eq!(m.content, "");
        let m = run(none, Some(&req(ToolChoice::Named("get_weather".into()), true)), "{\"location\":\"Paris\"}");
        assert_eq!(calls(&m), vec![("get_weather", json!({"location": "Paris"}))]);
        let c = req(ToolChoice::Required, false).constraint();
        let Some(Constraint::Json(s)) = c else { panic!("a schema") };
        assert_eq!((s["minItems"].clone(), s["maxItems"].clone()), (json!(1), json!(1)));
        assert_eq!(s["items"]["anyOf"][0]["properties"]["name"]["enum"], json!(["get_weather"]));
    }

    /// The table is the one list of formats: every name and alias reads back as its row, and
    /// the flag's error lists them all.
    #[test]
    fn parser_table_names() {
        for p in ToolParser::ALL {
            for name in p.format().names() {
                assert_eq!(name.parse::<ToolParser>(), Ok(*p), "{name}");
            }
        }
        assert_eq!(ToolParser::Phi4Mini.name(), "phi4_mini");
        assert_eq!(
            "nope".parse::<ToolParser>(),
            Err("have: qwen25 (also qwen, hermes), glm45 (also glm47), llama3, phi4_mini, gpt-oss, deepseekv3, deepseekv31, \
                 qwen3_coder (also qwen3_xml)"
                .to_owned())
        );
    }

    #[test]
    fn tool_fields() {
        let parse = |v: Value, p| ToolRequest::parse(v.as_object().expect("object"), p);
        let with = ChatParsers { tool_call: Some(ToolParser::Qwen25), reasoning: None };
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        let r = parse(json!({"tools": tools}), with).expect("ok").expect("some");
        assert_eq!((r.choice.clone(), r.parallel), (ToolChoice::Auto, true));
        assert_eq!(r.tools[0].parameters, json!({"type": "object", "properties": {}}));
        for (body, field) in [
            (json!({"tools": tools}), "tool_choice"), // auto without a parser
            (json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "g"}}}), "tool_choice"),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (json!({"tools": [{"type": "function", "function": {}}], "tool_choice": "required"}), "tools"),
            (json!({"tools": tools, "tool_choice": "sometimes"}), "tool_choice"),
        ] {
            match parse(body.clone(), ChatParsers::default()) {
                Err(ApiError::BadRequest { param, .. }) => assert_eq!(param.as_deref(), Some(field), "{body}"),
                other => panic!("{body}: {other:?}"),
            }
        }
        assert!(parse(json!({"tools": tools, "tool_choice": "required"}), ChatParsers::default()).is_ok());
        assert_eq!(parse(json!({"tool_choice": "none"}), with).expect("ok"), None);
    }
}
