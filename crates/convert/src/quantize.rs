//! Writing checkpoints: NVFP4 quantization of a state dict (what `sparrow quantize` and
//! `sparrow gen-model` share) and the Hugging Face directory layout (safetensors shards with
//! `model.safetensors.index.json`, `config.json`, the ModelOpt quantization config).
//!
//! Output format: see [`sparrow_cpu::format::nvfp4`] and [`sparrow_engine::checkpoint::hf`], made to be served by other engines
//! too: layers that vLLM and SGLang fuse (q/k/v, gate/up, q_a/kv_a) share one `weight_scale_2`
//! from their joint amax, as ModelOpt's export does; `input_scale` is ModelOpt's
//! `amax(input) / (6 · 448)` from a calibration run when one was made (our CPU kernels keep
//! activations in f32 and never read it), else 1.0 with a warning from the caller.

use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use serde_json::{json, Value};

use sparrow_cpu::format::nvfp4::{Nvfp4Matrix, ScaleRule, BLOCK};
use sparrow_cpu::half::f32_to_bf16;
use sparrow_engine::EngineError;

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
    pub fn nvfp4(module: &str, m: &Nvfp4Matrix, input_scale: f32) -> Result<Vec<Self>, EngineError> {
        let g = m.weight_scale_2.first().copied().unwrap_or(1.0);
        if m.weight_scale_2.iter().any(|&x| x != g) {
            return Err(EngineError::model(format!(
                "{module}: rows with different weight_scale_2 cannot be one tensor"
            )));
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
            TensorOut::f32(&format!("{module}.input_scale"), vec![], &[input_scale]),
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
    /// Written as F32 when not quantized (routers and their bias, which HF keeps in f32, or a
    /// tensor that was F32 in the source); otherwise BF16.
    pub keep_f32: bool,
}

impl Tensor {
    /// A tensor written as BF16 unless quantized.
    pub fn new(name: impl Into<String>, shape: Vec<usize>, data: Vec<f32>) -> Self {
        Tensor { name: name.into(), shape, data, keep_f32: false }
    }
}

/// The group of layers a serving engine fuses into one GEMM, which must share `weight_scale_2`:
/// `…self_attn.{q,k,v}_proj`, `…self_attn.{q_a_proj,kv_a_proj_with_mqa}` (SGLang's
/// `fused_qkv_a_proj_with_mqa`), and every `…{gate,up}_proj` pair (MLPs, each expert, shared
/// experts). Other modules are their own group.
pub fn fusion_group(module: &str) -> String {
    let (parent, leaf) = module.rsplit_once('.').unwrap_or(("", module));
    let g = match leaf {
        "q_proj" | "k_proj" | "v_proj" => "qkv_proj",
        "q_a_proj" | "kv_a_proj_with_mqa" => "qkv_a_proj",
        "gate_proj" | "up_proj" => "gate_up_proj",
        _ => return module.to_owned(),
    };
    format!("{parent}.{g}")
}

/// Calibration and rounding options of [`quantize_state_dict_with`].
pub struct QuantOptions<'a> {
    /// Block-scale rule.
    pub rule: ScaleRule,
    /// GPTQ statistics of a module's input (`[cols × cols]`); `None`: round to nearest.
    pub hessian: &'a (dyn Fn(&str) -> Option<Vec<f64>> + Sync),
    /// Largest |input| seen by a module during calibration; `None`: `input_scale` 1.0.
    pub input_amax: &'a (dyn Fn(&str) -> Option<f32> + Sync),
    /// GPTQ in act order.
    pub act_order: bool,
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
    let opts = QuantOptions { rule, hessian: &|_| None, input_amax: &|_| None, act_order: false };
    quantize_state_dict_with(tensors, exclude, &opts)
}

