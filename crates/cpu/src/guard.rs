//! A per-thread memory bound, for checking a model's chat template at start-up
//! (`sparrow_tokenizer::Tokenizer::check_chat_template`); here because it is an allocator.
//!
//! minijinja's fuel bounds a template's instructions, not its memory: `{% set s = s ~ s %}` in
//! a loop of 40 steps is 40 instructions and a terabyte of string (minijinja bounds `*`
//! repetition, not `~` or `+` concatenation or `replace`). No renderer API can stop that from
//! outside, and an allocator may not unwind. So the check at start-up runs the template on
//! this thread under a byte budget counted by [`GuardedAlloc`] (the `sparrow` binary's global
//! allocator): an allocation that takes the thread past its budget ends the process with a
//! message naming the model file, before the memory is taken. At start-up that is what a bad
//! file must do; a request's rendering is not guarded (it could not be stopped without ending
//! the server), so the start-up check renders conversations long enough that a template
//! growing per message fails there.
//!
//! Without [`GuardedAlloc`] installed (tests, other binaries) [`with_budget`] only runs its
//! closure.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::OnceLock;

thread_local! {
    /// Bytes this thread may still allocate net of its frees; `i64::MAX` when unguarded.
    static LEFT: Cell<i64> = const { Cell::new(i64::MAX) };
    /// The budget armed: frees of memory allocated before it was armed credit no more than it.
    static CAP: Cell<i64> = const { Cell::new(i64::MAX) };
}

/// What the message says ended the process: set by [`with_budget`] before the guard is armed,
/// read by the allocator without allocating.
static WHAT: OnceLock<String> = OnceLock::new();

/// The system allocator with a per-thread byte budget that [`with_budget`] arms.
#[derive(Debug, Clone, Copy, Default)]
pub struct GuardedAlloc;

impl GuardedAlloc {
    #[inline]
    fn charge(bytes: usize) {
        // `try_with`: a thread being torn down has no budget.
        let _ = LEFT.try_with(|left| {
            let l = left.get();
            if l == i64::MAX {
                return;
            }
            let after = l - bytes as i64;
            if after < 0 {
                over_budget();
            }
            left.set(after);
        });
    }

    #[inline]
    fn credit(bytes: usize) {
        let _ = LEFT.try_with(|left| {
            let l = left.get();
            if l != i64::MAX {
                let cap = CAP.try_with(Cell::get).unwrap_or(i64::MAX - 1);
                left.set(l.saturating_add(bytes as i64).min(cap));
            }
        });
    }
}

/// Ends the process with status 2 (a set-up failure, as `sparrow`'s other start-up errors) and a message naming [`WHAT`]. The budget is disarmed
/// first, so that printing and the exit handlers may allocate on this thread.
#[cold]
fn over_budget() -> ! {
    use std::io::Write;
    let _ = LEFT.try_with(|l| l.set(i64::MAX));
    let what = WHAT.get().map_or("the chat template", String::as_str);
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "error: {what}: the chat template took more memory than its start-up check allows (a template that builds \
         a huge string); refused"
    );
    let _ = err.flush();
    std::process::exit(2)
}

// SAFETY: every call goes to `System` with the same arguments; the budget bookkeeping only
// touches const-initialized thread-local `Cell`s (no allocation on targets with native TLS,
// as x86-64 Linux; no unwinding: `over_budget` disarms the budget, then prints and exits the
// process).
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for GuardedAlloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::charge(layout.size());
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if p.is_null() {
            Self::credit(layout.size());
        }
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::charge(layout.size());
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if p.is_null() {
            Self::credit(layout.size());
        }
        p
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        Self::credit(layout.size());
        // SAFETY: as `alloc`.
        unsafe { System.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let grows = new_size > layout.size();
        if grows {
            Self::charge(new_size - layout.size());
        } else {
            Self::credit(layout.size() - new_size);
        }
        // SAFETY: as `alloc`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            // The old block stands: undo the bookkeeping.
            if grows {
                Self::credit(new_size - layout.size());
            } else {
                Self::charge(layout.size() - new_size);
            }
        }
        p
    }
}

/// Runs `f` on this thread with at most `bytes` allocated net of frees; past it, under
/// [`GuardedAlloc`], the process ends with a message naming `what` (the model file). The
/// first `what` given is the one every later message names. The thread's earlier budget is
/// restored when `f` returns or unwinds.
pub fn with_budget<R>(what: &str, bytes: usize, f: impl FnOnce() -> R) -> R {
    /// Puts the thread's earlier budget back, also on unwind.
    struct Restore(i64, i64);
    impl Drop for Restore {
        fn drop(&mut self) {
            LEFT.with(|l| l.set(self.0));
            CAP.with(|c| c.set(self.1));
        }
    }
    let _ = WHAT.set(what.to_owned());
    let armed = i64::try_from(bytes).unwrap_or(i64::MAX - 1);
    let _restore = Restore(LEFT.with(|l| l.replace(armed)), CAP.with(|c| c.replace(armed)));
    f()
}
