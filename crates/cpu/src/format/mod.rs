//! Weight formats as stored in files: GGML blocks ([`ggml`]) and ModelOpt NVFP4 ([`nvfp4`]),
//! with their codecs and the layouts the kernels run on.

pub mod ggml;
pub mod nvfp4;
