//! `sparrow-server`'s integration tests in one binary (one link, not one per file), one module per
//! area, each with its own doc.
//! `tests/hardening.rs` keeps a binary of its own: its timeouts are a second or less and one
//! test opens 4,000 sockets, so it must not share the cores with the model-running tests here.

mod agent_apis;
mod cases;
mod common;
mod embeddings;
mod logprobs;
mod queue;
mod snapshots;
mod speculative;
mod structured;
mod tool_detect;
mod tools;
