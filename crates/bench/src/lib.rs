//! `sparrow bench`: a drop-in for `python -m sglang.bench_serving` whose figures can be trusted
//! and whose results survive a dying server.
//!
//! - [`args`]: SGLang's flags, validated into a [`args::BenchConfig`].
//! - [`dataset`]: prompt sets (ShareGPT, random, random-ids, generated-shared-prefix, custom,
//!   openai, mooncake).
//! - [`arrivals`]: arrival times (Poisson / gamma burstiness) on absolute offsets.
//! - [`client`]: one request per backend dialect, streamed chunk by chunk, failures classified.
//! - [`record`]: what was observed of one request; [`metrics`]: the math over records;
//!   [`report`]: SGLang's printed block and JSONL line.
//! - [`run`]: the whole run: warmup, timed run, health watch, signals, details file.
//! - [`merge`]: one report from the records files of several clients (`sparrow bench merge`).
//! - [`mock`]: a scripted server for tests and for measuring the client itself.
//!
//! ```text
//! flags -> args (BenchConfig) -> run: ready check, warmup -> dataset (prompts) -> client bodies
//!       -> arrivals -> one task per request: client (send, read SSE) -> record
//!       -> collector (details file) -> metrics -> report (block, JSONL line)
//! ```

/// `println!` to stdout that ignores a closed pipe (`sparrow bench ... | head`): the std macro
/// panics on `EPIPE`, which would end the run before its results are saved.
#[macro_export]
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

/// `print!` to stdout that ignores a closed pipe (see [`outln!`]).
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let mut o = std::io::stdout();
        let _ = write!(o, $($t)*);
        let _ = o.flush();
    }};
}

/// `eprintln!` that ignores a closed stderr (see [`outln!`]).
#[macro_export]
macro_rules! errln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

pub mod args;
pub mod arrivals;
pub mod client;
pub mod dataset;
pub mod merge;
pub mod metrics;
pub mod mock;
pub mod record;
pub mod report;
pub mod run;
