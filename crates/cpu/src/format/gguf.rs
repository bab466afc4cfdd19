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
        let block = ty.block_len();
        // Checked: a crafted shape can make the byte count overflow where the element count does not.
        if n.is_multiple_of(block) {
            (n / block).checked_mul(ty.bytes_for(block))
        } else {
            None
        }
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
    // `ggus`' reader trusts what it reads: it takes a type field into its enum whatever the
    // number, panics on an array length whose byte count overflows and recurses once per nested
    // array header. Every field is checked here first, so it only ever reads a well-formed file.
    validate(data)?;
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
            if !alignment.is_power_of_two() {
                return Err(format!("{k} = {alignment} is not a power of two"));
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

/// Most dimensions of a tensor (`GGML_MAX_DIMS`, `ggml.h`): llama.cpp refuses a file with more.
pub const MAX_DIMS: usize = 4;

/// Walks the whole header, metadata and tensor table of `data` as `gguf.md` lays them out,
/// checking every length and count against the bytes left before anything is read or allocated
/// from it: value types are the 13 of the format, arrays hold scalars or strings (llama.cpp's
/// `gguf.cpp` refuses arrays of arrays too), strings are UTF-8, tensors have at most
/// [`MAX_DIMS`] dimensions whose element count fits a `usize`.
///
/// # Errors
/// A message naming the section and the key or tensor (by index where the name itself is bad)
/// and what is wrong.
pub fn validate(data: &[u8]) -> Result<(), String> {
    let mut c = Cursor { data, at: 0 };
    let magic = c.take(4).map_err(|_| "not a GGUF file (shorter than its magic)".to_string())?;
    if magic != b"GGUF" {
        return Err("not a GGUF file (magic)".into());
    }
    let version = c.u32().map_err(|e| format!("header: version: {e}"))?;
    if version != 3 {
        // The other byte order reads as a huge version; `index` names both cases.
        return Ok(());
    }
    let n_tensors = c.u64().map_err(|e| format!("header: tensor count: {e}"))?;
    let n_kv = c.u64().map_err(|e| format!("header: metadata count: {e}"))?;
    for i in 0..n_kv {
        let key = c.string().map_err(|e| format!("metadata entry {i} of {n_kv}: key: {e}"))?;
        let ty = c.u32().map_err(|e| format!("metadata {key}: type: {e}"))?;
        match ty {
            ARRAY => {
                let elem = c.u32().map_err(|e| format!("metadata {key}: array type: {e}"))?;
                let len = c.u64().map_err(|e| format!("metadata {key}: array length: {e}"))?;
                match elem {
                    ARRAY => return Err(format!("metadata {key}: an array of arrays")),
                    STRING => {
                        for j in 0..len {
                            c.string().map_err(|e| format!("metadata {key}: string {j} of {len}: {e}"))?;
                        }
                    }
                    _ => {
                        let size = scalar_size(elem).ok_or_else(|| format!("metadata {key}: array type {elem}"))?;
                        let bytes = usize::try_from(len)
                            .ok()
                            .and_then(|n| n.checked_mul(size))
                            .ok_or_else(|| format!("metadata {key}: array length {len} overflows"))?;
                        c.take(bytes).map_err(|e| format!("metadata {key}: {len} values: {e}"))?;
                    }
                }
            }
            STRING => {
                c.string().map_err(|e| format!("metadata {key}: {e}"))?;
            }
            _ => {
                let size = scalar_size(ty).ok_or_else(|| format!("metadata {key}: type {ty}"))?;
                c.take(size).map_err(|e| format!("metadata {key}: {e}"))?;
            }
        }
    }
    for i in 0..n_tensors {
        let name = c.string().map_err(|e| format!("tensor entry {i} of {n_tensors}: name: {e}"))?;
        let ndim = c.u32().map_err(|e| format!("tensor {name}: dimension count: {e}"))? as usize;
        if ndim > MAX_DIMS {
            return Err(format!("tensor {name}: {ndim} dimensions (at most {MAX_DIMS})"));
        }
        let mut n = 1usize;
        for _ in 0..ndim {
            let d = c.u64().map_err(|e| format!("tensor {name}: dimensions: {e}"))?;
            n = usize::try_from(d)
                .ok()
                .and_then(|d| n.checked_mul(d))
                .ok_or_else(|| format!("tensor {name}: element count overflows (a dimension of {d})"))?;
        }
        c.take(12).map_err(|e| format!("tensor {name}: type and offset: {e}"))?;
    }
    Ok(())
}

/// GGUF value type numbers (`gguf_type`, `ggml/include/gguf.h`) with a structure of their own.
const STRING: u32 = 8;
const ARRAY: u32 = 9;

/// Bytes of one value of scalar type `ty`; `None` for the string and array types and for a
/// number that is no type.
fn scalar_size(ty: u32) -> Option<usize> {
    match ty {
        0 | 1 | 7 => Some(1), // u8, i8, bool
        2 | 3 => Some(2),     // u16, i16
        4..=6 => Some(4),     // u32, i32, f32
        10..=12 => Some(8),   // u64, i64, f64
        _ => None,
    }
}

/// A read position over the file's bytes; every read is checked against what is left.
struct Cursor<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let left = self.data.len() - self.at;
        if n > left {
            return Err(format!("{n} bytes stated at offset {} with {left} left in the file", self.at));
        }
        let b = &self.data[self.at..self.at + n];
        self.at += n;
        Ok(b)
    }

    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, String> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }

    fn string(&mut self) -> Result<&'a str, String> {
        let len = self.u64()?;
        let n = usize::try_from(len).map_err(|_| format!("a string of {len} bytes"))?;
        let b = self.take(n).map_err(|e| format!("a string of {len} bytes: {e}"))?;
        std::str::from_utf8(b).map_err(|e| format!("a string that is not UTF-8 ({e}) at offset {}", self.at - n))
    }
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
    if ndim > MAX_DIMS {
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

/// Crafted files: every one is refused with a message, none panics or allocates by a stated
/// count (run under the test harness, a panic or a huge allocation fails the test).
#[cfg(test)]
mod crafted_tests {
    use super::*;

    fn string(f: &mut Vec<u8>, s: &[u8]) {
        f.extend_from_slice(&(s.len() as u64).to_le_bytes());
        f.extend_from_slice(s);
    }

    /// A well-formed file: 3 metadata entries (a u32, a string, a string array) and one F32
    /// tensor of 8 values.
    fn good() -> Vec<u8> {
        let mut f = b"GGUF".to_vec();
        f.extend_from_slice(&3u32.to_le_bytes());
        f.extend_from_slice(&1u64.to_le_bytes());
        f.extend_from_slice(&3u64.to_le_bytes());
        string(&mut f, b"general.alignment");
        f.extend_from_slice(&4u32.to_le_bytes());
        f.extend_from_slice(&32u32.to_le_bytes());
        string(&mut f, b"general.architecture");
        f.extend_from_slice(&STRING.to_le_bytes());
        string(&mut f, b"llama");
        string(&mut f, b"tokenizer.ggml.tokens");
        f.extend_from_slice(&ARRAY.to_le_bytes());
        f.extend_from_slice(&STRING.to_le_bytes());
        f.extend_from_slice(&2u64.to_le_bytes());
        string(&mut f, b"a");
        string(&mut f, b"b");
        string(&mut f, b"t");
        f.extend_from_slice(&1u32.to_le_bytes());
        f.extend_from_slice(&8u64.to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        f.extend_from_slice(&0u64.to_le_bytes());
        while !f.len().is_multiple_of(32) {
            f.push(0);
        }
        f.extend_from_slice(&[0u8; 32]);
        f
    }

    /// The offset of the first occurrence of `pat` in `f`.
    fn at(f: &[u8], pat: &[u8]) -> usize {
        f.windows(pat.len()).position(|w| w == pat).expect("pattern")
    }

    #[test]
    fn good_file_reads_and_every_cut_is_refused() {
        let f = good();
        let ix = index(&f).expect("good file");
        assert_eq!(ix.tensors["t"].bytes(), Some(32));
        assert_eq!(ix.file.data.len(), 32);
        // Cut inside the header, the metadata and the tensor table: an error each time.
        let table_end = at(&f, b"\x01\0\0\0\0\0\0\0t") + 9 + 4 + 8 + 4 + 8;
        for len in 0..table_end {
            assert!(index(&f[..len]).is_err(), "cut at {len} of {}", f.len());
        }
    }

    #[test]
    fn stated_sizes_past_the_file_are_refused() {
        // 2^63 tensors.
        let mut f = good();
        f[8..16].copy_from_slice(&(1u64 << 63).to_le_bytes());
        // The second entry reads from the zero padding and data until the file ends.
        let e = index(&f).err().expect("2^63 tensors");
        assert!(e.starts_with("tensor ") && e.contains("left in the file"), "{e}");
        // 2^63 metadata entries.
        let mut f = good();
        f[16..24].copy_from_slice(&(1u64 << 63).to_le_bytes());
        // Entries past the third read the tensor table and data as metadata until one fails.
        let e = index(&f).err().expect("2^63 entries");
        assert!(e.starts_with("metadata "), "{e}");
        // A 2^32-byte string value.
        let mut f = good();
        let len = at(&f, b"\x05\0\0\0\0\0\0\0llama");
        f[len..len + 8].copy_from_slice(&(1u64 << 32).to_le_bytes());
        let e = index(&f).err().expect("2^32 string");
        assert!(e.contains("metadata general.architecture: a string of 4294967296 bytes"), "{e}");
        // A string array of 2^62 strings.
        let mut f = good();
        let n = at(&f, b"\x02\0\0\0\0\0\0\0\x01\0\0\0\0\0\0\0a");
        f[n..n + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
        let e = index(&f).err().expect("2^62 strings");
        assert!(e.contains("metadata tokenizer.ggml.tokens: string ") && e.contains(" of 4611686018427387904"), "{e}");
        // A u32 array whose byte count overflows.
        let mut f = good();
        f[n - 4..n].copy_from_slice(&4u32.to_le_bytes());
        f[n..n + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        let e = index(&f).err().expect("overflowing array");
        assert!(e.contains("tokenizer.ggml.tokens: array length 9223372036854775807 overflows"), "{e}");
        // An array of arrays, and a type that does not exist.
        let mut f = good();
        f[n - 4..n].copy_from_slice(&ARRAY.to_le_bytes());
        assert!(index(&f).err().expect("nested").contains("an array of arrays"));
        let mut f = good();
        let ty = at(&f, b"general.architecture") + "general.architecture".len();
        f[ty..ty + 4].copy_from_slice(&13u32.to_le_bytes());
        assert!(index(&f).err().expect("type 13").contains("metadata general.architecture: type 13"));
        // A tensor of 2^40 × 2^40 elements, and one of 5 dimensions.
        let mut f = good();
        let t = at(&f, b"\x01\0\0\0\0\0\0\0t") + 9;
        f[t..t + 4].copy_from_slice(&2u32.to_le_bytes());
        f[t + 4..t + 12].copy_from_slice(&(1u64 << 40).to_le_bytes());
        f[t + 12..t + 16].copy_from_slice(&[0, 0, 0, 1]);
        let e = index(&f).err().expect("overflowing shape");
        assert!(e.contains("tensor t"), "{e}");
        let mut f = good();
        f[t..t + 4].copy_from_slice(&5u32.to_le_bytes());
        assert!(index(&f).err().expect("5-D").contains("tensor t: 5 dimensions"));
        // Alignment 0 and 3.
        for a in [0u32, 3] {
            let mut f = good();
            let v = at(&f, b"general.alignment") + "general.alignment".len() + 4;
            f[v..v + 4].copy_from_slice(&a.to_le_bytes());
            assert!(index(&f).err().expect("alignment").contains("is not a power of two"));
        }
    }

    #[test]
    fn tensor_bytes_that_overflow_are_none() {
        let t = TensorEntry { ty: 0, shape: vec![1 << 62, 2], offset: 0 };
        assert_eq!(t.bytes(), None);
        let t = TensorEntry { ty: 0, shape: vec![1 << 62], offset: 0 };
        assert_eq!(t.bytes(), None);
    }
}
