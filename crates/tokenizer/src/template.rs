//! Chat templates rendered as HF `apply_chat_template` renders them: a minijinja environment
//! with HF's settings (`trim_blocks`, `lstrip_blocks`, Python's string and dict methods), its
//! `raise_exception`, `strftime_now` and `tojson` (Python's `json.dumps`), under limits a
//! template from a model file cannot pass (fuel, an output cap, no loader); the start-up check
//! of a model's template; [`ChatMessage`] and where a template reads tools
//! ([`TemplateTools`]).

use serde::Serialize;

use crate::{Tokenizer, TokenizerError};

/// Where a chat template reads the request's tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateTools {
    /// It does not: the server describes them in a system message of its own.
    NotRead,
    /// From HF's `tools=` argument (Qwen, Llama 3.1+, SmolLM3, Mistral).
    Argument,
    /// From the system message's `tools` field, a JSON string (Phi-4-mini's model card:
    /// `{"role": "system", "content": …, "tools": json.dumps(tools)}`).
    SystemMessage,
}

/// One chat message as chat templates see it (HF's message dict).
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text of the message.
    pub content: String,
    /// An assistant message's calls, `[{"id", "type": "function", "function": {"name",
    /// "arguments"}}]` with `arguments` as an object (templates iterate it; vLLM parses the
    /// API's string the same way).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// A tool message's `tool_call_id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A tool message's function `name`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant message's reasoning, as a reasoning parser returned it
    /// (`reasoning_content`): Qwen3's template writes it back as `<think>…</think>` for the
    /// turns after the last user message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// A system message's tools as a JSON string, for templates that read them there
    /// ([`TemplateTools::SystemMessage`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<String>,
}

impl ChatMessage {
    /// A plain text message.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into(), ..Default::default() }
    }
}

impl Tokenizer {
    /// Renders the chat template for `messages`, as HF `apply_chat_template(..., tokenize=False)`.
    ///
    /// # Errors
    /// [`TokenizerError::ChatTemplate`] when the model has no template or rendering fails
    /// (including a template's own `raise_exception`).
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.apply_chat_template_with(messages, None, &serde_json::Map::new(), add_generation_prompt)
    }

    /// Checks the chat template once, at start-up: renders it on a plain 4-message
    /// conversation, one with tools, a tool call and its result, and a 64-turn conversation of
    /// 1 KiB messages, under the
    /// renderer's fuel, [`TEMPLATE_CHECK_OUTPUT`] and, on this thread, [`sparrow_cpu::guard::with_budget`]'s
    /// [`TEMPLATE_CHECK_BUDGET`] (under [`sparrow_cpu::guard::GuardedAlloc`], a template past it ends the
    /// process, naming [`Tokenizer::source`]). No template: nothing to check.
    ///
    /// Returns a warning for a template that fails on the plain conversations for a reason of
    /// its own (a syntax minijinja does not take, its `raise_exception`): chat requests will
    /// fail alike, the other endpoints work. Its failures on the tool conversation are not
    /// reported (templates take tool turns in their own ways); its limits are.
    ///
    /// # Errors
    /// [`TokenizerError::ChatTemplate`] for a template past a limit (a loop without end, a
    /// flood of output) or one that tries to read another file (`include`, `import`,
    /// `extends`).
    pub fn check_chat_template(&self) -> Result<Option<String>, TokenizerError> {
        let Some(template) = self.chat_template.as_deref() else { return Ok(None) };
        let special = (self.bos.as_ref().map_or("", |b| b.1.as_str()), self.eos.as_ref().map_or("", |e| e.1.as_str()));
        check_template(template, special, &format!("{} (its chat template)", self.source.display()))
    }

    /// Where the chat template reads a request's tools from, judged from its text (templates
    /// declare nothing): a template that reads `message['tools']` (or `message.tools`) is taken
    /// as [`TemplateTools::SystemMessage`] even if it also mentions `tools` elsewhere; otherwise
    /// any mention of `tools` means [`TemplateTools::Argument`].
    pub fn template_tools(&self) -> TemplateTools {
        match self.chat_template.as_deref() {
            Some(t) if ["message['tools']", "message[\"tools\"]", "message.tools"].iter().any(|m| t.contains(m)) => {
                TemplateTools::SystemMessage
            }
            Some(t) if t.contains("tools") => TemplateTools::Argument,
            _ => TemplateTools::NotRead,
        }
    }

    /// [`Tokenizer::apply_chat_template`] with the request's `tools` (OpenAI's list, passed as
    /// HF passes `tools=`) and `chat_template_kwargs` (extra template variables such as Qwen 3's
    /// `enable_thinking`; they cannot override the fixed ones).
    ///
    /// # Errors
    /// As [`Tokenizer::apply_chat_template`].
    pub fn apply_chat_template_with(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        kwargs: &serde_json::Map<String, serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let template = self
            .chat_template
            .as_deref()
            .ok_or_else(|| TokenizerError::ChatTemplate("the model has no chat template".into()))?;
        let special = (self.bos.as_ref().map_or("", |b| b.1.as_str()), self.eos.as_ref().map_or("", |e| e.1.as_str()));
        render_template(template, messages, tools, kwargs, add_generation_prompt, special)
    }
}

