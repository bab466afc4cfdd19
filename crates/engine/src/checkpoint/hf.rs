//! Hugging Face checkpoint directories: `config.json`, safetensors weights (one file or shards
//! named by `model.safetensors.index.json`), and the NVIDIA ModelOpt NVFP4 quantization config.
//!
//! The quantization config comes in two styles, both read by SGLang's `ModelOptFp4Config`
//! (`python/sglang/srt/layers/quantization/modelopt_quant.py`):
//! - `hf_quant_config.json`: `{"quantization": {"quant_algo": "NVFP4", "group_size": 16,
//!   "exclude_modules": [...]}}`;
//! - `config.json`: `"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4",
//!   "group_size": 16, "ignore": [...]}` (some exports spell the list `exclude_modules`).
//!
//! Patterns are globs over module names (`lm_head`, `model.layers.*.self_attn*`); `*` crosses
//! dots, as SGLang's `is_layer_excluded` turns it into `.*` and matches the whole name.
//! A linear layer is NVFP4 when the checkpoint holds `weight_scale` next to its `weight`; the
//! loader checks that this agrees with the config and fails with the module's name otherwise.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub use safetensors::tensor::Dtype;
use safetensors::SafeTensors;
use serde_json::Value;

use crate::EngineError;
use sparrow_cpu::format::nvfp4::{Nvfp4Matrix, BLOCK};
use sparrow_cpu::half::f16_to_f32;
use sparrow_cpu::Weight;

/// The NVFP4 quantization config of a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantConfig {
    /// Which file it came from (for messages).
    pub source: String,
    /// Weights per block scale (16 for NVFP4).
    pub group_size: usize,
    /// Module-name globs kept unquantized.
    pub exclude: Vec<String>,
}

impl QuantConfig {
    /// Whether module `name` (a state-dict prefix without `.weight`) is excluded.
    pub fn is_excluded(&self, name: &str) -> bool {
        self.exclude.iter().any(|p| match glob::Pattern::new(p) {
            Ok(g) => g.matches(name),
            Err(_) => p == name,
        })
    }

    /// Reads the config of `dir`: `hf_quant_config.json` first, else `config.json`'s
    /// `quantization_config`; `Ok(None)` for an unquantized checkpoint.
    ///
    /// # Errors
    /// A quantization method or algorithm other than ModelOpt NVFP4, or a malformed file.
    pub fn read(dir: &Path, config: &Value) -> Result<Option<QuantConfig>, EngineError> {
        let hqc = dir.join("hf_quant_config.json");
        let (source, q) = if hqc.is_file() {
            let v = read_json(&hqc)?;
            let q = v.get("quantization").cloned().ok_or_else(|| {
                EngineError::model(format!(
                    "{}: no \"quantization\" object (ModelOpt's hf_quant_config.json has one)",
                    hqc.display()
                ))
            })?;
            (hqc.display().to_string(), q)
        } else if let Some(q) = config.get("quantization_config") {
            let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("");
            if method != "modelopt" {
                return Err(EngineError::model(format!(
                    "config.json quantization_config.quant_method {method:?} is not supported (ModelOpt NVFP4 is)"
                )));
            }
            (format!("{}/config.json quantization_config", dir.display()), q.clone())
        } else {
            return Ok(None);
        };
        let algo = q.get("quant_algo").and_then(Value::as_str).unwrap_or("");
        if algo != "NVFP4" {
            return Err(EngineError::model(format!("{source}: quant_algo {algo:?} is not supported (NVFP4 is)")));
        }
        let group_size = q.get("group_size").and_then(Value::as_u64).unwrap_or(BLOCK as u64) as usize;
        if group_size != BLOCK {
            return Err(EngineError::model(format!(
                "{source}: group_size {group_size} is not supported (NVFP4 uses {BLOCK})"
            )));
        }
        let list = q.get("exclude_modules").or_else(|| q.get("ignore"));
        let exclude = match list {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|p| {
                    p.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| EngineError::model(format!("{source}: non-string pattern {p}")))
                })
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(EngineError::model(format!("{source}: exclude list is {other}, want an array of globs")))
            }
        };
        Ok(Some(QuantConfig { source, group_size, exclude }))
    }
}

