//! GGUF files (llama.cpp's `gguf.md`): the file's map, its metadata, and tensors read out by
//! name with their GGML type and shape checked.

use std::path::{Path, PathBuf};

use ggus::GGuf;
use sparrow_cpu::format::ggml::{dequantize_row, GgmlType, QMatrix};
use sparrow_cpu::format::gguf::TensorEntry;
use sparrow_cpu::{Mapped, Weight};

use crate::EngineError;

/// An open GGUF file: the map lives as long as this value; read it through [`GgufFile::view`].
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: Mapped,
}

impl GgufFile {
    /// Maps `path`.
    ///
    /// # Errors
    /// [`EngineError::Model`] when the file cannot be opened or mapped.
    pub fn open(path: &Path) -> Result<GgufFile, EngineError> {
        let map = Mapped::open(path).map_err(|e| EngineError::model(format!("{}: {e}", path.display())))?;
        Ok(GgufFile { path: path.to_owned(), map })
    }

    /// Parses the header, metadata and tensor index.
    ///
    /// # Errors
    /// [`EngineError::Model`] when the bytes are not a GGUF file.
    pub fn view(&self) -> Result<Gguf<'_>, EngineError> {
        let ix = sparrow_cpu::format::gguf::index(&self.map)
            .map_err(|e| EngineError::model(format!("{}: not a GGUF file: {e}", self.path.display())))?;
        Ok(Gguf {
            file_len: self.map.len(),
            g: ix.file,
            tensors: ix.tensors,
            path: &self.path,
            read: std::cell::Cell::new(0),
            read_names: Default::default(),
        })
    }
}

/// A parsed GGUF file borrowed from its map.
pub struct Gguf<'a> {
    g: GGuf<'a>,
    file_len: usize,
    /// The tensor table, types as the file numbers them ([`sparrow_cpu::format::gguf`]).
    tensors: std::collections::HashMap<&'a str, TensorEntry>,
    path: &'a Path,
    /// File bytes of the tensors read by [`Gguf::matrix`] and [`Gguf::vector`] so far.
    read: std::cell::Cell<usize>,
    /// Names of the tensors read so far.
    read_names: std::cell::RefCell<std::collections::HashSet<String>>,
}

