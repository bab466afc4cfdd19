//! Why a server died: a verdict from its log, its exit status and the memory evidence.
//!
//! The order of the tests matters and follows what each piece of evidence proves:
//! 1. `oom_kill` rose in the cgroup's `memory.events` during the step: the kernel killed it
//!    (`oom-killed`), whatever the log says after.
//! 2. The log names an allocation failure (CUDA/HIP OOM, `torch.OutOfMemoryError`,
//!    `MemoryError`, `std::bad_alloc`, Rust's `memory allocation of N bytes failed`):
//!    `out-of-memory`.
//! 3. The log shows a defect: a Python traceback (quoted by its innermost frame and its
//!    exception line), a Rust panic (its `panicked at` location), a failed assertion, a
//!    segfault report; or the process died of SIGSEGV/SIGBUS/SIGILL/SIGFPE/SIGABRT: `defect`.
//!    SGLang kills its own process tree with SIGKILL after a scheduler exception, so a
//!    traceback outranks a bare SIGKILL.
//! 4. SIGKILL with the RSS at the limit: `oom-killed` (no kernel record to read).
//! 5. Otherwise `exited`, with the status.
//!
//! Every verdict states the memory figures both ways ("peak RSS 4.1 GiB of 24 GiB").

use serde::{Deserialize, Serialize};

use crate::monitor::MemEvidence;
use crate::server::{signal_name, strip_prefix, ExitInfo};

/// The verdict kinds of a step (`summary.json` `verdict`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VerdictKind {
    /// The server stayed up.
    Ok,
    /// Killed by the kernel's (or cgroup's) OOM killer.
    OomKilled,
    /// The server reported an allocation failure.
    OutOfMemory,
    /// A bug: exception, panic, assertion, fatal signal.
    Defect,
    /// Alive but silent for `--hang-timeout`.
    Hang,
    /// Ended for no reason the log or the kernel gives.
    Exited,
}

impl VerdictKind {
    /// As written in the report: `ok`, `oom-killed`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            VerdictKind::Ok => "ok",
            VerdictKind::OomKilled => "oom-killed",
            VerdictKind::OutOfMemory => "out-of-memory",
            VerdictKind::Defect => "defect",
            VerdictKind::Hang => "hang",
            VerdictKind::Exited => "exited",
        }
    }
}

/// A log line quoted as evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogQuote {
    /// 1-based line number in the server log file.
    pub line: usize,
    /// The line, as the server wrote it.
    pub text: String,
}

/// A verdict with its evidence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// The kind.
    pub kind: VerdictKind,
    /// One sentence: what happened and the evidence both ways.
    pub evidence: String,
    /// The first error line of the log, when one proves the verdict.
    pub quote: Option<LogQuote>,
    /// Exception or panic type (`AttributeError`, `panic`), when known.
    pub error_type: Option<String>,
    /// Source location the error names (`file.py:123 in f`, `src/x.rs:12:5`).
    pub location: Option<String>,
    /// Further quoted lines (the innermost frame of a traceback, a panic's message).
    pub context: Vec<LogQuote>,
}

impl Verdict {
    /// A verdict with only a sentence of evidence.
    pub fn plain(kind: VerdictKind, evidence: impl Into<String>) -> Self {
        Verdict { kind, evidence: evidence.into(), quote: None, error_type: None, location: None, context: vec![] }
    }
}

/// What the log shows, found by [`scan_log`].
#[derive(Debug, Clone, PartialEq)]
pub struct LogFinding {
    /// Allocation failure (true) or defect (false).
    pub oom: bool,
    /// The first error line.
    pub quote: LogQuote,
    /// Exception or panic type.
    pub error_type: Option<String>,
    /// Source location.
    pub location: Option<String>,
    /// Further lines.
    pub context: Vec<LogQuote>,
}

const OOM_MARKERS: &[&str] = &[
    "CUDA out of memory",
    "HIP out of memory",
    "OutOfMemoryError",
    "cudaErrorMemoryAllocation",
    "hipErrorOutOfMemory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "std::bad_alloc",
    "Cannot allocate memory",
];