/// Reads and parses a JSON file.
///
/// # Errors
/// [`EngineError::Model`] naming the file.
pub fn read_json(path: &Path) -> Result<Value, EngineError> {
    let text = std::fs::read_to_string(path).map_err(|e| EngineError::model(format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| EngineError::model(format!("{}: {e}", path.display())))
}

/// An open checkpoint directory: memory-mapped shards and the tensor → shard map.
pub struct Checkpoint {
    /// The directory.
    pub dir: PathBuf,
    /// `config.json`.
    pub config: Value,
    /// The NVFP4 config, if quantized.
    pub quant: Option<QuantConfig>,
    maps: Vec<(PathBuf, sparrow_cpu::Mapped)>,
    /// Tensor name → (shard index, dtype, shape, byte range in the shard's map), parsed once.
    index: HashMap<String, (usize, Dtype, Vec<usize>, std::ops::Range<usize>)>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint").field("dir", &self.dir).field("tensors", &self.index.len()).finish()
    }
}

/// A tensor's raw view.
#[derive(Debug, Clone)]
pub struct RawTensor<'a> {
    /// Element type.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Little-endian bytes.
    pub data: &'a [u8],
}

impl Checkpoint {
    /// Opens `dir`: `config.json`, the quantization config, and the weights
    /// (`model.safetensors.index.json`'s shards, else every `*.safetensors` file).
    ///
    /// # Errors
    /// Missing or malformed files, a tensor named twice, an index naming a missing shard.
    pub fn open(dir: &Path) -> Result<Checkpoint, EngineError> {
        let config = read_json(&dir.join("config.json"))?;
        let quant = QuantConfig::read(dir, &config)?;
        let index_path = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index_path.is_file() {
            let idx = read_json(&index_path)?;
            let map = idx
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| EngineError::model(format!("{}: no weight_map object", index_path.display())))?;
            let mut shards: Vec<String> = map.values().filter_map(Value::as_str).map(str::to_owned).collect();
            shards.sort();
            shards.dedup();
            shards.into_iter().map(|s| dir.join(s)).collect()
        } else {
            let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|e| EngineError::model(format!("{}: {e}", dir.display())))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            v.sort();
            v
        };
        if files.is_empty() {
            return Err(EngineError::model(format!("{}: no *.safetensors weights", dir.display())));
        }
        let mut maps = Vec::new();
        let mut index = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            let map = sparrow_cpu::Mapped::open(f).map_err(|e| EngineError::model(format!("{}: {e}", f.display())))?;
            // Validates the whole header (offsets, sizes) once; afterwards tensors are sliced
            // straight out of the map.
            SafeTensors::deserialize(&map).map_err(|e| EngineError::model(format!("{}: {e}", f.display())))?;
            let (n, meta) =
                SafeTensors::read_metadata(&map).map_err(|e| EngineError::model(format!("{}: {e}", f.display())))?;
            let base = 8 + n;
            for (name, info) in meta.tensors() {
                let (a, b) = info.data_offsets;
                let entry = (i, info.dtype, info.shape.clone(), base + a..base + b);
                if index.insert(name.clone(), entry).is_some() {
                    return Err(EngineError::model(format!("tensor {name} appears in more than one shard")));
                }
            }
            maps.push((f.clone(), map));
        }
        Ok(Checkpoint { dir: dir.to_owned(), config, quant, maps, index })
    }

    /// Refuses a layer count `n` (`config.json`'s `key`) above the checkpoint's tensor count,
    /// as [`crate::checkpoint::gguf::Gguf::check_layers`] does for GGUF.
    ///
    /// # Errors
    /// [`EngineError::Model`] naming the key, the count and the tensors.
    pub fn check_layers(&self, key: &str, n: usize) -> Result<(), EngineError> {
        match n <= self.index.len() {
            true => Ok(()),
            false => Err(EngineError::model(format!(
                "{}: config.json {key} = {n}, but the weights hold {} tensors (every layer has its own)",
                self.dir.display(),
                self.index.len()
            ))),
        }
    }

    /// The weight files' total size, bytes: what sizes stated in `config.json` are checked
    /// against.
    pub fn file_bytes(&self) -> usize {
        self.maps.iter().map(|(_, m)| m.len()).sum()
    }

    /// Whether tensor `name` exists.
    pub fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// All tensor names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// The raw tensor `name`.
    ///
    /// # Errors
    /// A missing tensor, named with the directory.
    pub fn raw(&self, name: &str) -> Result<RawTensor<'_>, EngineError> {
        let (i, dtype, shape, range) = self
            .index
            .get(name)
            .ok_or_else(|| EngineError::model(format!("{}: tensor {name} missing", self.dir.display())))?;
        let (path, map) = &self.maps[*i];
        let data = map.get(range.clone()).ok_or_else(|| {
            EngineError::model(format!("{}: tensor {name} runs past the end of the file", path.display()))
        })?;
        Ok(RawTensor { dtype: *dtype, shape: shape.clone(), data })
    }

    /// Tensor `name` as f32 (F32, BF16 or F16 on disk), with its shape.
    ///
    /// # Errors
    /// Missing tensor or another dtype.
    pub fn f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>), EngineError> {
        let t = self.raw(name)?;
        let shape = t.shape.clone();
        Ok((shape, to_f32(name, t)?))
    }

    /// The `len` f32 values of a vector (or of any tensor of `len` values, row-major: a
    /// depthwise conv weight `[channels, 1, kernel]`).
    ///
    /// # Errors
    /// Missing tensor, wrong shape or dtype.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, EngineError> {
        let (shape, v) = self.f32(name)?;
        // `[len]`, or a tensor of `len` values read row-major whatever its shape (a depthwise
        // conv's `[channels, 1, kernel]`, Nemotron-H's `D` as `[heads]`), as a GGUF file's.
        if shape.iter().product::<usize>() != len {
            return Err(EngineError::model(format!("tensor {name}: shape {shape:?}, want [{len}]")));
        }
        Ok(v)
    }

    /// The linear layer `module` (`module.weight`, `[rows, cols]`): NVFP4 when the checkpoint
    /// holds `module.weight_scale`, else dense from F32/BF16/F16. Checked against the
    /// quantization config: a module the config quantizes must be NVFP4 and an excluded one
    /// must not be.
    ///
    /// # Errors
    /// Missing tensors, shapes other than `[rows, cols]`, dtypes other than the format's, or a
    /// disagreement with the quantization config.
    pub fn linear(&self, module: &str, rows: usize, cols: usize) -> Result<Weight, EngineError> {
        let wname = format!("{module}.weight");
        let quantized = self.has(&format!("{module}.weight_scale"));
        match (&self.quant, quantized) {
            (None, true) => {
                return Err(EngineError::model(format!(
                    "{module} has NVFP4 tensors but the checkpoint has no quantization config \
                     (hf_quant_config.json or config.json quantization_config)"
                )))
            }
            (Some(q), true) if q.is_excluded(module) => {
                return Err(EngineError::model(format!(
                    "{module} is NVFP4 but {} excludes it from quantization",
                    q.source
                )))
            }
            (Some(q), false) if !q.is_excluded(module) => {
                return Err(EngineError::model(format!(
                    "{module} is not quantized but {} does not exclude it (no {module}.weight_scale)",
                    q.source
                )))
            }
            _ => {}
        }
        if !quantized {
            let (shape, data) = self.f32(&wname)?;
            if shape != [rows, cols] {
                return Err(EngineError::model(format!("tensor {wname}: shape {shape:?}, want [{rows}, {cols}]")));
            }
            return Ok(Weight::Dense { rows, cols, data });
        }
        Ok(Weight::Nvfp4(self.nvfp4(module, rows, cols)?))
    }

    /// The `n` experts of projection `proj` under `experts` (`model.layers.L.mlp.experts`) from
    /// transformers' fused 3-D tensors (Qwen3.5-MoE, Qwen3-MoE, Nemotron-H and others since
    /// transformers 5; llama.cpp's `Qwen2MoeModel.modify_tensors` reads them): `gate_up_proj`
    /// `[n, 2·rows, cols]`, each expert's gate rows then its up rows, for `gate_proj` and
    /// `up_proj`; an ungated `up_proj` `[n, rows, cols]` (Nemotron-H's ReLU² experts);
    /// `down_proj` `[n, rows, cols]`; named with or without `.weight`. Each expert
    /// `[rows × cols]` dense, converted from its own bytes (the fused tensor is never held
    /// whole in f32); `None` when the checkpoint has no fused tensor there.
    ///
    /// # Errors
    /// A fused tensor of another shape or dtype, named.
    pub fn fused_experts(
        &self,
        experts: &str,
        proj: &str,
        n: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Option<Vec<Weight>>, EngineError> {
        let candidates: &[(&str, usize, usize)] = match proj {
            "gate_proj" => &[("gate_up_proj", 2, 0)],
            "up_proj" => &[("gate_up_proj", 2, 1), ("up_proj", 1, 0)],
            "down_proj" => &[("down_proj", 1, 0)],
            _ => return Ok(None),
        };
        let found = candidates.iter().find_map(|&(fused, parts, part)| {
            [format!("{experts}.{fused}"), format!("{experts}.{fused}.weight")]
                .into_iter()
                .find(|t| self.has(t))
                .map(|t| (t, parts, part))
        });
        let Some((name, parts, part)) = found else { return Ok(None) };
        let t = self.raw(&name)?;
        if t.shape != [n, parts * rows, cols] {
            return Err(EngineError::model(format!(
                "tensor {name}: shape {:?}, want [{n}, {}, {cols}] ({n} experts' {})",
                t.shape,
                parts * rows,
                if parts == 2 { "gate then up rows" } else { "rows" }
            )));
        }
        let values = n * parts * rows * cols;
        let width = t.data.len() / values.max(1);
        if width == 0 || width * values != t.data.len() {
            return Err(EngineError::model(format!("tensor {name}: {} bytes for {values} values", t.data.len())));
        }
        let one = rows * cols * width;
        (0..n)
            .map(|e| {
                let at = (e * parts + part) * one;
                let bytes = RawTensor { dtype: t.dtype, shape: vec![rows, cols], data: &t.data[at..at + one] };
                Ok(Weight::Dense { rows, cols, data: to_f32(&name, bytes)? })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// The NVFP4 tensors of `module`, checked: `weight` U8 `[rows, cols/2]`, `weight_scale`
    /// F8_E4M3 `[rows, cols/16]`, `weight_scale_2` F32 scalar (`[]` or `[1]`).
    ///
    /// # Errors
    /// Missing tensors, wrong dtypes or shapes.
    pub fn nvfp4(&self, module: &str, rows: usize, cols: usize) -> Result<Nvfp4Matrix, EngineError> {
        if !cols.is_multiple_of(BLOCK) {
            return Err(EngineError::model(format!("{module}: {cols} input features is not a multiple of {BLOCK}")));
        }
        let w = self.raw(&format!("{module}.weight"))?;
        let s = self.raw(&format!("{module}.weight_scale"))?;
        let s2 = self.raw(&format!("{module}.weight_scale_2"))?;
        let want = |t: &RawTensor<'_>, what: &str, dt: Dtype, shape: &[usize]| {
            if t.dtype != dt || t.shape.as_slice() != shape {
                Err(EngineError::model(format!(
                    "{module}.{what}: {:?} {:?}, want {dt:?} {shape:?} (NVFP4 of a [{rows}, {cols}] layer)",
                    t.dtype, t.shape
                )))
            } else {
                Ok(())
            }
        };
        want(&w, "weight", Dtype::U8, &[rows, cols / 2])?;
        want(&s, "weight_scale", Dtype::F8_E4M3, &[rows, cols / BLOCK])?;
        if s2.dtype != Dtype::F32 || s2.shape.iter().product::<usize>() != 1 {
            return Err(EngineError::model(format!(
                "{module}.weight_scale_2: {:?} {:?}, want one F32",
                s2.dtype, s2.shape
            )));
        }
        let g = f32::from_le_bytes([s2.data[0], s2.data[1], s2.data[2], s2.data[3]]);
        if !g.is_finite() || g <= 0.0 {
            return Err(EngineError::model(format!("{module}.weight_scale_2 is {g}, want a positive finite scale")));
        }
        // E4M3 has no infinities; S.1111.111 is NaN and would poison every output it touches.
        if let Some(p) = s.data.iter().position(|&b| b & 0x7f == 0x7f) {
            return Err(EngineError::model(format!(
                "{module}.weight_scale: block scale {p} is NaN (byte {:#04x}); the checkpoint is damaged",
                s.data[p]
            )));
        }
        Ok(Nvfp4Matrix {
            rows,
            cols,
            weight: w.data.to_vec(),
            weight_scale: s.data.to_vec(),
            weight_scale_2: vec![g; rows],
        })
    }
}

/// Converts F32/BF16/F16 bytes to f32.
///
/// # Errors
/// Any other dtype, named.
pub fn to_f32(name: &str, t: RawTensor<'_>) -> Result<Vec<f32>, EngineError> {
    let d = t.data;
    Ok(match t.dtype {
        Dtype::F32 => d.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::BF16 => {
            d.chunks_exact(2).map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)).collect()
        }
        Dtype::F16 => d.chunks_exact(2).map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect(),
        other => {
            return Err(EngineError::model(format!(
                "tensor {name}: dtype {other:?} is not supported here (F32, BF16, F16 are)"
            )))
        }
    })
}
