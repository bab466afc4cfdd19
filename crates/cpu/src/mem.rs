//! Allocator settings for a process that runs forward passes, and the buffer weights live in.
//!
//! **Weights** ([`HugeBytes`]): a decode step streams every weight byte once, hundreds of MB
//! per step. In 4 KiB pages that is a TLB miss every 4 KiB; Linux backs anonymous memory with
//! 2 MiB pages only where asked (`transparent_hugepage/enabled = madvise` is the common
//! default), so weight buffers are 2 MiB-aligned and `madvise(MADV_HUGEPAGE)`d before their
//! first touch.
//!
//! **Activations**:
//! A forward allocates its activations per step (tens of MB for a 512-token chunk, in buffers of
//! a few hundred KB to a few MB each) and frees them at its end. glibc's `malloc` serves blocks
//! above its mmap threshold (128 KiB at start, raised dynamically only up to the size of the
//! largest block freed so far) with fresh `mmap`s and returns them with `munmap`, and trims the
//! heap top past 128 KiB of free space: every step then faults its activation pages in again and
//! the kernel zeroes them, page by page, on the engine thread while the pool's workers wait. On
//! glm5-tiny's 4096-token prefill that was ~10 % of all CPU samples (`perf`: `exc_page_fault`,
//! `clear_page_erms`, `munmap`) and ~9 % of the wall time.

/// Blocks up to this size come from the heap (glibc caps `M_MMAP_THRESHOLD` at half its
/// per-arena heap size, 32 MiB on 64-bit).
const MMAP_THRESHOLD: i32 = 32 << 20;

/// Free space the heap keeps at its top before returning memory to the OS: a step's
/// activations and then some, bounded so an idle server does not hold a spike forever. (The
/// engine's own reused step buffers, `Scratch`, have their own bound.)
const TRIM_THRESHOLD: i32 = 512 << 20;

/// Makes `malloc` keep freed activation memory for the next step instead of unmapping it
/// (`mallopt(M_MMAP_THRESHOLD, 32 MiB)` and `mallopt(M_TRIM_THRESHOLD, 512 MiB)`, see
/// `mallopt(3)`). Call once at start-up, before the threads that allocate are spawned; the
/// cost is that the process's resident size stays at its peak step's working set (up to
/// 512 MiB of free heap). Returns whether the settings were applied: `false` on targets whose
/// allocator is not glibc's, where it does nothing.
pub fn retain_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes malloc's tuning parameters; both values are in the
        // ranges glibc accepts (it returns 0 and changes nothing otherwise).
        #[allow(unsafe_code)]
        let (mmap, trim) = unsafe {
            (
                libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD),
            )
        };
        mmap == 1 && trim == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Huge-page size the weight buffers are aligned to.
const HUGE: usize = 2 << 20;

/// A zero-initialised byte buffer for weights: 2 MiB-aligned when at least 2 MiB long and
/// advised for transparent huge pages (module docs), else a plain allocation. Derefs to
/// `[u8]`.
pub struct HugeBytes {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: an owned allocation, like `Vec<u8>`.
#[allow(unsafe_code)]
unsafe impl Send for HugeBytes {}
// SAFETY: shared access is read-only through `Deref`.
#[allow(unsafe_code)]
unsafe impl Sync for HugeBytes {}

impl HugeBytes {
    fn layout(len: usize) -> std::alloc::Layout {
        let align = if len >= HUGE { HUGE } else { 64 };
        // A size rounded up to the alignment never overflows for buffers that fit in memory.
        std::alloc::Layout::from_size_align(len.max(1).next_multiple_of(align), align).expect("a valid layout")
    }

    /// `len` zero bytes.
    ///
    /// # Panics
    /// Aborts as `Vec` does when the allocation fails.
    pub fn zeroed(len: usize) -> HugeBytes {
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size; the pointer is checked before use.
        #[allow(unsafe_code)]
        let raw = unsafe { std::alloc::alloc(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw) else { std::alloc::handle_alloc_error(layout) };
        #[cfg(target_os = "linux")]
        if len >= HUGE {
            // SAFETY: the range is this allocation; advice changes no contents. Failure (no THP
            // in this kernel) only leaves 4 KiB pages.
            #[allow(unsafe_code)]
            unsafe {
                libc::madvise(raw as *mut libc::c_void, layout.size(), libc::MADV_HUGEPAGE);
            }
        }
        // SAFETY: `len` bytes of the fresh allocation; the first touch happens here, after the
        // advice, so the pages faulted in are huge ones where the kernel has them.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::write_bytes(raw, 0, len)
        };
        HugeBytes { ptr, len }
    }

    /// A copy of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> HugeBytes {
        let mut b = HugeBytes::zeroed(bytes.len());
        b.copy_from_slice(bytes);
        b
    }
}

impl Drop for HugeBytes {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        #[allow(unsafe_code)]
        unsafe {
            std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len))
        };
    }
}

impl std::ops::Deref for HugeBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes owned by `self`.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr(), self.len)
        }
    }
}

impl std::ops::DerefMut for HugeBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `deref`, exclusively borrowed.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len)
        }
    }
}

impl Clone for HugeBytes {
    fn clone(&self) -> Self {
        HugeBytes::from_slice(self)
    }
}

impl std::fmt::Debug for HugeBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HugeBytes({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    /// glibc accepts both values (a rejected value would silently keep the old behaviour).
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_accepts_the_settings() {
        assert!(super::retain_freed_memory());
    }
}