fn is_oom_text(t: &str) -> bool {
    is_strong_oom_text(t) || is_weak_oom_text(t)
}

/// "... out of memory ..." on a line that also says error or failed.
fn is_weak_oom_text(t: &str) -> bool {
    let lower = t.to_ascii_lowercase();
    lower.contains("out of memory") && (lower.contains("error") || lower.contains("failed"))
}

fn is_strong_oom_text(t: &str) -> bool {
    if OOM_MARKERS.iter().any(|m| t.contains(m)) {
        return true;
    }
    // Rust's alloc error handler: "memory allocation of 268435456 bytes failed".
    if let Some(rest) = t.split("memory allocation of ").nth(1) {
        if rest.split_whitespace().next().is_some_and(|n| n.parse::<u64>().is_ok()) && rest.contains("bytes failed") {
            return true;
        }
    }
    // Python's MemoryError as an exception line.
    t.trim_start().starts_with("MemoryError")
}

/// An exception line of a Python traceback: `Type: message` or a bare `Type`, not indented.
fn exception_type(line: &str) -> Option<String> {
    if line.starts_with(char::is_whitespace) || line.is_empty() {
        return None;
    }
    let head = line.split(':').next().unwrap_or(line).trim();
    let ok = !head.is_empty()
        && head.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && head.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    ok.then(|| head.to_owned())
}

/// `File "x.py", line 12, in f` → `x.py:12 in f`.
fn frame_location(line: &str) -> Option<String> {
    let rest = line.trim_start().strip_prefix("File \"")?;
    let (file, rest) = rest.split_once('"')?;
    let rest = rest.trim_start_matches(',').trim();
    let lineno = rest.strip_prefix("line ")?.split(',').next()?.trim();
    let func = rest.split_once(", in ").map(|(_, f)| f.trim());
    Some(match func {
        Some(f) => format!("{file}:{lineno} in {f}"),
        None => format!("{file}:{lineno}"),
    })
}

/// A Python traceback starting at `lines[start]` (the `Traceback` line): the innermost frame
/// and the exception line.
fn python_traceback(lines: &[(usize, &str)], start: usize) -> LogFinding {
    let mut innermost: Option<(usize, &str)> = None;
    let mut exc: Option<(usize, &str)> = None;
    for &(n, l) in &lines[start + 1..] {
        if l.trim_start().starts_with("File \"") {
            innermost = Some((n, l));
            continue;
        }
        if l.starts_with(char::is_whitespace) || l.trim().is_empty() {
            continue;
        }
        // Other processes' lines (an access log, another rank) can land inside a traceback;
        // the exception line is the first that reads `Type: message` or `Type`.
        if exception_type(l).is_some() {
            exc = Some((n, l));
            break;
        }
    }
    let (tb_n, tb_l) = lines[start];
    let error_type = exc.and_then(|(_, l)| exception_type(l));
    let oom = exc.is_some_and(|(_, l)| is_oom_text(l));
    let mut context = vec![LogQuote { line: tb_n, text: tb_l.to_owned() }];
    if let Some((n, l)) = innermost {
        context.push(LogQuote { line: n, text: l.to_owned() });
    }
    LogFinding {
        oom,
        quote: exc
            .map_or(LogQuote { line: tb_n, text: tb_l.to_owned() }, |(n, l)| LogQuote { line: n, text: l.to_owned() }),
        error_type,
        location: innermost.and_then(|(_, l)| frame_location(l)),
        context,
    }
}

