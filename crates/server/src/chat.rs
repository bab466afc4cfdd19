//! The one internal chat request every chat-like API lowers into: OpenAI's
//! `/v1/chat/completions`, the Responses API's `/v1/responses` and Anthropic's `/v1/messages`
//! each read their own wire shape into a [`ChatRequest`], and [`lower`] turns it into prompt
//! token ids (through the model's chat template), generation parameters and the [`ChatShape`]
//! that splits the answer into content, reasoning and tool calls. What a template cannot show
//! (tools, earlier calls) is written the way the server's `--tool-call-parser` reads it, once,
//! here, for all three APIs.

use crate::error::ApiError;
use crate::gen::{self, Prepared};
use crate::params::{GenParams, LogprobAsk, ReasoningBudget};
use crate::state::AppState;
use crate::tools::{self, ChatParsers, ReasoningParser, Shaper, ToolChoice, ToolParser, ToolRequest};
use serde_json::{Map, Value};
use sparrow_tokenizer::pyjson::{dumps, DumpsOptions};
use sparrow_tokenizer::{ChatMessage, TemplateTools};

/// A chat-like request in API-neutral terms.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// The conversation: roles `system`, `user`, `assistant`, `tool`; an assistant message's
    /// `tool_calls` in the template form (`arguments` as an object when it parses).
    pub messages: Vec<ChatMessage>,
    /// Tools, `tool_choice` and `parallel_tool_calls`.
    pub tools: Option<ToolRequest>,
    /// Extra chat-template variables (`enable_thinking`, `reasoning_effort`, …).
    pub kwargs: Map<String, Value>,
    /// Sampling, stop, limits and the structured-output constraint.
    pub params: GenParams,
    /// The logprobs asked for.
    pub ask: LogprobAsk,
    /// Split reasoning text off the answer (when the server has a `--reasoning-parser`).
    pub separate_reasoning: bool,
    /// When the conversation ends with a non-empty assistant message, continue it instead of
    /// opening a new turn: Anthropic's prefill, vLLM's `continue_final_message`.
    pub continue_final: bool,
}

/// How a chat answer's text becomes content, reasoning and tool calls (one [`Shaper`] per
/// choice, the same for the stream and the collected answer).
#[derive(Clone, Default)]
pub struct ChatShape {
    /// The server's parsers.
    pub parsers: ChatParsers,
    /// The request's tools, when it has any.
    pub tools: Option<ToolRequest>,
    /// Whether reasoning is split off.
    pub separate_reasoning: bool,
    /// The request's tag in the request log: the calls parsed are logged under it.
    pub log: Option<crate::reqlog::LogTag>,
    /// The prompt ends inside an opened `<think>` ([`opens_think`]).
    pub opened: bool,
}

impl ChatShape {
    /// A fresh machine for one choice.
    pub fn shaper(&self) -> Shaper {
        Shaper::new(self.parsers, self.tools.as_ref(), self.separate_reasoning).logged(self.log).opened(self.opened)
    }
}

/// Puts a `required` or named `tool_choice`'s grammar on `p`.
///
/// # Errors
/// A 400 when the request already carries a structured-output constraint.
pub fn add_tool_constraint(p: &mut GenParams, tools: Option<&ToolRequest>) -> Result<(), ApiError> {
    if let Some(c) = tools.and_then(ToolRequest::constraint) {
        if let Some((_, field)) = &p.constraint {
            return Err(ApiError::bad(
                field,
                format!("{field} cannot be combined with a required or named tool_choice"),
            ));
        }
        p.constraint = Some((c, "tools"));
    }
    Ok(())
}

/// A tool message answering call `call_id`, named after the function an earlier assistant
/// message of `conv` called with that id (templates show the name; APIs that send results by id
/// only, as Responses and Messages do, leave it to be found).
pub fn tool_result(conv: &[ChatMessage], call_id: &str, content: String) -> ChatMessage {
    let name = conv.iter().rev().find_map(|m| {
        m.tool_calls.as_ref()?.as_array()?.iter().find_map(|c| {
            (c["id"].as_str() == Some(call_id)).then(|| c["function"]["name"].as_str().map(str::to_owned))?
        })
    });
    let mut msg = ChatMessage::new("tool", content);
    msg.tool_call_id = Some(call_id.to_owned());
    msg.name = name;
    msg
}

