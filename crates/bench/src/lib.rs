//! `sparrow bench`: a drop-in for `python -m sglang.bench_serving` whose figures can be trusted
//! and whose results survive a dying server.
//!
//! - [`args`]: SGLang's flags, validated into a [`args::BenchConfig`].
//! - [`dataset`]: prompt sets (ShareGPT, random, random-ids, generated-shared-prefix, custom).
//! - [`schedule`]: arrival times (Poisson / gamma burstiness) on absolute offsets.
//! - [`client`]: one request per backend dialect, streamed chunk by chunk, failures classified.
//! - [`record`]: what was observed of one request; [`metrics`]: the math over records;
//!   [`report`]: SGLang's printed block and JSONL line.
//! - [`run`]: the whole run: warmup, timed run, health watch, signals, details file.
//! - [`mock`]: a scripted server for tests and for measuring the client itself.

pub mod args;
pub mod client;
pub mod dataset;
pub mod metrics;
pub mod mock;
pub mod record;
pub mod report;
pub mod run;
pub mod schedule;
