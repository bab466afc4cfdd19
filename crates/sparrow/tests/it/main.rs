//! The `sparrow` binary's integration tests as one binary (one link instead of one per file);
//! one module per area, each with its own doc. The soak keeps a binary of its own
//! (`tests/soak.rs`): it loads the cores at a fraction of the capacity it measures first.

mod agent_apis;
mod architecture;
mod bench_datasets;
mod cli;
mod common;
mod embeddings;
mod fleet;
mod glm5;
mod hicache;
mod serve;
mod sweep;
mod sweep_tuning;
mod untrusted;
