//! The one safe wrapper over `memmap2`: read-only maps of model and tokenizer files.
#![allow(unsafe_code)]

use std::path::Path;

/// A read-only memory map of a whole file; derefs to its bytes.
#[derive(Debug)]
pub struct Mapped(memmap2::Mmap);

impl Mapped {
    /// Maps `path` read-only.
    ///
    /// # Errors
    /// The file cannot be opened or mapped.
    pub fn open(path: &Path) -> std::io::Result<Mapped> {
        let file = std::fs::File::open(path)?;
        // SAFETY: the map is read-only and private to this process. A file changed on disk by
        // another process while mapped is outside what a model server guards against (as in
        // llama.cpp and safetensors, which map the same way).
        let map = unsafe { memmap2::Mmap::map(&file) }?;
        Ok(Mapped(map))
    }
}

impl std::ops::Deref for Mapped {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}
