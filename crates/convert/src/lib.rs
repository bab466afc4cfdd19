//! Sparrow's offline tools, kept out of the serving engine: they use the engine's models and
//! checkpoint readers, never the other way round.
//!
//! - [`quantize`]: state dict -> NVFP4 / BF16 tensors -> sharded safetensors + index + ModelOpt
//!   quantization config (`sparrow quantize`, `sparrow gen-model`);
//! - [`gptq`]: GPTQ for NVFP4 (Frantar et al. 2022);
//! - [`calibration`]: the observer that collects input amax and GPTQ Hessians while a model runs
//!   calibration text;
//! - [`gguf_hf`]: a Llama GGUF file as an HF state dict;
//! - [`toy`]: `glm5-tiny`, a seeded GLM-5 (`glm_moe_dsa`) checkpoint for tests and benches;
//! - [`perplexity`]: next-token NLL over token sequences (`sparrow perplexity`).

pub mod calibration;
pub mod gguf_hf;
pub mod gptq;
pub mod perplexity;
pub mod quantize;
pub mod toy;
