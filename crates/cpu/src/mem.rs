//! Allocator settings for a process that runs forward passes.
//!
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
            (libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD), libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD))
        };
        mmap == 1 && trim == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
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