/// Whether a rendered prompt ends inside an opened `<think>` (QwQ's, R1's and Qwen 3.5's
/// generation prompts open it when thinking is on): the answer then starts inside the reasoning
/// whatever the parser's default, as llama.cpp's `thinking_forced_open` reads the prompt.
pub fn opens_think(prompt: &str) -> bool {
    prompt.trim_end().ends_with(tools::THINK_START)
}

/// [`prompt`]'s token ids alone.
///
/// # Errors
/// [`prompt`]'s.
pub fn prompt_ids(
    s: &AppState,
    conv: Vec<ChatMessage>,
    tools: Option<&ToolRequest>,
    kwargs: &Map<String, Value>,
    continue_final: bool,
) -> Result<Vec<u32>, ApiError> {
    prompt(s, conv, tools, kwargs, continue_final).map(|(ids, _)| ids)
}

/// The prompt's token ids, and whether it ends inside an opened `<think>` ([`opens_think`]):
/// the conversation through the chat template, with the tools where
/// the template reads them (its `tools` argument, the system message, or a system prompt we
/// write in the parser's format), and earlier calls written into their assistant messages'
/// text, in the parser's format, when the template cannot show them. With `continue_final` and
/// a non-empty last assistant message the prompt ends inside that message, so generation
/// continues it.
///
/// # Errors
/// A 400 naming `messages` when the template fails or the text does not tokenize.
pub fn prompt(
    s: &AppState,
    mut conv: Vec<ChatMessage>,
    tools: Option<&ToolRequest>,
    kwargs: &Map<String, Value>,
    continue_final: bool,
) -> Result<(Vec<u32>, bool), ApiError> {
    let where_tools = s.tokenizer.template_tools();
    let native_tools = where_tools == TemplateTools::Argument;
    if !native_tools {
        for m in &mut conv {
            if let Some(calls) = &m.tool_calls {
                m.content.push_str(&tools::history_calls(calls, s.parsers.tool_call));
            }
        }
    }
    let prefill = match conv.last() {
        Some(m) if continue_final && m.role == "assistant" && !m.content.is_empty() => Some(m.content.clone()),
        _ => None,
    };
    let shown = tools.filter(|t| t.shown());
    if let (Some(t), TemplateTools::SystemMessage) = (shown, where_tools) {
        // Phi-4-mini's way: the tools ride on the system message, one is added if none.
        if conv.first().is_none_or(|m| m.role != "system") {
            conv.insert(0, ChatMessage::new("system", ""));
        }
        if let Some(first) = conv.first_mut() {
            first.tools = Some(dumps(&t.raw, &DumpsOptions::PYTHON));
        }
    } else if let (Some(t), false) = (shown, native_tools) {
        let prompt = tools::tools_system_prompt(&t.raw, s.parsers.tool_call);
        match conv.first_mut() {
            Some(first) if first.role == "system" => first.content = format!("{}\n\n{prompt}", first.content),
            _ => conv.insert(0, ChatMessage::new("system", prompt)),
        }
    }
    let mut text = s
        .tokenizer
        .apply_chat_template_with(&conv, shown.filter(|_| native_tools).map(|t| &t.raw), kwargs, prefill.is_none())
        .map_err(|e| ApiError::bad("messages", e.to_string()))?;
    if let Some(p) = prefill {
        // vLLM's rule for `continue_final_message`: the rendered conversation is cut right after
        // the last message's text, dropping the end-of-turn the template wrote after it.
        let end = text.rfind(&p).map(|i| i + p.len()).ok_or_else(|| {
            ApiError::bad("messages", "the chat template does not show the final assistant message to continue")
        })?;
        text.truncate(end);
    }
    let ids = s.tokenizer.encode(&text, false).map_err(|e| ApiError::bad("messages", e.to_string()))?;
    Ok((ids, opens_think(&text)))
}

/// Whether an answer's reasoning is split off, given the server's `parsers`, the request's
/// template variables, whether it asked (`separate_reasoning`) and whether a grammar
/// constrains it. A grammar forces the answer's shape from the first token: there is no
/// reasoning to split off (a `deepseek-r1` parser would otherwise take the constrained JSON for
/// reasoning). DeepSeek-V3.1's hybrid `deepseek-v3` splits only when the request turned its
/// template's `thinking` on (SGLang's and vLLM's rule): otherwise the answer is content.
fn splits_reasoning(parsers: &ChatParsers, kwargs: &Map<String, Value>, asked: bool, constrained: bool) -> bool {
    let thinking = kwargs.get("thinking").and_then(Value::as_bool).unwrap_or(false);
    asked && !constrained && (parsers.reasoning != Some(ReasoningParser::DeepseekV3) || thinking)
}

