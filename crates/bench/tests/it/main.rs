//! `sparrow-bench`'s integration tests in one binary (one link, not one per file), one module per
//! area, each with its own doc.

mod bench;
mod keepalive;
mod multi_client;
mod report;
mod sglang_parity;
mod wire_bytes;