/// [`quantize_state_dict`] with calibration: a module for which `opts.hessian` returns
/// statistics is quantized with GPTQ ([`crate::gptq`]), and `input_scale` comes from
/// `opts.input_amax`.
///
/// # Errors
/// As [`quantize_state_dict`], plus a GPTQ failure, named.
pub fn quantize_state_dict_with(
    tensors: &[Tensor],
    exclude: &[String],
    opts: &QuantOptions<'_>,
) -> Result<Vec<TensorOut>, EngineError> {
    let quantized = |t: &Tensor| -> Option<String> {
        let m = t.name.strip_suffix(".weight")?;
        (t.shape.len() == 2 && !matches_any(exclude, m)).then(|| m.to_owned())
    };
    // One tensor scale per fusion group, from the group's joint amax.
    let mut group_amax: std::collections::HashMap<String, f32> = Default::default();
    for t in tensors {
        if let Some(m) = quantized(t) {
            let a = group_amax.entry(fusion_group(&m)).or_insert(0.0);
            *a = a.max(sparrow_cpu::format::nvfp4::amax(&t.data));
        }
    }
    let (rule, act_order) = (opts.rule, opts.act_order);
    // Modules are independent: quantize them on all cores, then restore the input order.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(tensors.len().max(1));
    let one = |t: &Tensor| -> Result<Vec<TensorOut>, EngineError> {
        match quantized(t) {
            Some(m) => {
                let m = m.as_str();
                let global =
                    sparrow_cpu::format::nvfp4::global_scale(group_amax.get(&fusion_group(m)).copied().unwrap_or(0.0));
                let (rows, cols) = (t.shape[0], t.shape[1]);
                if !cols.is_multiple_of(BLOCK) {
                    return Err(EngineError::model(format!(
                        "{}: {cols} input features is not a multiple of {BLOCK}; exclude it from quantization",
                        t.name
                    )));
                }
                let q = match (opts.hessian)(m) {
                    Some(h) => crate::gptq::gptq_nvfp4_with(
                        &t.data,
                        rows,
                        cols,
                        &h,
                        crate::gptq::DAMP,
                        act_order,
                        Some(global),
                    )
                    .map_err(|e| EngineError::model(format!("{}: GPTQ: {e}", t.name)))?,
                    None => Nvfp4Matrix::quantize_global(&t.data, rows, cols, rule, global),
                };
                let input_scale =
                    (opts.input_amax)(m).filter(|a| *a > 0.0).map_or(1.0, sparrow_cpu::format::nvfp4::global_scale);
                TensorOut::nvfp4(m, &q, input_scale)
            }
            None if t.keep_f32 => Ok(vec![TensorOut::f32(&t.name, t.shape.clone(), &t.data)]),
            None => Ok(vec![TensorOut::bf16(&t.name, t.shape.clone(), &t.data)]),
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
        return Err(EngineError::model("a quantization worker panicked"));
    }
    parts.sort_by_key(|p| p.0);
    let mut out = Vec::new();
    for (_, p) in parts {
        out.extend(p?);
    }
    Ok(out)
}

/// Writes `tensors` into `dir` as up to `shards` safetensors files (`model.safetensors` when 1,
/// else `model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json`), `config.json`,
/// and the quantization config in `style` when `exclude` is `Some`. Weight files and
/// quantization configs already in `dir` are removed first (as `save_pretrained` drops stale
/// shards), so a reused directory cannot mix two checkpoints. Returns the shard count written.
///
/// # Errors
/// I/O errors, named.
pub fn write_checkpoint(
    dir: &Path,
    mut config: Value,
    tensors: &[TensorOut],
    shards: usize,
    exclude: Option<(&[String], QuantStyle)>,
) -> Result<usize, EngineError> {
    std::fs::create_dir_all(dir).map_err(|e| EngineError::model(format!("{}: {e}", dir.display())))?;
    for e in std::fs::read_dir(dir).map_err(|e| EngineError::model(format!("{}: {e}", dir.display())))?.flatten() {
        let p = e.path();
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name.ends_with(".safetensors") || name == "model.safetensors.index.json" || name == "hf_quant_config.json" {
            std::fs::remove_file(&p).map_err(|e| EngineError::model(format!("{}: {e}", p.display())))?;
        }
    }
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
            let v = TensorView::new(t.dtype, t.shape.clone(), &t.data)
                .map_err(|e| EngineError::model(format!("{}: {e}", t.name)))?;
            views.push((t.name.clone(), v));
            weight_map.insert(t.name.clone(), Value::String(file.clone()));
        }
        let path = dir.join(&file);
        safetensors::serialize_to_file(views, None, &path)
            .map_err(|e| EngineError::model(format!("{}: {e}", path.display())))?;
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
    write_json(&dir.join("config.json"), &config)?;
    Ok(n)
}

/// Writes pretty JSON.
///
/// # Errors
/// I/O errors, named.
pub fn write_json(path: &Path, v: &Value) -> Result<(), EngineError> {
    let s = serde_json::to_string_pretty(v).map_err(|e| EngineError::model(format!("{}: {e}", path.display())))?;
    std::fs::write(path, s + "\n").map_err(|e| EngineError::model(format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scale2(out: &[TensorOut], module: &str) -> f32 {
        let t = out.iter().find(|t| t.name == format!("{module}.weight_scale_2")).expect("scale");
        f32::from_le_bytes([t.data[0], t.data[1], t.data[2], t.data[3]])
    }

    /// Siblings that serving engines fuse share one tensor scale from their joint amax; other
    /// layers keep their own. Routers flagged `keep_f32` stay F32.
    #[test]
    fn fused_siblings_share_weight_scale_2() {
        let lin = |name: &str, amax: f32| {
            let mut d = vec![0.01f32; 16 * 16];
            d[3] = amax;
            Tensor::new(format!("{name}.weight"), vec![16, 16], d)
        };
        let sd = vec![
            lin("m.layers.0.self_attn.q_proj", 1.0),
            lin("m.layers.0.self_attn.k_proj", 4.0),
            lin("m.layers.0.self_attn.v_proj", 0.5),
            lin("m.layers.0.self_attn.o_proj", 2.0),
            lin("m.layers.0.mlp.experts.3.gate_proj", 3.0),
            lin("m.layers.0.mlp.experts.3.up_proj", 6.0),
            lin("m.layers.0.mlp.experts.4.up_proj", 1.5),
            Tensor { keep_f32: true, ..lin("m.layers.0.mlp.gate", 1.0) },
        ];
        let out = quantize_state_dict(&sd, &["*.mlp.gate".to_owned()], ScaleRule::Amax).expect("quantize");
        let g = |a: f32| a / (6.0 * 448.0);
        for m in ["q_proj", "k_proj", "v_proj"] {
            assert_eq!(scale2(&out, &format!("m.layers.0.self_attn.{m}")), g(4.0), "{m}");
        }
        assert_eq!(scale2(&out, "m.layers.0.self_attn.o_proj"), g(2.0));
        assert_eq!(scale2(&out, "m.layers.0.mlp.experts.3.gate_proj"), g(6.0));
        assert_eq!(scale2(&out, "m.layers.0.mlp.experts.3.up_proj"), g(6.0));
        assert_eq!(scale2(&out, "m.layers.0.mlp.experts.4.up_proj"), g(1.5), "another expert is another group");
        let router = out.iter().find(|t| t.name == "m.layers.0.mlp.gate.weight").expect("router");
        assert_eq!(router.dtype, Dtype::F32);
        assert_eq!(fusion_group("a.self_attn.kv_a_proj_with_mqa"), "a.self_attn.qkv_a_proj");
    }
}
