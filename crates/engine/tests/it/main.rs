//! `sparrow-engine`'s integration tests in one binary (one link, not one per file), one module per
//! area, each with its own doc.
//! Tests that need checkpoints written by `sparrow-convert` (the HF loader, GLM-5 against
//! transformers and past one key block) live in that crate's tests: the engine does not depend on it.

mod batch_invariance;
mod bert_gguf;
mod deepseek2;
mod engine_thread;
mod families;
mod formats;
mod gemma3_golden;
mod gguf_dequant;
mod golden;
mod hf_twins;
mod hybrid;
mod hybrid_twins;
mod logprobs_golden;
mod moe_families;
mod moe_tensors;
mod nemotron_h;
mod scheduler_props;
