//! Model files: the one place they are opened and mapped. [`hf`] reads a Hugging Face
//! checkpoint directory (config.json, sharded safetensors, ModelOpt NVFP4), [`gguf`] a GGUF file.

pub mod gguf;
pub mod hf;
