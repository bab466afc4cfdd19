//! Model files: the one place they are opened and mapped. [`hf`] reads a Hugging Face
//! checkpoint directory (config.json, sharded safetensors, ModelOpt NVFP4; [`mxfp4`]: gpt-oss's
//! packed MXFP4 experts), [`gguf`] a GGUF file.

pub mod gguf;
pub mod hf;
pub mod mxfp4;
