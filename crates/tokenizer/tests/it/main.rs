//! `sparrow-tokenizer`'s integration tests in one binary (one link, not one per file), one module per
//! area, each with its own doc.

mod gemma3;
mod gguf;
mod hf_json;
mod o200k;
mod templates;
mod vocab_vectors;
