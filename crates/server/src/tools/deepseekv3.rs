//! DeepSeek-V3 and R1-0528 calls (`deepseekv3`, SGLang's `deepseekv3_detector.py`): in
//! DeepSeek's block (`deepseek`), each call `function<｜tool▁sep｜>{name}\n```json\n{arguments}\n```.

use std::sync::Arc;

use serde_json::Value;
use sparrow_tokenizer::pyjson::{dumps, DumpsOptions};

use super::deepseek::{history_block, DeepseekCalls, TOOL_SEP};
use super::format::{CallMachine, ToolFormat, ToolSpec};

/// The `deepseekv3` row.
pub(super) struct DeepseekV3;

impl ToolFormat for DeepseekV3 {
    fn names(&self) -> &'static [&'static str] {
        &["deepseekv3"]
    }

    fn machine(&self, _tools: &Arc<[ToolSpec]>) -> Box<dyn CallMachine> {
        Box::new(DeepseekCalls::new(call))
    }

    /// DeepSeek-V3's template's own wording of its call format.
    fn how_to_call(&self) -> &'static str {
        "To call functions, respond with <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{function-name}\n\
         ```json\n{args-json-object}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    }

    /// One block, a newline between calls (as DeepSeek-V3's template writes them).
    fn history(&self, calls: &[(&Value, &Value)]) -> String {
        let each = calls.iter().map(|(n, a)| {
            format!(
                "function{TOOL_SEP}{}\n```json\n{}\n```",
                n.as_str().unwrap_or_default(),
                dumps(a, &DumpsOptions::PYTHON)
            )
        });
        history_block(each, "\n")
    }
}

/// A call's name and arguments from `function<｜tool▁sep｜>{name}\n```json\n{arguments}\n```;
/// cut off (`whole: false`), the name needs its newline.
fn call(body: &str, whole: bool) -> Option<(String, String)> {
    let (_, rest) = body.split_once(TOOL_SEP)?;
    let (name, args) = match rest.split_once('\n') {
        Some((n, a)) => (n.trim(), a),
        None if whole => (rest.trim(), ""),
        None => return None,
    };
    if name.is_empty() {
        return None;
    }
    let args = args.trim();
    let args = args.strip_prefix("```json").unwrap_or(args);
    let args = args.trim_end().strip_suffix("```").unwrap_or(args);
    Some((name.to_owned(), args.trim().to_owned()))
}
