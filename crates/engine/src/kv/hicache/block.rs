//! The file tier's block format: one file per radix page, named by the page's chain hash
//! ([`chain_hash`] over the tokens, the root seeded by the model's [`fingerprint`]); a header
//! (magic, version, fingerprint, its hash and its parent's, the page's tokens, the payload's
//! length and xxh3, the header's own xxh3) then the page's KV as stored. [`check_block`]
//! refuses a block of another model or layout, a truncated one or a checksum mismatch.

use std::io::Read;
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

pub(super) const MAGIC: &[u8; 4] = b"SPKV";
pub(super) const VERSION: u32 = 1;
pub(super) const SUFFIX: &str = "kvb";

/// Chain hash of a page of `tokens` after the page hashed `parent` (the root's parent is the
/// [`fingerprint`]).
pub fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = Xxh3::with_seed(parent);
    let mut buf = [0u8; 256];
    for chunk in tokens.chunks(64) {
        for (d, t) in buf.chunks_exact_mut(4).zip(chunk) {
            d.copy_from_slice(&t.to_le_bytes());
        }
        h.update(&buf[..chunk.len() * 4]);
    }
    h.digest()
}

/// Identity of what a block's KV depends on: the weights (each file's length and xxh3 of its
/// first and last MiB: a GGUF file, or a checkpoint directory's files with their names), the
/// KV layout and dtype, and the page size. A GGUF file copied or renamed keeps its identity; a
/// path that cannot be read is identified by its name.
pub fn fingerprint(model_path: &Path, layout: &crate::kv::KvLayout, page_size: usize) -> u64 {
    let mut h = Xxh3::with_seed(0x5350_4b56);
    let dir = model_path.is_dir();
    let mut files: Vec<PathBuf> = if dir {
        std::fs::read_dir(model_path)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()).collect())
            .unwrap_or_default()
    } else {
        vec![model_path.to_path_buf()]
    };
    files.sort();
    for f in &files {
        if let Some(n) = f.file_name().filter(|_| dir) {
            h.update(n.to_string_lossy().as_bytes());
        }
        match sample(f) {
            Ok((len, head, tail)) => {
                h.update(&len.to_le_bytes());
                h.update(&head.to_le_bytes());
                h.update(&tail.to_le_bytes());
            }
            Err(_) => h.update(f.to_string_lossy().as_bytes()),
        }
    }
    h.update(format!("{:?}|{}|{page_size}", layout.components, layout.layers).as_bytes());
    h.update(layout.dtype.name().as_bytes());
    h.digest()
}

/// A file's length and the xxh3 of its first and last MiB.
fn sample(path: &Path) -> std::io::Result<(u64, u64, u64)> {
    use std::io::{Seek, SeekFrom};
    const MIB: u64 = 1 << 20;
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let mut buf = vec![0u8; MIB.min(len) as usize];
    f.read_exact(&mut buf)?;
    let head = xxh3_64(&buf);
    f.seek(SeekFrom::Start(len.saturating_sub(MIB)))?;
    f.read_exact(&mut buf)?;
    Ok((len, head, xxh3_64(&buf)))
}

/// Why a header was not taken: a block another server wrote (another format version or
/// page size: left in place) or a damaged one (removed at start-up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum BadHeader {
    Foreign(String),
    Corrupt(String),
}

impl std::fmt::Display for BadHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadHeader::Foreign(m) | BadHeader::Corrupt(m) => f.write_str(m),
        }
    }
}

/// A block's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Header {
    pub(super) fingerprint: u64,
    pub(super) hash: u64,
    pub(super) parent: u64,
    pub(super) tokens: Vec<u32>,
    pub(super) payload_len: u64,
    pub(super) payload_sum: u64,
}

impl Header {
    pub(super) fn len(page_size: usize) -> usize {
        4 + 4 + 8 * 3 + 4 + 4 * page_size + 8 * 3
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::len(self.tokens.len()));
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        for v in [self.fingerprint, self.hash, self.parent] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&(self.tokens.len() as u32).to_le_bytes());
        self.tokens.iter().for_each(|t| b.extend_from_slice(&t.to_le_bytes()));
        b.extend_from_slice(&self.payload_len.to_le_bytes());
        b.extend_from_slice(&self.payload_sum.to_le_bytes());
        let sum = xxh3_64(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        b
    }

    /// Parses and checks a header of a page of `page_size` tokens: its own checksum, and that
    /// its hash is the chain hash of its tokens after its parent (so a flipped token is
    /// caught too).
    pub(super) fn decode(b: &[u8], page_size: usize) -> Result<Header, BadHeader> {
        let corrupt = |m: String| Err(BadHeader::Corrupt(m));
        let n = Self::len(page_size);
        if b.len() < n {
            return corrupt(format!("truncated header ({} of {n} bytes)", b.len()));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        if &b[..4] != MAGIC {
            return corrupt("not a sparrow KV block (bad magic)".into());
        }
        if u32_at(4) != VERSION {
            return Err(BadHeader::Foreign(format!("a KV block of format version {}, not {VERSION}", u32_at(4))));
        }
        if u64_at(n - 8) != xxh3_64(&b[..n - 8]) {
            return corrupt("header checksum mismatch".into());
        }
        if u32_at(32) as usize != page_size {
            return Err(BadHeader::Foreign(format!("a page of {} tokens, not {page_size}", u32_at(32))));
        }
        let tokens: Vec<u32> = (0..page_size).map(|i| u32_at(36 + 4 * i)).collect();
        let at = 36 + 4 * page_size;
        let h = Header {
            fingerprint: u64_at(8),
            hash: u64_at(16),
            parent: u64_at(24),
            tokens,
            payload_len: u64_at(at),
            payload_sum: u64_at(at + 8),
        };
        if chain_hash(h.parent, &h.tokens) != h.hash {
            return corrupt("its tokens do not hash to its name".into());
        }
        Ok(h)
    }
}

pub(super) fn block_path(dir: &Path, hash: u64) -> PathBuf {
    dir.join(format!("{hash:016x}.{SUFFIX}"))
}

/// Checks one block's bytes; returns its payload.
pub(super) fn check_block(
    b: &[u8],
    hash: u64,
    fingerprint: u64,
    page_size: usize,
    page_bytes: usize,
) -> Result<Vec<u8>, String> {
    let h = Header::decode(b, page_size).map_err(|e| e.to_string())?;
    if h.fingerprint != fingerprint {
        return Err("written for another model or KV layout".into());
    }
    if h.hash != hash {
        return Err("its header names another block".into());
    }
    let hl = Header::len(page_size);
    if h.payload_len != page_bytes as u64 || b.len() != hl + page_bytes {
        return Err(format!(
            "truncated or padded: {} payload bytes, expected {page_bytes}",
            b.len().saturating_sub(hl)
        ));
    }
    let payload = &b[hl..];
    if xxh3_64(payload) != h.payload_sum {
        return Err("payload checksum mismatch".into());
    }
    Ok(payload.to_vec())
}

/// Chain hash of the first page of `tokens` under `seed` (tests).
#[cfg(test)]
pub(super) fn first_hash(seed: u64, tokens: &[u32]) -> u64 {
    chain_hash(seed, tokens)
}