/// A Rust panic: `thread 'x' panicked at src/f.rs:1:2:` + message line (Rust ≥ 1.73), or
/// `thread 'x' panicked at 'message', src/f.rs:1:2` (older).
fn rust_panic(lines: &[(usize, &str)], i: usize) -> Option<LogFinding> {
    let (n, l) = lines[i];
    let at = l.split(" panicked at ").nth(1)?;
    let (location, msg) = if let Some(q) = at.strip_prefix('\'') {
        let (msg, loc) = q.rsplit_once("', ")?;
        (loc.trim().to_owned(), Some(LogQuote { line: n, text: msg.to_owned() }))
    } else {
        let loc = at.trim().trim_end_matches(':').to_owned();
        (loc, lines.get(i + 1).map(|&(m, t)| LogQuote { line: m, text: t.to_owned() }))
    };
    let oom = msg.as_ref().is_some_and(|m| is_oom_text(&m.text));
    Some(LogFinding {
        oom,
        quote: LogQuote { line: n, text: l.to_owned() },
        error_type: Some("panic".into()),
        location: Some(location),
        context: msg.into_iter().collect(),
    })
}

const DEFECT_MARKERS: &[(&str, &str)] = &[
    ("Segmentation fault", "segfault"),
    ("SIGSEGV", "segfault"),
    ("Fatal Python error", "fatal Python error"),
    ("Assertion `", "assertion"),
    ("GGML_ASSERT", "assertion"),
    ("terminate called after throwing", "C++ exception"),
    ("illegal memory access", "CUDA illegal memory access"),
    ("double free", "heap corruption"),
    ("free(): invalid", "heap corruption"),
    ("core dumped", "core dump"),
];

/// Finds the first error line in `lines` (1-based line numbers with the server's own text).
/// Tracebacks, panics and the markers of allocation failures and fatal errors come first; a
/// line that merely says "out of memory" next to "error" counts only when none is found.
pub fn scan_log(lines: &[(usize, &str)]) -> Option<LogFinding> {
    scan_strong(lines).or_else(|| {
        lines.iter().find(|(_, l)| is_weak_oom_text(l)).map(|&(n, l)| LogFinding {
            oom: true,
            quote: LogQuote { line: n, text: l.to_owned() },
            error_type: None,
            location: None,
            context: vec![],
        })
    })
}

fn scan_strong(lines: &[(usize, &str)]) -> Option<LogFinding> {
    for (i, &(n, l)) in lines.iter().enumerate() {
        if l.contains("Traceback (most recent call last):") {
            return Some(python_traceback(lines, i));
        }
        if l.contains(" panicked at ") {
            if let Some(f) = rust_panic(lines, i) {
                return Some(f);
            }
        }
        if is_strong_oom_text(l) {
            return Some(LogFinding {
                oom: true,
                quote: LogQuote { line: n, text: l.to_owned() },
                error_type: None,
                location: None,
                context: vec![],
            });
        }
        if let Some((_, kind)) = DEFECT_MARKERS.iter().find(|(m, _)| l.contains(m)) {
            return Some(LogFinding {
                oom: l.contains("bad_alloc"),
                quote: LogQuote { line: n, text: l.to_owned() },
                error_type: Some((*kind).to_owned()),
                location: None,
                context: vec![],
            });
        }
    }
    None
}

/// The last line that reports an error in words (`error: ...`, `Error: ...`, `... ERROR ...`,
/// `fatal: ...`): what a server that refuses its flags or its model prints before it exits.
pub fn last_error_line(lines: &[(usize, &str)]) -> Option<LogQuote> {
    lines
        .iter()
        .rev()
        .find(|(_, l)| {
            let t = l.trim_start();
            let lower = t.to_ascii_lowercase();
            lower.starts_with("error")
                || lower.starts_with("fatal")
                || t.contains(" ERROR ")
                || lower.contains(": error:")
                // What a shell says when the command line itself is wrong.
                || t.ends_with(": not found")
                || t.ends_with("No such file or directory")
                || t.ends_with("Permission denied")
        })
        .map(|&(n, l)| LogQuote { line: n, text: l.to_owned() })
}

/// The server's lines of a log file written by [`crate::server::Server`], numbered as in the
/// file, from line `from` (1-based) on.
pub fn log_lines(text: &str, from: usize) -> Vec<(usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(n, _)| *n >= from)
        .filter_map(|(n, l)| strip_prefix(l).map(|t| (n, t)))
        .collect()
}

const FATAL_SIGNALS: &[i32] = &[4, 6, 7, 8, 11]; // SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGSEGV

