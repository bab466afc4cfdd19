//! Weight formats as stored in files: GGML blocks ([`ggml`], repacked at their file's size by
//! [`qmatrix`]) and ModelOpt NVFP4 ([`nvfp4`]), with their codecs and the layouts the kernels
//! run on; a GGUF file's index ([`gguf`]).

pub mod acts;
pub mod ggml;
pub mod gguf;
pub mod nvfp4;
pub mod qmatrix;
