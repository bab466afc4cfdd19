//! The server's parsers: the `--tool-call-parser` table, one row per format (SGLang's
//! `ToolCallParserEnum` in `function_call_parser.py`: a name to the detector class that owns
//! parsing, streaming and its prompt format), and the `--reasoning-parser`s ([`ChatParsers`]).
//!
//! Adding a tool-call format is its file (a [`ToolFormat`]: names, machine, prompt forms where
//! they differ from Hermes') and its row in `tool_parsers!`; the flag's parsing, its error
//! message and the server's own errors list the table.

use std::str::FromStr;

use super::format::ToolFormat;
use super::{deepseekv3, deepseekv31, glm45, gpt_oss, llama3, phi4_mini, qwen25, qwen3_coder};

/// Declares [`ToolParser`] from the rows `Variant => format`: the enum and its formats in one
/// list.
macro_rules! tool_parsers {
    ($($(#[$doc:meta])* $variant:ident => $format:path,)+) => {
        /// A `--tool-call-parser`: a row of the table; [`ToolParser::format`] is what it reads
        /// and writes.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum ToolParser {
            $($(#[$doc])* $variant,)+
        }

        impl ToolParser {
            /// Every format, in the table's order.
            pub const ALL: &'static [ToolParser] = &[$(ToolParser::$variant),+];

            /// The format.
            pub fn format(self) -> &'static dyn ToolFormat {
                match self {
                    $(ToolParser::$variant => &$format,)+
                }
            }
        }
    };
}

tool_parsers! {
    /// Hermes / Qwen 2.5: `<tool_call>{"name": …, "arguments": {…}}</tool_call>`.
    Qwen25 => qwen25::Qwen25,
    /// GLM-4.5 / GLM-5: `<tool_call>name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>…</tool_call>`.
    Glm45 => glm45::Glm45,
    /// Llama 3.1–3.3 JSON calls: the reply is `{"name": …, "parameters": {…}}` (after an
    /// optional `<|python_tag|>`), several separated by `;` (SGLang's `llama3` detector,
    /// `llama32_detector.py`).
    Llama3 => llama3::Llama3,
    /// Phi-4-mini: `functools[{"name": …, "arguments": {…}}, …]`, text around the block is
    /// content (SGLang's `phi4mini_detector.py`, vLLM's `phi4_mini_json`).
    Phi4Mini => phi4_mini::Phi4Mini,
    /// gpt-oss's harmony: `<|channel|>commentary to=functions.{name} <|constrain|>json
    /// <|message|>{args}<|call|>` (SGLang's `gpt_oss_detector.py`).
    GptOss => gpt_oss::GptOss,
    /// DeepSeek-V3 / R1-0528: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}
    /// \n```json\n{args}\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>` (SGLang's
    /// `deepseekv3_detector.py`).
    DeepseekV3 => deepseekv3::DeepseekV3,
    /// DeepSeek-V3.1: the same block, each call `{name}<｜tool▁sep｜>{args}` (SGLang's
    /// `deepseekv31_detector.py`).
    DeepseekV31 => deepseekv31::DeepseekV31,
    /// Qwen3-Coder, Qwen3.5 and Qwen3.6: `<tool_call>\n<function=name>\n<parameter=k>\nv\n</parameter>…
    /// </function>\n</tool_call>`, values typed by the schema (SGLang's `qwen3_coder_detector.py`).
    Qwen3Coder => qwen3_coder::Qwen3Coder,
}

impl ToolParser {
    /// The flag value.
    pub fn name(self) -> &'static str {
        self.format().names()[0]
    }
}

impl FromStr for ToolParser {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(p) = ToolParser::ALL.iter().find(|p| p.format().names().contains(&s)) {
            return Ok(*p);
        }
        let have: Vec<String> = ToolParser::ALL
            .iter()
            .map(|p| match p.format().names() {
                [name] => (*name).to_owned(),
                [name, aliases @ ..] => format!("{name} (also {})", aliases.join(", ")),
                [] => String::new(),
            })
            .collect();
        Err(format!("have: {}", have.join(", ")))
    }
}

/// A `--reasoning-parser` (SGLang's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParser {
    /// GLM-4.5: the model opens `<think>` itself.
    Glm45,
    /// Qwen 3: the model opens `<think>` itself.
    Qwen3,
    /// DeepSeek-R1: the template opens `<think>`, the output starts inside the reasoning.
    DeepseekR1,
    /// DeepSeek-V3.1 / V3.2, hybrid: with the request's `chat_template_kwargs.thinking` the
    /// template opens `<think>` and the output starts inside the reasoning (as `deepseek-r1`);
    /// without it the answer is all content (SGLang's and vLLM's `deepseek-v3`).
    DeepseekV3,
    /// gpt-oss: the harmony `analysis` channel is the reasoning, `final` the answer.
    GptOss,
}

impl ReasoningParser {
    /// The flag value.
    pub fn name(self) -> &'static str {
        match self {
            ReasoningParser::Glm45 => "glm45",
            ReasoningParser::Qwen3 => "qwen3",
            ReasoningParser::DeepseekR1 => "deepseek-r1",
            ReasoningParser::DeepseekV3 => "deepseek-v3",
            ReasoningParser::GptOss => "gpt-oss",
        }
    }

    /// Whether the answer starts inside the reasoning, its `<think>` opened by the template
    /// (`deepseek-v3` runs only for a `thinking` request, whose template opened it).
    pub fn starts_inside(self) -> bool {
        matches!(self, ReasoningParser::DeepseekR1 | ReasoningParser::DeepseekV3)
    }
}

impl FromStr for ReasoningParser {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "glm45" => Ok(ReasoningParser::Glm45),
            "qwen3" => Ok(ReasoningParser::Qwen3),
            "deepseek-r1" => Ok(ReasoningParser::DeepseekR1),
            "deepseek-v3" => Ok(ReasoningParser::DeepseekV3),
            "gpt-oss" => Ok(ReasoningParser::GptOss),
            _ => Err("have: glm45, qwen3, deepseek-r1, deepseek-v3, gpt-oss".to_owned()),
        }
    }
}

/// The server's parsers (from `--tool-call-parser` and `--reasoning-parser`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChatParsers {
    /// How `auto` tool calls are read from the text.
    pub tool_call: Option<ToolParser>,
    /// How reasoning is split from the answer.
    pub reasoning: Option<ReasoningParser>,
}

impl ChatParsers {
    /// Whether gpt-oss's harmony format is read (either parser `gpt-oss`).
    pub fn harmony(&self) -> bool {
        self.tool_call == Some(ToolParser::GptOss) || self.reasoning == Some(ReasoningParser::GptOss)
    }
}