impl<'a> Gguf<'a> {
    /// The metadata (`ggus`' typed key access: `get_usize`, `get_str`, `general_name`, ...).
    pub fn meta(&self) -> &GGuf<'a> {
        &self.g
    }

    /// The scalar metadata under `{arch}.` (llama.cpp's `LLM_KV_*` keys, `src/llama-arch.cpp`)
    /// as a JSON object keyed by the rest of the name (`attention.head_count`), for a serde
    /// reader of an architecture's hyper-parameters. Arrays of numbers or booleans (per-layer
    /// head counts, Nemotron-H's `feed_forward_length`, `recurrent_layers`) are JSON arrays;
    /// arrays of strings or arrays, and arrays longer than the file, are left out.
    pub fn arch_keys(&self, arch: &str) -> serde_json::Map<String, serde_json::Value> {
        use ggus::GGufMetaDataValueType as Ty;
        let prefix = format!("{arch}.");
        let mut out = serde_json::Map::new();
        for (key, kv) in &self.g.meta_kvs {
            let Some(rest) = key.strip_prefix(&prefix) else { continue };
            let mut r = kv.value_reader();
            let v = match kv.ty() {
                Ty::String => r.read_str().ok().map(Into::into),
                Ty::Array => match r.read_arr_header() {
                    Ok((ty, n)) if n <= self.file_len && !matches!(ty, Ty::String | Ty::Array) => (0..n)
                        .map(|_| scalar_value(&mut r, ty))
                        .collect::<Option<Vec<_>>>()
                        .map(serde_json::Value::Array),
                    _ => None,
                },
                ty => scalar_value(&mut r, ty),
            };
            if let Some(v) = v {
                out.insert(rest.to_owned(), v);
            }
        }
        out
    }

    /// The file's size, bytes: what sizes stated in its metadata are checked against.
    pub fn file_len(&self) -> usize {
        self.file_len
    }

    /// Refuses a layer count `n` (metadata `key`) above the file's tensor count: every layer
    /// has tensors of its own, and per-layer settings are allocated by the count before they
    /// are read, so a crafted count must fail here rather than allocate.
    ///
    /// # Errors
    /// [`EngineError::Model`] naming the key, the count and the file's tensors.
    pub fn check_layers(&self, key: &str, n: usize) -> Result<(), EngineError> {
        match n <= self.tensors.len() {
            true => Ok(()),
            false => Err(EngineError::model(format!(
                "{}: {key} = {n}, but the file holds {} tensors (every layer has its own)",
                self.path.display(),
                self.tensors.len()
            ))),
        }
    }

    /// Whether the file holds tensor `name`.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.g.tensors.contains_key(name)
    }

    /// The file's bytes of every tensor read so far by [`Gguf::matrix`] and [`Gguf::vector`]
    /// (what "loaded bytes ≤ file bytes" is measured against).
    pub fn read_bytes(&self) -> usize {
        self.read.get()
    }

    /// The tensors of the file that [`Gguf::matrix`] and [`Gguf::vector`] have not read, sorted:
    /// a loader that finds some left over would run the model without them (an output bias,
    /// a norm of a variant it does not know), so it refuses the file instead.
    pub fn unread_tensors(&self) -> Vec<&str> {
        let read = self.read_names.borrow();
        self.tensor_names().into_iter().filter(|n| !read.contains(*n)).collect()
    }

    /// Refuses a file with tensors the `arch` decoder did not read: any left over but the NextN
    /// layers' (`blk.{trunk}` on, which serve only multi-token prediction) and those `spare`
    /// accepts (LongRoPE's unused regime).
    ///
    /// # Errors
    /// Naming the file, how many tensors are left and the first.
    pub fn check_all_read(&self, arch: &str, trunk: usize, spare: impl Fn(&str) -> bool) -> Result<(), EngineError> {
        let past_trunk = |n: &str| {
            n.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|b| b.parse::<usize>().ok())
                >= Some(trunk)
        };
        let unused: Vec<&str> = self.unread_tensors().into_iter().filter(|n| !spare(n) && !past_trunk(n)).collect();
        match unused.first() {
            Some(first) => Err(EngineError::model(format!(
                "{}: {} tensor(s) the {arch} decoder does not use (first: {first}); running without them would \
                 change the model's arithmetic",
                self.path.display(),
                unused.len()
            ))),
            None => Ok(()),
        }
    }

    /// Every tensor name, sorted.
    pub fn tensor_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.g.tensors.keys().map(|k| &**k).collect();
        names.sort();
        names
    }

    /// Tensor `name`: its type, GGUF shape (innermost dimension first) and raw bytes.
    ///
    /// # Errors
    /// [`EngineError::Model`] when it is missing, of a type we do not read, or cut short.
    pub fn tensor(&self, name: &str) -> Result<(GgmlType, Vec<usize>, &'a [u8]), EngineError> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| EngineError::model(format!("{}: tensor {name} missing", self.path.display())))?;
        let ty = t.ggml_type().ok_or_else(|| {
            EngineError::model(format!(
                "tensor {name}: GGML type {} is not supported (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, \
                 Q6_K, MXFP4 are)",
                t.ty
            ))
        })?;
        let bytes = t.bytes().ok_or_else(|| {
            let n = t.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            match n {
                Some(n) if !n.is_multiple_of(ty.block_len()) => {
                    EngineError::model(format!("tensor {name}: shape {:?} is not whole {} blocks", t.shape, ty.name()))
                }
                _ => EngineError::model(format!(
                    "tensor {name}: shape {:?} of {} is more bytes than any file holds",
                    t.shape,
                    ty.name()
                )),
            }
        })?;
        let data = t
            .offset
            .checked_add(bytes)
            .and_then(|end| self.g.data.get(t.offset..end))
            .ok_or_else(|| EngineError::model(format!("tensor {name}: data runs past the end of the file")))?;
        if ty == GgmlType::MXFP4 {
            // The kernels widen a scale byte into an f32 exponent field, which leaves out the two
            // subnormal scales 2^-128 and 2^-127 (gpt-oss's are far above).
            if let Some(b) = data.chunks_exact(17).find(|b| b[0] < 2) {
                return Err(EngineError::model(format!(
                    "tensor {name}: an MXFP4 block scale 2^{} is subnormal (below 2^-126), which sparrow does not keep",
                    b[0] as i32 - 128
                )));
            }
        }
        Ok((ty, t.shape.clone(), data))
    }

    /// Rows of `token_embd.weight` (GGUF shape `[hidden, vocab]`): the vocabulary size every
    /// architecture's config reads.
    ///
    /// # Errors
    /// As [`Gguf::tensor`], and for a tensor that is not 2-D.
    pub fn embedding_rows(&self) -> Result<usize, EngineError> {
        let (_, shape, _) = self.tensor("token_embd.weight")?;
        match shape.as_slice() {
            [_, rows] => Ok(*rows),
            _ => Err(EngineError::model("token_embd.weight is not 2-D")),
        }
    }

    /// A 1-D F32/F16 tensor of `len` values.
    ///
    /// # Errors
    /// As [`Gguf::tensor`], and for another shape or a block type.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, EngineError> {
        let (ty, shape, data) = self.tensor(name)?;
        if shape.iter().product::<usize>() != len || ty.is_block() {
            return Err(EngineError::model(format!(
                "tensor {name}: shape {shape:?} type {ty:?}, want [{len}] F32/F16"
            )));
        }
        let mut v = vec![0f32; len];
        dequantize_row(ty, data, &mut v);
        self.read.set(self.read.get() + data.len());
        self.read_names.borrow_mut().insert(name.to_owned());
        Ok(v)
    }

    /// A `[rows, cols]` weight (GGUF shape `[cols, rows]`) at the file's size: block types
    /// repacked as [`Weight::Quant`], F16 and BF16 kept as [`Weight::Half`], F32 as
    /// [`Weight::Dense`]. `threads` repack in parallel.
    ///
    /// # Errors
    /// As [`Gguf::tensor`], and for another shape or a row that is not whole blocks.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight, EngineError> {
        self.matrix_threads(name, rows, cols, 1)
    }

    /// [`Gguf::matrix`] repacked on `threads` threads.
    ///
    /// # Errors
    /// As [`Gguf::matrix`].
    pub fn matrix_threads(&self, name: &str, rows: usize, cols: usize, threads: usize) -> Result<Weight, EngineError> {
        let (ty, shape, data) = self.tensor(name)?;
        if shape != [cols, rows] {
            return Err(EngineError::model(format!("tensor {name}: GGUF shape {shape:?}, want [{cols}, {rows}]")));
        }
        if !cols.is_multiple_of(ty.block_len()) {
            return Err(EngineError::model(format!(
                "tensor {name}: {cols} columns is not a multiple of {} ({})",
                ty.block_len(),
                ty.name()
            )));
        }
        self.read.set(self.read.get() + data.len());
        self.read_names.borrow_mut().insert(name.to_owned());
        Ok(weight(ty, data, rows, cols, threads))
    }

    /// The experts of a MoE tensor as llama.cpp stores them (`blk.N.ffn_{gate,up,down}_exps`:
    /// GGUF shape `[cols, rows, n_expert]`, one `[rows, cols]` matrix per expert, contiguous),
    /// each at the file's size as [`Gguf::matrix`] makes it.
    ///
    /// # Errors
    /// As [`Gguf::tensor`]; another shape (naming the tensor and both shapes, so an expert count
    /// that disagrees with the metadata is a start-up error), or a row that is not whole blocks.
    pub fn experts(
        &self,
        name: &str,
        n_expert: usize,
        rows: usize,
        cols: usize,
        threads: usize,
    ) -> Result<Vec<Weight>, EngineError> {
        let (ty, shape, data) = self.tensor(name)?;
        if shape != [cols, rows, n_expert] {
            return Err(EngineError::model(format!(
                "tensor {name}: GGUF shape {shape:?}, want [{cols}, {rows}, {n_expert}] ({n_expert} experts)"
            )));
        }
        if !cols.is_multiple_of(ty.block_len()) {
            return Err(EngineError::model(format!(
                "tensor {name}: {cols} columns is not a multiple of {} ({})",
                ty.block_len(),
                ty.name()
            )));
        }
        let per = rows * ty.bytes_for(cols);
        if data.len() != per * n_expert {
            return Err(EngineError::model(format!(
                "tensor {name}: {} bytes, want {} for {n_expert} experts of [{rows}, {cols}] {}",
                data.len(),
                per * n_expert,
                ty.name()
            )));
        }
        self.read.set(self.read.get() + data.len());
        self.read_names.borrow_mut().insert(name.to_owned());
        Ok(data.chunks_exact(per).map(|d| weight(ty, d, rows, cols, threads)).collect())
    }
}

