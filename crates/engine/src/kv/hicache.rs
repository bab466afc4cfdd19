//! The hierarchical cache's file tier (SGLang's HiCache with `--hicache-storage-backend file`).

use std::path::PathBuf;

/// When a radix page is written to the file tier (SGLang's `--hicache-write-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WritePolicy {
    /// As soon as the page enters the radix cache (SGLang's default): the tier survives a
    /// restart with everything the server computed.
    WriteThrough,
    /// Only when the radix cache evicts the page.
    WriteBack,
}

/// `--enable-hierarchical-cache` and its flags.
#[derive(Debug, Clone, PartialEq)]
pub struct HiCacheArgs {
    /// Directory of the tier's block files.
    pub dir: PathBuf,
    /// Byte budget (`--hicache-size` GB); `None`: `ratio` times the KV pool's bytes.
    pub size_bytes: Option<u64>,
    /// `--hicache-ratio` (the tier's size over the KV pool's).
    pub ratio: f64,
    /// `--hicache-write-policy`.
    pub write_policy: WritePolicy,
}