/// Instructions one chat-template render may execute (minijinja's fuel): a template comes from
/// a model file, and one that loops without end must fail the request, not hold a thread. Real
/// templates take thousands per message (SmolLM2's: ~60; a tool-calling Llama 3.1 render of
/// a long chat: well under 10^6).
pub const TEMPLATE_FUEL: u64 = 20_000_000;

/// Bytes one chat-template render may write.
pub const TEMPLATE_MAX_OUTPUT: usize = 64 << 20;

/// Bytes a chat template may hold at once while [`Tokenizer::check_chat_template`] renders
/// it: 16 MiB, 250 times the 64 KiB of its longest check conversation, with room for the
/// output buffer at [`TEMPLATE_CHECK_OUTPUT`] while it grows (a flooding template meets the
/// output cap first).
pub const TEMPLATE_CHECK_BUDGET: usize = 16 << 20;

/// The output cap of the start-up check's renders: 4 MiB, 60 times what a real template makes
/// of the longest check conversation.
pub const TEMPLATE_CHECK_OUTPUT: usize = 4 << 20;

/// A `Write` that refuses to grow past `max` bytes.
struct Capped {
    buf: Vec<u8>,
    max: usize,
    overflowed: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + b.len() > self.max {
            self.overflowed = true;
            return Err(std::io::Error::other("output limit"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Renders `template` as HF `apply_chat_template` does: `messages`, `tools`,
/// `add_generation_prompt`, `bos_token` / `eos_token` (`special`), and `kwargs` as extra
/// variables that cannot override those.
///
/// Renders under [`TEMPLATE_FUEL`] and [`TEMPLATE_MAX_OUTPUT`], with no loader (a template
/// cannot include or read files).
///
/// # Errors
/// [`TokenizerError::ChatTemplate`] when the template does not parse or fails to render
/// (including its own `raise_exception`), or passes a limit.
pub fn render_template(
    template: &str,
    messages: &[ChatMessage],
    tools: Option<&serde_json::Value>,
    kwargs: &serde_json::Map<String, serde_json::Value>,
    add_generation_prompt: bool,
    special: (&str, &str),
) -> Result<String, TokenizerError> {
    render_classified(template, messages, tools, kwargs, add_generation_prompt, special, TEMPLATE_MAX_OUTPUT)
        .map_err(|(_, e)| e)
}

/// [`Tokenizer::check_chat_template`] for a template source with the model's BOS and EOS
/// text; `what` names it in the message of a process ended by [`sparrow_cpu::guard`].
///
/// # Errors
/// As [`Tokenizer::check_chat_template`].
pub fn check_template(template: &str, special: (&str, &str), what: &str) -> Result<Option<String>, TokenizerError> {
    let call = serde_json::json!([{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]);
    let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather of a city", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let plain = vec![
        ChatMessage::new("system", "You are helpful."),
        ChatMessage::new("user", "Hello."),
        ChatMessage::new("assistant", "Hi."),
        ChatMessage::new("user", "Thanks."),
    ];
    let tool_turns = vec![
        ChatMessage::new("system", "You are helpful."),
        ChatMessage::new("user", "Weather in Paris?"),
        ChatMessage { tool_calls: Some(call), ..ChatMessage::new("assistant", "") },
        ChatMessage {
            tool_call_id: Some("call_1".into()),
            name: Some("get_weather".into()),
            ..ChatMessage::new("tool", "18C")
        },
        ChatMessage::new("user", "Thanks."),
    ];
    let long: Vec<ChatMessage> =
        (0..64).map(|i| ChatMessage::new(if i % 2 == 0 { "user" } else { "assistant" }, "word ".repeat(205))).collect();
    let kwargs = serde_json::Map::new();
    let mut warning = None;
    // (conversation, tools, whether the template's own failure on it is worth a warning): how
    // templates take tool turns varies (Mistral's want 9-character call ids and alternation
    // without them), so only the plain conversations warn; every one is held to the limits.
    for (messages, tools, warns) in [(&plain, None, true), (&tool_turns, Some(&tools), false), (&long, None, true)] {
        let r = sparrow_cpu::guard::with_budget(what, TEMPLATE_CHECK_BUDGET, || {
            render_classified(template, messages, tools, &kwargs, true, special, TEMPLATE_CHECK_OUTPUT)
        });
        match r {
            Ok(_) => {}
            Err((Fault::Limit | Fault::File, e)) => return Err(e),
            Err((Fault::Template, e)) if warns => warning = warning.or(Some(e.to_string())),
            Err((Fault::Template, _)) => {}
        }
    }
    Ok(warning)
}

/// Why a render failed, for the start-up check ([`Tokenizer::check_chat_template`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Past the fuel or the output cap.
    Limit,
    /// `include`, `import` or `extends`: a template that tries to read another file.
    File,
    /// A syntax error, `raise_exception`, an undefined value: the template's own failure.
    Template,
}

fn render_classified(
    template: &str,
    messages: &[ChatMessage],
    tools: Option<&serde_json::Value>,
    kwargs: &serde_json::Map<String, serde_json::Value>,
    add_generation_prompt: bool,
    special: (&str, &str),
    max_output: usize,
) -> Result<String, (Fault, TokenizerError)> {
    let err = |fault, msg: String| (fault, TokenizerError::ChatTemplate(msg));
    let mut env = minijinja::Environment::new();
    // HF compiles templates with `trim_blocks` and `lstrip_blocks` (`_compile_jinja_template`),
    // and templates call Python's string and dict methods (Qwen3's `startswith`, SmolLM3's
    // `lstrip`, Mistral's `items`): minijinja-contrib's pycompat provides those.
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
        Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
    });
    env.add_filter("tojson", tojson);
    // HF's `strftime_now` (gpt-oss's "Current date: …" line): the clock's time, UTC.
    env.add_function("strftime_now", |fmt: String| -> Result<String, minijinja::Error> {
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        strftime(&fmt, secs).map_err(|e| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e))
    });
    env.add_template("chat", template).map_err(|e| err(Fault::Template, e.to_string()))?;
    let tmpl = env.get_template("chat").map_err(|e| err(Fault::Template, e.to_string()))?;
    // HF's `_alias_reasoning_fields`: a message's reasoning is also passed as `thinking`, the
    // field gpt-oss's template reads.
    let messages: Vec<serde_json::Value> = messages
        .iter()
        .map(|m| {
            let mut v = serde_json::to_value(m).unwrap_or_default();
            if let (Some(r), Some(o)) = (&m.reasoning_content, v.as_object_mut()) {
                o.entry("thinking").or_insert_with(|| serde_json::Value::String(r.clone()));
            }
            v
        })
        .collect();
    let fixed = minijinja::context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => special.0,
        eos_token => special.1,
        tools => tools,
    };
    let mut out = Capped { buf: Vec::new(), max: max_output, overflowed: false };
    let ctx = minijinja::context! { ..fixed, ..minijinja::Value::from_serialize(kwargs) };
    let rendered = tmpl.render_captured_to(ctx, &mut out).map(|_| ());
    match rendered {
        Ok(_) => String::from_utf8(out.buf).map_err(|e| err(Fault::Template, e.to_string())),
        Err(_) if out.overflowed => {
            Err(err(Fault::Limit, format!("the chat template rendered more than {} MiB; refused", max_output >> 20)))
        }
        Err(e) if e.kind() == minijinja::ErrorKind::OutOfFuel => Err(err(
            Fault::Limit,
            format!("the chat template ran past {TEMPLATE_FUEL} instructions (a loop without end?); refused"),
        )),
        Err(e) if e.kind() == minijinja::ErrorKind::TemplateNotFound => Err(err(
            Fault::File,
            format!("the chat template tries to read another template or file, which sparrow never does: {e}"),
        )),
        Err(e) => Err(err(Fault::Template, e.to_string())),
    }
}

