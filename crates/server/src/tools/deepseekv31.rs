//! DeepSeek-V3.1 calls (`deepseekv31`, SGLang's `deepseekv31_detector.py`): in DeepSeek's block
//! (`deepseek`), each call `{name}<｜tool▁sep｜>{arguments}`.

use std::sync::Arc;

use serde_json::Value;
use sparrow_tokenizer::pyjson::{dumps, DumpsOptions};

use super::deepseek::{history_block, DeepseekCalls, TOOL_SEP};
use super::format::{CallMachine, ToolFormat, ToolSpec};

/// The `deepseekv31` row.
pub(super) struct DeepseekV31;

impl ToolFormat for DeepseekV31 {
    fn names(&self) -> &'static [&'static str] {
        &["deepseekv31"]
    }

    fn machine(&self, _tools: &Arc<[ToolSpec]>) -> Box<dyn CallMachine> {
        Box::new(DeepseekCalls::new(call))
    }

    /// DeepSeek-V3.1's template's own wording of its call format.
    fn how_to_call(&self) -> &'static str {
        "To call functions, respond with <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{function-name}<｜tool▁sep｜>\
         {args-json-object}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    }

    /// One block, calls back to back (as DeepSeek-V3.1's template writes them).
    fn history(&self, calls: &[(&Value, &Value)]) -> String {
        let each = calls
            .iter()
            .map(|(n, a)| format!("{}{TOOL_SEP}{}", n.as_str().unwrap_or_default(), dumps(a, &DumpsOptions::PYTHON)));
        history_block(each, "")
    }
}

/// A call's name and arguments from `{name}<｜tool▁sep｜>{arguments}`.
fn call(body: &str, _whole: bool) -> Option<(String, String)> {
    let (head, rest) = body.split_once(TOOL_SEP)?;
    let name = head.trim();
    (!name.is_empty()).then(|| (name.to_owned(), rest.trim().to_owned()))
}
