//! A GGUF file's index (llama.cpp's `gguf.md`, version 3): the header, metadata and tensor
//! table, read through `ggus`' reader but with the tensor table parsed here.
//!
//! Why not `ggus::GGuf::new`: it decodes every tensor's type into its own `GGmlType` enum,
//! which has no variant past 33, and sizes every tensor through it. A file with a newer type
//! (MXFP4 is 39: every gpt-oss GGUF) or a corrupt type field would be read into an enum value
//! that does not exist. Here a tensor's type stays the file's number; its size comes from
//! [`GgmlType`] when we read the type, and a type we do not read is an error naming the tensor
//! when (and only when) that tensor is asked for.

use ggus::{GGuf, GGufMetaDataValueType, GGufReader, DEFAULT_ALIGNMENT, GENERAL_ALIGNMENT};

use super::ggml::GgmlType;

/// One tensor's entry in the table, as the file states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// GGML's type number (`ggml_type`).
    pub ty: u32,
    /// Dimensions, innermost first.
    pub shape: Vec<usize>,
    /// Offset of its data from the start of the data section.
    pub offset: usize,
}

impl TensorEntry {
    /// The type, when it is one [`GgmlType`] reads.
    pub fn ggml_type(&self) -> Option<GgmlType> {
        GgmlType::from_u32(self.ty)
    }

    /// Bytes of its data, when the type is known and the element count fills whole blocks.
    pub fn bytes(&self) -> Option<usize> {
        let ty = self.ggml_type()?;
        let n = self.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
        n.is_multiple_of(ty.block_len()).then(|| ty.bytes_for(n))
    }
}

/// A parsed GGUF file: `ggus`' view of it (header, metadata, the raw tensor table, the data
/// section) and the tensor table parsed here.
pub struct GgufIndex<'a> {
    /// Header, metadata (through `ggus`' typed accessors) and data section.
    pub file: GGuf<'a>,
    /// Every tensor by name.
    pub tensors: std::collections::HashMap<&'a str, TensorEntry>,
}

/// Reads the index of the GGUF file in `data`.
///
/// # Errors
/// A message for a file that is not GGUF version 3 in this machine's byte order, is cut short,
/// repeats a key or a tensor name, or states a tensor table that does not parse.
pub fn index(data: &[u8]) -> Result<GgufIndex<'_>, String> {
    let mut r = GGufReader::new(data);
    let header = r.read_header().map_err(|e| format!("header: {e:?}"))?;
    if !header.is_magic_correct() {
        return Err("not a GGUF file (magic)".into());
    }
    if !header.is_native_endian() {
        return Err("a GGUF file of the other byte order".into());
    }
    if header.version != 3 {
        return Err(format!("GGUF version {} (3 is read)", header.version));
    }
    let mut alignment = DEFAULT_ALIGNMENT;
    let mut meta_kvs = indexmap::IndexMap::new();
    for _ in 0..header.metadata_kv_count {
        let kv = r.read_meta_kv().map_err(|e| format!("metadata: {e:?}"))?;
        let k = kv.key();
        if k == GENERAL_ALIGNMENT {
            alignment = match kv.ty() {
                GGufMetaDataValueType::U32 => {
                    kv.value_reader().read::<u32>().map_err(|e| format!("{k}: {e:?}"))? as usize
                }
                GGufMetaDataValueType::U64 => {
                    kv.value_reader().read::<u64>().map_err(|e| format!("{k}: {e:?}"))? as usize
                }
                ty => return Err(format!("{k}: type {ty:?}")),
            };
            if alignment == 0 {
                return Err(format!("{k} is 0"));
            }
        }
        if meta_kvs.insert(k, kv).is_some() {
            return Err(format!("metadata key {k} repeated"));
        }
    }
    let mut metas = indexmap::IndexMap::new();
    let mut tensors = std::collections::HashMap::new();
    let mut data_len = 0usize;
    for _ in 0..header.tensor_count {
        let before = r.remaining();
        let meta = r.read_tensor_meta().map_err(|e| format!("tensor table: {e:?}"))?;
        let raw = &before[..before.len() - r.remaining().len()];
        let name = meta.name();
        let entry = entry(raw, name.len()).ok_or_else(|| format!("tensor {name}: table entry does not parse"))?;
        if let Some(end) = entry.bytes().and_then(|b| entry.offset.checked_add(b)) {
            data_len = data_len.max(end);
        }
        if metas.insert(name, meta).is_some() {
            return Err(format!("tensor name {name} repeated"));
        }
        tensors.insert(name, entry);
    }
    let cursor = data.len() - r.remaining().len();
    let padding = if metas.is_empty() { 0 } else { (alignment - cursor % alignment) % alignment };
    let rest = r.remaining();
    let section = rest.get(padding.min(rest.len())..).unwrap_or(&[]);
    let section = &section[..data_len.min(section.len())];
    let file = GGuf { header, alignment, meta_kvs, tensors: metas, data: section };
    Ok(GgufIndex { file, tensors })
}

/// A tensor-table entry's fields after its name (`name_len` bytes after the u64 length):
/// `ndim: u32`, `dims: [u64; ndim]`, `type: u32`, `offset: u64`, little-endian.
fn entry(raw: &[u8], name_len: usize) -> Option<TensorEntry> {
    let mut at = 8 + name_len;
    let mut take = |n: usize| {
        let b = raw.get(at..at + n)?;
        at += n;
        Some(b)
    };
    let u32_of = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let u64_of = |b: &[u8]| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
    let ndim = u32_of(take(4)?) as usize;
    if ndim > 8 {
        return None;
    }
    let mut shape = Vec::with_capacity(ndim);
    for _ in 0..ndim {
        shape.push(usize::try_from(u64_of(take(8)?)).ok()?);
    }
    let ty = u32_of(take(4)?);
    let offset = usize::try_from(u64_of(take(8)?)).ok()?;
    Some(TensorEntry { ty, shape, offset })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file with a tensor of a type `ggus` has no variant for (MXFP4, 39) and one of an
    /// unknown number indexes: both entries read back as stated, the known one sized.
    #[test]
    fn types_past_ggus_enum_are_indexed() {
        let mut f = Vec::new();
        f.extend_from_slice(b"GGUF");
        f.extend_from_slice(&3u32.to_le_bytes());
        f.extend_from_slice(&2u64.to_le_bytes()); // tensors
        f.extend_from_slice(&0u64.to_le_bytes()); // metadata
        for (name, ty, offset) in [("a", 39u32, 0u64), ("b", 200, 32)] {
            f.extend_from_slice(&(name.len() as u64).to_le_bytes());
            f.extend_from_slice(name.as_bytes());
            f.extend_from_slice(&1u32.to_le_bytes());
            f.extend_from_slice(&32u64.to_le_bytes());
            f.extend_from_slice(&ty.to_le_bytes());
            f.extend_from_slice(&offset.to_le_bytes());
        }
        while f.len() % 32 != 0 {
            f.push(0);
        }
        f.extend_from_slice(&[0u8; 17]);
        let ix = index(&f).expect("index");
        let a = &ix.tensors["a"];
        assert_eq!((a.ggml_type(), a.bytes(), a.shape.as_slice()), (Some(GgmlType::MXFP4), Some(17), &[32usize][..]));
        assert_eq!((ix.tensors["b"].ty, ix.tensors["b"].bytes()), (200, None));
        assert_eq!(ix.file.data.len(), 17);
        assert!(index(&f[..30]).is_err(), "cut short");
    }
}