/// Python's `strftime` of the UTC time `secs` after the Unix epoch, for the directives
/// templates use: `%Y %m %d %H %M %S %B %b %A %a %%`.
///
/// # Errors
/// Another directive, named.
pub fn strftime(fmt: &str, secs: u64) -> Result<String, String> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's `civil_from_days`).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('B') => out.push_str(MONTHS[(month - 1) as usize]),
            Some('b') => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('%') => out.push('%'),
            other => {
                return Err(format!("strftime_now: %{} is not supported", other.map_or(String::new(), String::from)))
            }
        }
    }
    Ok(out)
}

/// Widest `tojson(indent=...)` a template may ask for.
const MAX_TOJSON_INDENT: usize = 64;

/// HF's `tojson` filter (`transformers/utils/chat_template_utils.py`): Python's `json.dumps`
/// ([`crate::pyjson::dumps`]) with `ensure_ascii=False` by default, so `", "` and `": "`
/// separators (minijinja's own is compact) and keys in their given order, taking the arguments
/// templates pass: `indent`, `separators`, `sort_keys`, `ensure_ascii` (GLM-4.5's template
/// passes the last).
fn tojson(v: minijinja::Value, kwargs: minijinja::value::Kwargs) -> Result<minijinja::Value, minijinja::Error> {
    let bad = |e: String| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e);
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    // A template's number: `" ".repeat(indent)` of a huge one aborted the process (fuzzing
    // found `indent=444444444444444444`). Real templates indent by 2 or 4.
    if let Some(n) = indent.filter(|&n| n > MAX_TOJSON_INDENT) {
        return Err(bad(format!("tojson indent {n} is past {MAX_TOJSON_INDENT}")));
    }
    let json = serde_json::to_value(&v).map_err(|e| bad(e.to_string()))?;
    let separators = match separators.map(<[String; 2]>::try_from) {
        Some(Ok([item, key])) => Some((item, key)),
        Some(Err(_)) => return Err(bad("tojson separators must be a pair".into())),
        None => None,
    };
    let options = crate::pyjson::DumpsOptions {
        ensure_ascii: ensure_ascii == Some(true),
        indent,
        separators,
        sort_keys: sort_keys == Some(true),
    };
    Ok(minijinja::Value::from_safe_string(crate::pyjson::dumps(&json, &options)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(t: &str) -> Result<String, TokenizerError> {
        render_template(t, &[ChatMessage::new("user", "hi")], None, &serde_json::Map::new(), true, ("", ""))
    }

    /// A hostile template from a model file fails the render with a clear error instead of
    /// looping (fuel) or writing without bound (output cap), and cannot include a file (no
    /// loader); a real template still renders.
    #[test]
    fn hostile_templates_fail_cleanly() {
        let t0 = std::time::Instant::now();
        let e = render("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}")
            .expect_err("endless loop");
        assert!(e.to_string().contains("instructions"), "{e}");
        let e = render("{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}").expect_err("huge output");
        assert!(e.to_string().contains("MiB"), "{e}");
        assert!(t0.elapsed() < std::time::Duration::from_secs(20), "limits bound the time");
        let e = render("{% include '/etc/passwd' %}").expect_err("no loader");
        assert!(e.to_string().contains("template not found") || e.to_string().contains("passwd"), "{e}");
        assert_eq!(
            render("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}").expect("renders"),
            "<user>hi"
        );
    }

    /// A template in the style of Qwen 2.5's (tools listed with `tojson`, calls written from
    /// their `arguments` object, `tool` turns) with Qwen 3's `enable_thinking` switch.
    const QWENISH: &str = "{%- if tools %}<tools>{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}\n</tools>\n{%- endif %}\
{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}\
{%- for c in m.tool_calls or [] %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}</tool_call>{%- endfor %}\
{%- if m.tool_call_id %}[{{ m.tool_call_id }}]{%- endif %}\n{%- endfor %}\
{%- if add_generation_prompt %}<|assistant|>{%- if enable_thinking is defined and not enable_thinking %}<think></think>{%- endif %}{%- endif %}";

    #[test]
    fn tools_calls_tool_turns_and_kwargs() {
        let msgs = [
            ChatMessage::new("user", "Weather?"),
            ChatMessage {
                tool_calls: Some(
                    json!([{"id": "c1", "type": "function", "function": {"name": "w", "arguments": {"city": "Paris"}}}]),
                ),
                ..ChatMessage::new("assistant", "")
            },
            ChatMessage { tool_call_id: Some("c1".into()), ..ChatMessage::new("tool", "14C") },
        ];
        // One key per object: the key order then does not depend on serde_json's features.
        let tools = json!([{"function": {"name": "w", "parameters": [1, "é"]}}]);
        let mut kwargs = serde_json::Map::new();
        kwargs.insert("enable_thinking".into(), json!(false));
        // A kwarg cannot replace a fixed variable.
        kwargs.insert("messages".into(), json!([]));
        let out = render_template(QWENISH, &msgs, Some(&tools), &kwargs, true, ("", "")).expect("renders");
        // As transformers 5.24 renders it (`render_jinja_template`): `trim_blocks` drops the
        // newline after each block tag.
        assert_eq!(
            out,
            "<tools>{\"function\": {\"name\": \"w\", \"parameters\": [1, \"é\"]}}</tools>\
             <|user|>Weather?<|assistant|><tool_call>{\"name\": \"w\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>\
             <|tool|>14C[c1]<|assistant|><think></think>"
        );
        let plain =
            render_template(QWENISH, &msgs[..1], None, &serde_json::Map::new(), true, ("", "")).expect("renders");
        assert_eq!(plain, "<|user|>Weather?<|assistant|>");
        let indented = render_template(
            "{{ x | tojson(indent=2) }}",
            &[],
            None,
            &{
                let mut k = serde_json::Map::new();
                k.insert("x".into(), json!({"a": [1]}));
                k
            },
            false,
            ("", ""),
        )
        .expect("renders");
        assert_eq!(indented, "{\n  \"a\": [\n    1\n  ]\n}");
        // GLM-4.5's call and the other json.dumps arguments templates use.
        let mut k = serde_json::Map::new();
        k.insert("x".into(), json!({"b": "é", "a": [], "c": {}}));
        let r = |t: &str| render_template(t, &[], None, &k, false, ("", "")).expect("renders");
        assert_eq!(r("{{ x | tojson(ensure_ascii=False, sort_keys=True) }}"), "{\"a\": [], \"b\": \"é\", \"c\": {}}");
        assert_eq!(
            r("{{ x | tojson(ensure_ascii=True, sort_keys=True, separators=(',', ':')) }}"),
            "{\"a\":[],\"b\":\"\\u00e9\",\"c\":{}}"
        );
    }
}