/// A `[rows, cols]` weight from its file bytes: block types repacked, 16-bit kept, F32 dense.
fn weight(ty: GgmlType, data: &[u8], rows: usize, cols: usize, threads: usize) -> Weight {
    match ty {
        GgmlType::F32 => {
            let mut v = vec![0f32; rows * cols];
            dequantize_row(ty, data, &mut v);
            Weight::Dense { rows, cols, data: v }
        }
        GgmlType::F16 | GgmlType::BF16 => Weight::Half {
            rows,
            cols,
            data: data.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect(),
            bf16: ty == GgmlType::BF16,
        },
        _ => Weight::Quant(QMatrix::from_ggml_threads(ty, data, rows, cols, threads)),
    }
}

/// One number or boolean of GGUF type `ty` from `r`, as JSON; `None` for a string, an array or
/// a read past the data.
fn scalar_value(r: &mut ggus::GGufReader<'_>, ty: ggus::GGufMetaDataValueType) -> Option<serde_json::Value> {
    use ggus::GGufMetaDataValueType as Ty;
    match ty {
        Ty::U8 => r.read::<u8>().ok().map(Into::into),
        Ty::I8 => r.read::<i8>().ok().map(Into::into),
        Ty::U16 => r.read::<u16>().ok().map(Into::into),
        Ty::I16 => r.read::<i16>().ok().map(Into::into),
        Ty::U32 => r.read::<u32>().ok().map(Into::into),
        Ty::I32 => r.read::<i32>().ok().map(Into::into),
        Ty::U64 => r.read::<u64>().ok().map(Into::into),
        Ty::I64 => r.read::<i64>().ok().map(Into::into),
        Ty::F32 => r.read::<f32>().ok().map(|x| serde_json::Value::from(x as f64)),
        Ty::F64 => r.read::<f64>().ok().map(Into::into),
        Ty::Bool => r.read_bool().ok().map(Into::into),
        Ty::String | Ty::Array => None,
    }
}
