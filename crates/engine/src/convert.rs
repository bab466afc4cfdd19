//! Writing checkpoints: NVFP4 quantization of a state dict (what `sparrow quantize` and
//! `sparrow gen-model` share) and the Hugging Face directory layout (safetensors shards with
//! `model.safetensors.index.json`, `config.json`, the ModelOpt quantization config).
//!
//! Output format: see [`crate::nvfp4`] and [`crate::hf`]. `input_scale` is written as 1.0: we
//! have no calibration data, and the CPU kernels keep activations in f32 (weight-only
//! dequantization), so nothing reads it; a W4A4 GPU kernel would need a calibrated value.

use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use serde_json::{json, Value};

use crate::hf::f32_to_bf16;
use crate::nvfp4::{Nvfp4Matrix, ScaleRule, BLOCK};
use crate::EngineError;

fn merr(m: impl Into<String>) -> EngineError {
    EngineError::Model(m.into())
}

/// One tensor to write.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorOut {
    /// State-dict name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Little-endian bytes.
    pub data: Vec<u8>,
}

impl TensorOut {
    /// A BF16 tensor rounded from f32 (nearest, ties to even).
    pub fn bf16(name: &str, shape: Vec<usize>, v: &[f32]) -> Self {
        let data = v.iter().flat_map(|x| f32_to_bf16(*x).to_le_bytes()).collect();
        TensorOut { name: name.to_owned(), dtype: Dtype::BF16, shape, data }
    }

    /// An F32 tensor.
    pub fn f32(name: &str, shape: Vec<usize>, v: &[f32]) -> Self {
        let data = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        TensorOut { name: name.to_owned(), dtype: Dtype::F32, shape, data }
    }

    /// The four tensors of an NVFP4 linear layer `module` (`weight`, `weight_scale`,
    /// `weight_scale_2`, `input_scale`).
    ///
    /// # Errors
    /// When the matrix's rows do not share one `weight_scale_2` (a stacked matrix).
    pub fn nvfp4(module: &str, m: &Nvfp4Matrix) -> Result<Vec<Self>, EngineError> {
        let g = m.weight_scale_2.first().copied().unwrap_or(1.0);
        if m.weight_scale_2.iter().any(|&x| x != g) {
            return Err(merr(format!("{module}: rows with different weight_scale_2 cannot be one tensor")));
        }
        Ok(vec![
            TensorOut {
                name: format!("{module}.weight"),
                dtype: Dtype::U8,
                shape: vec![m.rows, m.cols / 2],
                data: m.weight.clone(),
            },
            TensorOut {
                name: format!("{module}.weight_scale"),
                dtype: Dtype::F8_E4M3,
                shape: vec![m.rows, m.cols / BLOCK],
                data: m.weight_scale.clone(),
            },
            TensorOut::f32(&format!("{module}.weight_scale_2"), vec![], &[g]),
            TensorOut::f32(&format!("{module}.input_scale"), vec![], &[1.0]),
        ])
    }
}

/// How the quantization config is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantStyle {
    /// `hf_quant_config.json` with `exclude_modules` (ModelOpt's own export).
    HfQuantConfig,
    /// `config.json` `quantization_config` with `ignore` (the form vLLM/SGLang also accept).
    ConfigJson,
}

/// A state-dict entry in f32 before conversion.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// State-dict name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Values.
    pub data: Vec<f32>,
}

/// Whether `module` matches one of the globs (SGLang's `is_layer_excluded` rule: `*` crosses
/// dots, the whole name must match).
pub fn matches_any(patterns: &[String], module: &str) -> bool {
    patterns.iter().any(|p| glob::Pattern::new(p).map_or(p == module, |g| g.matches(module)))
}

/// Quantizes every 2-D `*.weight` whose module is not excluded to NVFP4 (amax-based global
/// scale, block scales by `rule`, [`Nvfp4Matrix::quantize_with`]); everything else becomes BF16.
///
/// # Errors
/// A quantized weight whose column count is not a multiple of 16.
pub fn quantize_state_dict(
    tensors: &[Tensor],
    exclude: &[String],
    rule: ScaleRule,
) -> Result<Vec<TensorOut>, EngineError> {
    quantize_state_dict_gptq(tensors, exclude, rule, &|_| None, false)
}

