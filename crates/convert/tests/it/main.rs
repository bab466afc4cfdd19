//! `sparrow-convert`'s integration tests in one binary (one link, not one per file), one module per
//! area, each with its own doc.
//! Checkpoints written here are loaded back by the engine: the HF / ModelOpt NVFP4 loader on
//! hand-made checkpoints, glm5-tiny against HF transformers' goldens and past one key block.

mod glm5_golden;
mod glm5_long_context;
mod hf_loader;
