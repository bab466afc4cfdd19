//! The tool-call format a model writes, read from its chat template when the server is started
//! without `--tool-call-parser`, as llama.cpp's `common_chat_templates_apply` picks a format by
//! the markers its template writes (`common/chat.cpp`). A template that shows earlier calls
//! shows them in the model's own format, so the markers it writes name the format.
//!
//! Formats the server cannot read yet are recognised too, so the start-up line can name them
//! instead of saying nothing was found.

use super::parser::{ReasoningParser, ToolParser};

/// What [`detect`] read from a chat template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detected {
    /// The format chosen; `None` when the template writes none, or one without a parser.
    pub parser: Option<ToolParser>,
    /// Why, for the start-up line: the marker seen and the format it names.
    pub why: String,
    /// The template writes no tool-call format at all (not one without a parser): the
    /// generic format is for it.
    pub none_written: bool,
}

/// Formats recognised by a marker that the server has no parser for: `(marker, format)`. They
/// are tested before Hermes' `<tool_call>`, which several of them also write.
const UNREAD: &[(&str, &str)] = &[
    ("<tool_calls>[", "Apriel's <tool_calls> list"),
    ("start with <function=", "Functionary v3.1's <function=name>{…}</function> calls"),
    ("<function=", "XML calls <function=…><parameter=…> outside <tool_call> (Seed-OSS)"),
    ("<invoke name=", "MiniMax's <invoke> calls"),
    ("[TOOL_CALLS]", "Mistral's [TOOL_CALLS]"),
    ("<|tool_calls_section_begin|>", "Kimi K2's tool-call sections"),
    ("<|tool_call|>", "Granite 3's <|tool_call|>"),
    ("<|START_ACTION|>", "Command R7B's actions"),
    ("dsml_token", "DeepSeek V3.2's DSML calls"),
    ("<|tool_call>call:", "Gemma 4's tool calls"),
    (">>>${recipient}", "Functionary v3.2's >>> recipients"),
];

/// The tool-call format `template` (a chat template's Jinja source) writes.
///
/// The rules, first match wins: harmony channels (`gpt-oss`); DeepSeek's
/// `<｜tool▁calls▁begin｜>` block, V3's (a fenced JSON body) or V3.1's; GLM-4.5's `<arg_key>`;
/// Qwen3-Coder's `<function=…><parameter=…>` inside `<tool_call>`;
/// the [`UNREAD`] formats; Hermes' `<tool_call>` JSON (`qwen25`); `functools[` or Phi-4-mini's
/// `<|tool|>` (`phi4_mini`); a Llama 3 header with `<|python_tag|>` or `"parameters": `
/// (`llama3`).
pub fn detect(template: &str) -> Detected {
    let has = |s: &str| template.contains(s);
    let chosen = |p: ToolParser, marker: &str| Detected {
        parser: Some(p),
        why: format!("the chat template writes {marker}"),
        none_written: false,
    };
    if has("<|channel|>") {
        return chosen(ToolParser::GptOss, "harmony channels (<|channel|>)");
    }
    if has("<｜tool▁calls▁begin｜>") {
        return if has("```json") {
            chosen(ToolParser::DeepseekV3, "<｜tool▁calls▁begin｜> with fenced JSON arguments")
        } else {
            chosen(ToolParser::DeepseekV31, "<｜tool▁calls▁begin｜> with bare JSON arguments")
        };
    }
    if has("<tool_call>") && has("<arg_key>") {
        return chosen(ToolParser::Glm45, "<tool_call> with <arg_key>");
    }
    if has("<tool_call>") && has("<function=") && has("<parameter=") {
        return chosen(ToolParser::Qwen3Coder, "<tool_call> with <function=…><parameter=…> (Qwen3-Coder XML)");
    }
    if let Some((marker, name)) = UNREAD.iter().find(|(m, _)| has(m)) {
        return Detected {
            parser: None,
            why: format!("the chat template writes {marker} ({name}), which no tool-call parser reads yet"),
            none_written: false,
        };
    }
    if has("<tool_call>") {
        return chosen(ToolParser::Qwen25, "<tool_call> JSON (Hermes)");
    }
    if has("functools[") {
        return chosen(ToolParser::Phi4Mini, "functools[");
    }
    if has("<|tool|>") {
        return chosen(ToolParser::Phi4Mini, "Phi-4-mini's <|tool|> block");
    }
    if has("<|start_header_id|>") && (has("<|python_tag|>") || has("\"parameters\": ")) {
        return chosen(ToolParser::Llama3, "Llama 3 JSON calls (\"parameters\")");
    }
    Detected { parser: None, why: "the chat template writes no tool-call format".to_owned(), none_written: true }
}

