//! The request log (`--log-requests`, SGLang's flag and its `--log-requests-level`): one line
//! per finished choice on stderr with its prompt, the prefix-cache hit, what it generated and how
//! long it took, and one line per tool call the server parsed out of the answer.
//!
//! Levels follow SGLang's meaning as far as a line goes: 0 and 1 name the call without its
//! arguments; 2 adds the arguments cut at 2048 characters (SGLang's partial input/output); 3
//! adds them whole.

use crate::gen::Finish;

/// SGLang's default `--log-requests-level`.
pub const DEFAULT_LEVEL: u8 = 2;

/// The characters of a call's arguments a level-2 line keeps (SGLang's truncation length).
const PARTIAL: usize = 2048;

/// One request in the log: its number (from 1, in arrival order) and the level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogTag {
    /// The request's number.
    pub id: u64,
    /// `--log-requests-level`, 0–3.
    pub level: u8,
}

impl LogTag {
    /// The line for a finished choice: `prompt` tokens of which `f.cached_tokens` came from the
    /// radix cache, `f.completion_tokens` generated, why it ended, `secs` since it was submitted.
    pub fn done(&self, choice: usize, prompt: usize, f: &Finish, secs: f64) {
        eprintln!("{}", self.done_line(choice, prompt, f, secs));
    }

    fn done_line(&self, choice: usize, prompt: usize, f: &Finish, secs: f64) -> String {
        let hit = if prompt == 0 { 0.0 } else { 100.0 * f.cached_tokens as f64 / prompt as f64 };
        let which = if choice == 0 { String::new() } else { format!(" choice {choice}") };
        let error = f.error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default();
        format!(
            "sparrow serve: request {}{which}: prompt {prompt} tokens, cached {} ({hit:.1} %), generated {}, {}{error}, {secs:.2} s",
            self.id,
            f.cached_tokens,
            f.completion_tokens,
            f.reason.as_str(),
        )
    }

    /// The line for a tool call parsed from the answer: its function and arguments (JSON text).
    pub fn call(&self, name: &str, args: &str) {
        eprintln!("{}", self.call_line(name, args));
    }

    fn call_line(&self, name: &str, args: &str) -> String {
        let args = match self.level {
            0 | 1 => String::new(),
            2 if args.chars().count() > PARTIAL => {
                format!(" {}…", args.chars().take(PARTIAL).collect::<String>())
            }
            _ => format!(" {args}"),
        };
        format!("sparrow serve: request {}: tool call parsed: {name}{args}", self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::EndReason;

    #[test]
    fn lines_name_the_cache_hit_and_the_call() {
        let f = Finish {
            reason: EndReason::Stop,
            matched: None,
            completion_tokens: 57,
            cached_tokens: 11_200,
            storage_cached_tokens: 0,
            spec: Default::default(),
            error: None,
            overloaded: false,
        };
        let t = LogTag { id: 12, level: 2 };
        assert_eq!(
            t.done_line(0, 11_754, &f, 12.304),
            "sparrow serve: request 12: prompt 11754 tokens, cached 11200 (95.3 %), generated 57, stop, 12.30 s"
        );
        assert_eq!(t.call_line("Write", "{\"a\":1}"), "sparrow serve: request 12: tool call parsed: Write {\"a\":1}");
        let long = "x".repeat(3000);
        assert_eq!(
            t.call_line("f", &long).chars().count(),
            "sparrow serve: request 12: tool call parsed: f ".len() + 2049
        );
        assert_eq!(LogTag { id: 1, level: 0 }.call_line("f", "{}"), "sparrow serve: request 1: tool call parsed: f");
    }
}