/// [`quantize_state_dict`], but a module for which `hessian` returns calibration statistics
/// (`[cols × cols]`, see [`crate::gptq`]) is quantized with GPTQ instead of round-to-nearest
/// (in act order when `act_order`).
///
/// # Errors
/// As [`quantize_state_dict`], plus a GPTQ failure, named.
pub fn quantize_state_dict_gptq(
    tensors: &[Tensor],
    exclude: &[String],
    rule: ScaleRule,
    hessian: &(dyn Fn(&str) -> Option<Vec<f64>> + Sync),
    act_order: bool,
) -> Result<Vec<TensorOut>, EngineError> {
    // Modules are independent: quantize them on all cores, then restore the input order.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(tensors.len().max(1));
    let one = |t: &Tensor| -> Result<Vec<TensorOut>, EngineError> {
        let module = t.name.strip_suffix(".weight");
        match module {
            Some(m) if t.shape.len() == 2 && !matches_any(exclude, m) => {
                let (rows, cols) = (t.shape[0], t.shape[1]);
                if !cols.is_multiple_of(BLOCK) {
                    return Err(merr(format!(
                        "{}: {cols} input features is not a multiple of {BLOCK}; exclude it from quantization",
                        t.name
                    )));
                }
                let q = match hessian(m) {
                    Some(h) => crate::gptq::gptq_nvfp4_with(&t.data, rows, cols, &h, crate::gptq::DAMP, act_order)
                        .map_err(|e| merr(format!("{}: GPTQ: {e}", t.name)))?,
                    None => Nvfp4Matrix::quantize_with(&t.data, rows, cols, rule),
                };
                TensorOut::nvfp4(m, &q)
            }
            _ => Ok(vec![TensorOut::bf16(&t.name, t.shape.clone(), &t.data)]),
        }
    };
    let mut parts: Vec<(usize, Result<Vec<TensorOut>, EngineError>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|w| {
                let one = &one;
                s.spawn(move || {
                    tensors.iter().enumerate().skip(w).step_by(threads).map(|(i, t)| (i, one(t))).collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    });
    if parts.len() != tensors.len() {
        return Err(merr("a quantization worker panicked"));
    }
    parts.sort_by_key(|p| p.0);
    let mut out = Vec::new();
    for (_, p) in parts {
        out.extend(p?);
    }
    Ok(out)
}

/// Writes `tensors` into `dir` as `shards` safetensors files (`model.safetensors` when 1, else
/// `model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json`), `config.json`, and
/// the quantization config in `style` when `exclude` is `Some`.
///
/// # Errors
/// I/O errors, named.
pub fn write_checkpoint(
    dir: &Path,
    mut config: Value,
    tensors: &[TensorOut],
    shards: usize,
    exclude: Option<(&[String], QuantStyle)>,
) -> Result<(), EngineError> {
    std::fs::create_dir_all(dir).map_err(|e| merr(format!("{}: {e}", dir.display())))?;
    let shards = shards.clamp(1, tensors.len().max(1));
    let total: usize = tensors.iter().map(|t| t.data.len()).sum();
    let per = total.div_ceil(shards).max(1);
    let mut groups: Vec<Vec<&TensorOut>> = vec![Vec::new()];
    let mut acc = 0;
    for t in tensors {
        if acc >= per && groups.len() < shards {
            groups.push(Vec::new());
            acc = 0;
        }
        acc += t.data.len();
        if let Some(g) = groups.last_mut() {
            g.push(t);
        }
    }
    let n = groups.len();
    let mut weight_map = serde_json::Map::new();
    for (i, g) in groups.iter().enumerate() {
        let file =
            if n == 1 { "model.safetensors".to_owned() } else { format!("model-{:05}-of-{n:05}.safetensors", i + 1) };
        let mut views = Vec::with_capacity(g.len());
        for t in g {
            let v = TensorView::new(t.dtype, t.shape.clone(), &t.data).map_err(|e| merr(format!("{}: {e}", t.name)))?;
            views.push((t.name.clone(), v));
            weight_map.insert(t.name.clone(), Value::String(file.clone()));
        }
        let path = dir.join(&file);
        safetensors::serialize_to_file(views, None, &path).map_err(|e| merr(format!("{}: {e}", path.display())))?;
    }
    if n > 1 {
        let idx = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        write_json(&dir.join("model.safetensors.index.json"), &idx)?;
    }
    if let Some((ex, style)) = exclude {
        match style {
            QuantStyle::HfQuantConfig => {
                let q = json!({
                    "producer": {"name": "sparrow", "version": env!("CARGO_PKG_VERSION")},
                    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": BLOCK, "exclude_modules": ex}
                });
                write_json(&dir.join("hf_quant_config.json"), &q)?;
            }
            QuantStyle::ConfigJson => {
                config["quantization_config"] = json!({
                    "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": BLOCK, "ignore": ex
                });
            }
        }
    }
    write_json(&dir.join("config.json"), &config)
}

/// Writes pretty JSON.
///
/// # Errors
/// I/O errors, named.
pub fn write_json(path: &Path, v: &Value) -> Result<(), EngineError> {
    let s = serde_json::to_string_pretty(v).map_err(|e| merr(format!("{}: {e}", path.display())))?;
    std::fs::write(path, s + "\n").map_err(|e| merr(format!("{}: {e}", path.display())))
}