/// Judges a server that died: `log` is the whole log file, `from` the first line of the
/// crashed step. Only the step's lines decide: an error the server printed and survived in an
/// earlier step does not explain this death (it is named in the evidence, though).
pub fn classify_death(log: &str, from: usize, exit: ExitInfo, mem: &MemEvidence) -> Verdict {
    let lines = log_lines(log, from);
    let finding = scan_log(&lines);
    let earlier = if finding.is_none() && from > 1 {
        scan_log(&log_lines(log, 1).into_iter().filter(|(n, _)| *n < from).collect::<Vec<_>>())
            .map(|f| format!("; before this step, line {}: {}", f.quote.line, f.quote.text))
            .unwrap_or_default()
    } else {
        String::new()
    };
    let status = exit.describe();
    let memory = format!("{}{earlier}", mem.describe());
    let not_memory = if mem.at_limit() { "memory at the limit" } else { "not memory" };
    let sig = exit.effective_signal();
    let with = |kind: VerdictKind, evidence: String, f: Option<&LogFinding>| Verdict {
        kind,
        evidence,
        quote: f.map(|f| f.quote.clone()),
        error_type: f.and_then(|f| f.error_type.clone()),
        location: f.and_then(|f| f.location.clone()),
        context: f.map(|f| f.context.clone()).unwrap_or_default(),
    };
    if mem.oom_kills() > 0 {
        return with(VerdictKind::OomKilled, format!("{status}; the OOM killer acted: {memory}"), finding.as_ref());
    }
    if let Some(f) = finding.as_ref().filter(|f| f.oom) {
        return with(
            VerdictKind::OutOfMemory,
            format!("{status}; the log reports an allocation failure at line {}: {memory}", f.quote.line),
            Some(f),
        );
    }
    if let Some(f) = finding.as_ref() {
        let what = f.error_type.clone().unwrap_or_else(|| "error".into());
        let at = f.location.as_ref().map(|l| format!(" at {l}")).unwrap_or_default();
        return with(
            VerdictKind::Defect,
            format!("{status}; {what}{at} (log line {}); {memory}: {not_memory}", f.quote.line),
            Some(f),
        );
    }
    if let Some(s) = sig.filter(|s| FATAL_SIGNALS.contains(s)) {
        return Verdict {
            error_type: Some(signal_name(s)),
            ..Verdict::plain(VerdictKind::Defect, format!("{status}, a fatal signal; the log names no error; {memory}"))
        };
    }
    if sig == Some(9) && mem.at_limit() {
        return Verdict::plain(VerdictKind::OomKilled, format!("{status} with memory at the limit: {memory}"));
    }
    if sig == Some(9) {
        return Verdict::plain(
            VerdictKind::Exited,
            format!("{status}; killed from outside (no OOM record, memory not at the limit); {memory}"),
        );
    }
    match last_error_line(&lines) {
        Some(q) => Verdict {
            evidence: format!("{status}; last error in the log (line {}): {}; {memory}", q.line, q.text),
            quote: Some(q),
            ..Verdict::plain(VerdictKind::Exited, "")
        },
        None => Verdict::plain(VerdictKind::Exited, format!("{status}; the log names no error; {memory}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_and_exception_parsing() {
        assert_eq!(
            frame_location(r#"  File "/x/sglang/srt/model_executor/forward_batch_info.py", line 512, in init_new"#),
            Some("/x/sglang/srt/model_executor/forward_batch_info.py:512 in init_new".into())
        );
        assert_eq!(exception_type("AttributeError: 'X' object has no attribute 'y'"), Some("AttributeError".into()));
        assert_eq!(
            exception_type("torch.OutOfMemoryError: CUDA out of memory."),
            Some("torch.OutOfMemoryError".into())
        );
        assert_eq!(exception_type("    return f(x)"), None);
        assert!(is_oom_text("memory allocation of 67108864 bytes failed"));
        assert!(!is_oom_text("memory allocation of many bytes failed"));
        assert!(!is_oom_text("Using --mem-fraction-static 0.8 to stay clear of memory limits"));
    }
}