/// Lowers a chat request to a prepared engine request and its answer's shape.
///
/// # Errors
/// The template's and [`gen::prepare`]'s 400s.
pub fn lower(s: &AppState, req: ChatRequest) -> Result<(Prepared, ChatShape), ApiError> {
    let ChatRequest { messages, tools, kwargs, mut params, ask, separate_reasoning, continue_final } = req;
    let (ids, opened) = prompt(s, messages, tools.as_ref(), &kwargs, continue_final)?;
    params.logprobs = ask.spec(ids.len());
    let separate_reasoning = splits_reasoning(&s.parsers, &kwargs, separate_reasoning, params.constraint.is_some());
    // Harmony's channels are special tokens: the answer keeps them for the parser to read (as
    // SGLang sets `skip_special_tokens = False` for gpt-oss); the parser drops them.
    if s.parsers.harmony() {
        params.skip_special_tokens = false;
    }
    // The thinking budget needs the reasoning's tags: a `<think>` parser that splits this answer.
    params.reasoning_budget = match (params.reasoning_budget, s.parsers.reasoning) {
        (Some(b), Some(p)) if separate_reasoning && !s.parsers.harmony() && params.constraint.is_none() => {
            Some(ReasoningBudget { inside: p.starts_inside() || opened, ..b })
        }
        _ => None,
    };
    // Under `auto` with a Hermes parser a call, once opened, is constrained to the tools.
    if let (Some(t), Some(ToolParser::Qwen25)) = (&tools, s.parsers.tool_call) {
        if t.choice == ToolChoice::Auto && params.constraint.is_none() && params.reasoning_budget.is_none() {
            params.lazy_calls = Some(t.tools.clone());
        }
    }
    let prep = gen::prepare(s, ids, params)?;
    let log = prep.log;
    Ok((prep, ChatShape { parsers: s.parsers, tools, separate_reasoning, log, opened }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `deepseek-v3` splits only a `thinking` request's answer; the other parsers split unless a
    /// grammar constrains the answer or the request said `separate_reasoning: false`.
    #[test]
    fn reasoning_split_by_parser_and_request() {
        let kw = |v: Value| v.as_object().cloned().unwrap_or_default();
        let v3 = ChatParsers { tool_call: None, reasoning: Some(ReasoningParser::DeepseekV3) };
        let r1 = ChatParsers { tool_call: None, reasoning: Some(ReasoningParser::DeepseekR1) };
        assert!(!splits_reasoning(&v3, &kw(serde_json::json!({})), true, false));
        assert!(!splits_reasoning(&v3, &kw(serde_json::json!({"thinking": false})), true, false));
        assert!(splits_reasoning(&v3, &kw(serde_json::json!({"thinking": true})), true, false));
        assert!(!splits_reasoning(&v3, &kw(serde_json::json!({"thinking": true})), true, true));
        assert!(splits_reasoning(&r1, &kw(serde_json::json!({})), true, false));
        assert!(!splits_reasoning(&r1, &kw(serde_json::json!({})), false, false));
    }

    /// A prompt that ends inside `<think>` (QwQ's generation prompt, Qwen 3.5's with thinking on)
    /// opens the reasoning; one that closed it (Qwen 3 with `enable_thinking: false`) does not.
    #[test]
    fn a_prompt_ending_in_think_opens_the_reasoning() {
        assert!(opens_think("<|im_start|>assistant\n<think>\n"));
        assert!(!opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!opens_think("<|im_start|>assistant\n"));
        let p = ChatParsers { tool_call: None, reasoning: Some(ReasoningParser::Qwen3) };
        let mut opened = Shaper::new(p, None, true).opened(true);
        let mut d = opened.push("Think.</think>Answer.");
        d.extend(opened.finish());
        let mut m = tools::Message::default();
        m.add(&d);
        assert_eq!((m.reasoning.as_deref(), m.content.as_str()), (Some("Think."), "Answer."));
    }
}