/// What [`detect_reasoning`] read from a chat template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetectedReasoning {
    /// The reasoning parser chosen; `None` when the template shows no reasoning tags.
    pub parser: Option<ReasoningParser>,
    /// Why, for the start-up line.
    pub why: String,
}

/// The reasoning parser for `template`, read from how it writes reasoning, as llama.cpp sets
/// its `thinking_start_tag` from the template it recognises.
///
/// The rules, first match wins: harmony channels (`gpt-oss`); no `<think>` at all (none);
/// GLM's `<arg_key>` template (`glm45`); DeepSeek's `<｜Assistant｜>` with its `thinking`
/// switch (`deepseek-v3`, which splits only a `thinking` request); a generation prompt that
/// opens `<think>` itself with no `enable_thinking` switch (`deepseek-r1`: the answer starts
/// inside the reasoning, as QwQ's and R1's do); any other `<think>` (`qwen3`: the model opens it).
pub fn detect_reasoning(template: &str) -> DetectedReasoning {
    let has = |s: &str| template.contains(s);
    let chosen = |p: ReasoningParser, why: &str| DetectedReasoning { parser: Some(p), why: why.to_owned() };
    if has("<|channel|>") {
        return chosen(ReasoningParser::GptOss, "the chat template writes harmony channels (<|channel|>)");
    }
    if !has("<think>") {
        return DetectedReasoning { parser: None, why: "the chat template writes no <think> tags".to_owned() };
    }
    if has("<arg_key>") {
        return chosen(ReasoningParser::Glm45, "the chat template writes <think> and GLM's <arg_key>");
    }
    if has("<｜Assistant｜>") && has("thinking is defined") {
        return chosen(
            ReasoningParser::DeepseekV3,
            "the chat template writes <think> under DeepSeek's thinking switch",
        );
    }
    // The generation prompt: what the template writes after its last `add_generation_prompt`.
    let prompt = template.rfind("add_generation_prompt").map_or("", |i| &template[i..]);
    if !has("enable_thinking") && prompt.contains("<think>") {
        return chosen(ReasoningParser::DeepseekR1, "the chat template's generation prompt opens <think>");
    }
    chosen(ReasoningParser::Qwen3, "the chat template writes <think> tags the model opens")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rules on the markers alone; every real template is classified in the server's
    /// `tests/it/tool_detect.rs`.
    #[test]
    fn first_marker_wins() {
        let p = |t: &str| detect(t).parser;
        assert_eq!(p("{{'<tool_call>'}}{\"name\": x}"), Some(ToolParser::Qwen25));
        assert_eq!(p("<tool_call><function=f><parameter=a>"), Some(ToolParser::Qwen3Coder));
        assert_eq!(p("<seed:tool_call><function=f><parameter=a>"), None);
        assert_eq!(p("<tool_call>{{ name }}<arg_key>k</arg_key>"), Some(ToolParser::Glm45));
        assert_eq!(p("<|start|>assistant<|channel|>final"), Some(ToolParser::GptOss));
        assert_eq!(p("<｜tool▁calls▁begin｜>function<｜tool▁sep｜>f\n```json\n"), Some(ToolParser::DeepseekV3));
        assert_eq!(p("<｜tool▁calls▁begin｜>f<｜tool▁sep｜>{}"), Some(ToolParser::DeepseekV31));
        assert_eq!(p("<|start_header_id|>\"parameters\": "), Some(ToolParser::Llama3));
        assert_eq!(p("\"parameters\": "), None, "no Llama 3 header: Command R's Action lists say this too");
        assert_eq!(p("<|im_start|>{{ message.content }}"), None);
        assert!(detect("[TOOL_CALLS]").why.contains("Mistral"));
        let r = |t: &str| detect_reasoning(t).parser;
        assert_eq!(r("{{'<|im_start|>assistant\n'}}"), None);
        assert_eq!(
            r("<think>{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
            Some(ReasoningParser::Qwen3)
        );
        assert_eq!(
            r("{% if add_generation_prompt %}{{'<｜Assistant｜><think>\n'}}{% endif %}"),
            Some(ReasoningParser::DeepseekR1)
        );
        assert_eq!(
            r("{% if add_generation_prompt %}<think>{% if enable_thinking is false %}</think>{% endif %}"),
            Some(ReasoningParser::Qwen3)
        );
        assert_eq!(r("<|channel|>analysis"), Some(ReasoningParser::GptOss));
    }
}
