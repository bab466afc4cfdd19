//! A small fork-join thread pool for the model runner.
//!
//! `run(n, f)` calls `f(i)` for every `i < n` across the calling thread and `threads − 1`
//! workers and returns when all calls are done. Tasks are handed out through one atomic counter,
//! so a slow or descheduled worker costs only the tasks it took. Workers spin briefly for the
//! next job (a decode step issues hundreds of short jobs), then poll while yielding their core
//! for a few milliseconds, then sleep on a condition variable, so the pool neither misses the
//! jobs of a step nor burns a core that another process (the bench client) needs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Spin iterations before a waiting worker starts yielding. At ~1–5 ns per iteration this is a
/// few microseconds: enough to catch the next job of a tight sequence of jobs.
const SPIN: usize = 4000;

/// How long a waiting worker keeps polling with `sched_yield` between pure spins and sleeping.
/// A decode step issues hundreds of jobs with serial gaps of tens of microseconds to a
/// millisecond between some of them (sampling, batch building); a worker that went to sleep in
/// such a gap needs a futex wake and a free core to come back, and the caller meanwhile runs
/// every task alone: measured at 16 concurrent streams, the server used 1.0 of 2 cores. A
/// yielding worker stays ready across a step yet gives its core to any runnable thread (the
/// HTTP side, a bench client); once idle for this long it sleeps and costs nothing.
const YIELD_FOR: std::time::Duration = std::time::Duration::from_millis(3);

type Job = &'static (dyn Fn(usize) + Sync);

struct State {
    epoch: u64,
    job: Option<(Job, usize)>,
    /// Workers that took the current job and have not finished it.
    active: usize,
    /// Workers blocked on `wake`, and whether the caller of `run` is blocked on `done`: a
    /// notification costs a futex system call, so it is made only when someone sleeps (a decode
    /// step issues ~150 jobs, the workers are usually still polling).
    sleeping: usize,
    caller_waiting: bool,
    shutdown: bool,
}

/// Keeps a hot atomic on its own cache line, so counters written by different threads do not
/// bounce one line between cores.
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    done: Condvar,
    next: Padded<AtomicUsize>,
    finished: Padded<AtomicUsize>,
    epoch_hint: Padded<AtomicUsize>,
}

/// A raw pointer that pool tasks may share because each task writes a disjoint part of the
/// buffer behind it (the caller of `run` guarantees this, and that the buffer outlives the run).
#[derive(Debug)]
pub(crate) struct SyncPtr<T>(pub(crate) *mut T);

impl<T> Clone for SyncPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SyncPtr<T> {}

// SAFETY: see the type's docs: tasks write disjoint elements only.
#[allow(unsafe_code)]
unsafe impl<T> Send for SyncPtr<T> {}
#[allow(unsafe_code)]
unsafe impl<T> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// The pointer. A method (not `.0`) so closures capture the `Sync` wrapper, not the raw
    /// pointer.
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

/// The pool. Dropping it stops the workers.
pub struct ThreadPool {
    shared: Arc<Shared>,
    handles: Vec<std::thread::JoinHandle<()>>,
    threads: usize,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool").field("threads", &self.threads).finish()
    }
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    // A panic inside a task poisons nothing we rely on: the state is plain counters.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ThreadPool {
    /// A pool of `threads` threads in all (the caller counts as one); `threads` ≥ 1.
    ///
    /// # Errors
    /// The OS refused to spawn a thread.
    pub fn new(threads: usize) -> std::io::Result<Self> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                epoch: 0,
                job: None,
                active: 0,
                sleeping: 0,
                caller_waiting: false,
                shutdown: false,
            }),
            wake: Condvar::new(),
            done: Condvar::new(),
            next: Padded(AtomicUsize::new(0)),
            finished: Padded(AtomicUsize::new(0)),
            epoch_hint: Padded(AtomicUsize::new(0)),
        });
        let handles = (1..threads)
            .map(|i| {
                let sh = shared.clone();
                std::thread::Builder::new().name(format!("sparrow-worker-{i}")).spawn(move || worker(&sh))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(ThreadPool { shared, handles, threads })
    }

    /// Threads in all, the caller included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Splits `out` into rows of `w` elements and calls `f(first_row, chunk)` on the pool for
    /// contiguous runs of rows (about four runs per thread), `chunk` holding whole rows. The
    /// safe form of "each task writes its own rows" that the models use instead of raw
    /// pointers.
    ///
    /// # Panics
    /// When `w == 0` and `out` is not empty, or `out.len()` is not a multiple of `w`.
    pub fn par_row_chunks<T: Send, F: Fn(usize, &mut [T]) + Sync>(&self, out: &mut [T], w: usize, f: F) {
        if out.is_empty() {
            return;
        }
        assert!(w > 0 && out.len().is_multiple_of(w), "par_row_chunks: {} elements are not rows of {w}", out.len());
        let rows = out.len() / w;
        let per = rows.div_ceil(self.threads * 4).max(1);
        let ptr = SyncPtr(out.as_mut_ptr());
        self.run(rows.div_ceil(per), |task| {
            let (r0, r1) = (task * per, ((task + 1) * per).min(rows));
            // SAFETY: rows r0..r1 are handed to this task alone, and `out` is borrowed mutably
            // for the whole call, which returns only after every task is done.
            #[allow(unsafe_code)]
            let chunk = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(r0 * w), (r1 - r0) * w) };
            f(r0, chunk);
        });
    }

    /// [`ThreadPool::par_row_chunks`] over two buffers with the same number of rows (`a` in rows
    /// of `wa`, `b` in rows of `wb`): `f(first_row, a_chunk, b_chunk)` gets the same rows of
    /// both, e.g. a residual stream updated in place and its normalized copy.
    ///
    /// # Panics
    /// When a width is 0 with a non-empty buffer, or the buffers do not hold the same number of
    /// whole rows.
    pub fn par_row_chunks2<T: Send, U: Send, F: Fn(usize, &mut [T], &mut [U]) + Sync>(
        &self,
        a: &mut [T],
        wa: usize,
        b: &mut [U],
        wb: usize,
        f: F,
    ) {
        if a.is_empty() && b.is_empty() {
            return;
        }
        assert!(
            wa > 0 && wb > 0 && a.len().is_multiple_of(wa) && b.len().is_multiple_of(wb),
            "par_row_chunks2: widths"
        );
        let rows = a.len() / wa;
        assert_eq!(rows, b.len() / wb, "par_row_chunks2: row counts differ");
        let per = rows.div_ceil(self.threads * 4).max(1);
        let (pa, pb) = (SyncPtr(a.as_mut_ptr()), SyncPtr(b.as_mut_ptr()));
        self.run(rows.div_ceil(per), |task| {
            let (r0, r1) = (task * per, ((task + 1) * per).min(rows));
            // SAFETY: as `par_row_chunks`, for each buffer: rows r0..r1 belong to this task.
            #[allow(unsafe_code)]
            let (ca, cb) = unsafe {
                (
                    std::slice::from_raw_parts_mut(pa.get().add(r0 * wa), (r1 - r0) * wa),
                    std::slice::from_raw_parts_mut(pb.get().add(r0 * wb), (r1 - r0) * wb),
                )
            };
            f(r0, ca, cb);
        });
    }

    /// Calls `f(task, &mut out[ranges[task]])` for every range, in parallel: tasks are handed
    /// out in the order given (put the longest first for a balanced finish), each writing only
    /// its own range. For work whose outputs are runs of different lengths (attention query
    /// blocks of sequences of different lengths).
    ///
    /// # Panics
    /// When a range leaves `out` or two ranges overlap.
    pub fn par_ranges<T: Send, F: Fn(usize, &mut [T]) + Sync>(
        &self,
        out: &mut [T],
        ranges: &[std::ops::Range<usize>],
        f: F,
    ) {
        check_disjoint(ranges, out.len());
        let ptr = SyncPtr(out.as_mut_ptr());
        self.run(ranges.len(), |task| {
            let r = &ranges[task];
            if r.is_empty() {
                return f(task, &mut []);
            }
            // SAFETY: the ranges are disjoint and inside `out` (checked above), and `out` is
            // borrowed mutably for the whole call, which returns only after every task is done.
            #[allow(unsafe_code)]
            let chunk = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(r.start), r.len()) };
            f(task, chunk);
        });
    }

    /// [`ThreadPool::par_ranges`] over two buffers at once: task `i` gets `a[ra[i]]` and
    /// `b[rb[i]]` (the ranges of each buffer disjoint, `ra` and `rb` of one length), e.g. a
    /// recurrent layer's state of one request and head beside that head's output rows.
    ///
    /// # Panics
    /// When the lists differ in length, or ranges of one buffer overlap or leave it.
    pub fn par_ranges2<T: Send, U: Send, F: Fn(usize, &mut [T], &mut [U]) + Sync>(
        &self,
        a: &mut [T],
        ra: &[std::ops::Range<usize>],
        b: &mut [U],
        rb: &[std::ops::Range<usize>],
        f: F,
    ) {
        assert_eq!(ra.len(), rb.len(), "par_ranges2: {} and {} ranges", ra.len(), rb.len());
        check_disjoint(ra, a.len());
        check_disjoint(rb, b.len());
        let (pa, pb) = (SyncPtr(a.as_mut_ptr()), SyncPtr(b.as_mut_ptr()));
        self.run(ra.len(), |task| {
            let (r, s) = (&ra[task], &rb[task]);
            // SAFETY: each list's ranges are disjoint and inside its buffer (checked above), and
            // both buffers are borrowed mutably for the whole call, which returns only after
            // every task is done.
            #[allow(unsafe_code)]
            let (x, y) = unsafe {
                (
                    std::slice::from_raw_parts_mut(pa.get().add(r.start), r.len()),
                    std::slice::from_raw_parts_mut(pb.get().add(s.start), s.len()),
                )
            };
            f(task, x, y);
        });
    }

    /// Calls `f(i, row_i)` for every row of width `w` of `out`, in parallel (see
    /// [`ThreadPool::par_row_chunks`]).
    pub fn par_rows<T: Send, F: Fn(usize, &mut [T]) + Sync>(&self, out: &mut [T], w: usize, f: F) {
        self.par_row_chunks(out, w, |r0, chunk| {
            for (j, row) in chunk.chunks_mut(w).enumerate() {
                f(r0 + j, row);
            }
        });
    }

    /// Calls `f(i)` for each `i` in `0..n`, in parallel, and waits for all of them.
    pub fn run<F: Fn(usize) + Sync>(&self, n: usize, f: F) {
        if n == 0 {
            return;
        }
        if self.threads == 1 || n == 1 {
            (0..n).for_each(f);
            return;
        }
        let f_ref: &(dyn Fn(usize) + Sync) = &f;
        // SAFETY: the 'static lifetime is a lie told only to the workers. `run` does not return
        // until `finished == n` and no worker holds the job (`active == 0`, checked under the
        // lock that also clears it), so no worker can call `f` after this frame ends.
        #[allow(unsafe_code)]
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f_ref) };
        let sh = &*self.shared;
        sh.next.store(0, Ordering::Relaxed);
        sh.finished.store(0, Ordering::Relaxed);
        {
            let mut st = lock(&sh.state);
            st.epoch += 1;
            st.job = Some((job, n));
            sh.epoch_hint.store(st.epoch as usize, Ordering::Release);
            if st.sleeping > 0 {
                sh.wake.notify_all();
            }
        }
        work(sh, job, n);
        let mut spins = 0;
        loop {
            if sh.finished.load(Ordering::Acquire) >= n {
                let mut st = lock(&sh.state);
                if st.active == 0 {
                    st.job = None;
                    return;
                }
                // A worker took the job but has no task left to run; it will finish at once.
                drop(st);
            }
            spins += 1;
            if spins < SPIN {
                std::hint::spin_loop();
            } else {
                let mut st = lock(&sh.state);
                if sh.finished.load(Ordering::Acquire) >= n && st.active == 0 {
                    continue;
                }
                st.caller_waiting = true;
                let mut st =
                    sh.done.wait_timeout(st, std::time::Duration::from_millis(1)).unwrap_or_else(|p| p.into_inner()).0;
                st.caller_waiting = false;
            }
        }
    }
}

fn work(sh: &Shared, job: Job, n: usize) {
    loop {
        let i = sh.next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            return;
        }
        job(i);
        sh.finished.fetch_add(1, Ordering::AcqRel);
    }
}

fn worker(sh: &Shared) {
    let mut seen = 0u64;
    loop {
        // Spin on the hint first: a job usually follows within microseconds during a step;
        // then poll while yielding the core (see `YIELD_FOR`), then sleep.
        let mut spins = 0;
        while (sh.epoch_hint.load(Ordering::Acquire) as u64) == seen && spins < SPIN {
            std::hint::spin_loop();
            spins += 1;
        }
        if (sh.epoch_hint.load(Ordering::Acquire) as u64) == seen {
            let t0 = std::time::Instant::now();
            let mut polls = 0u32;
            while (sh.epoch_hint.load(Ordering::Acquire) as u64) == seen {
                std::thread::yield_now();
                polls += 1;
                if polls.is_multiple_of(16) && t0.elapsed() > YIELD_FOR {
                    break;
                }
            }
        }
        let (job, n) = {
            let mut st = lock(&sh.state);
            loop {
                if st.shutdown {
                    return;
                }
                if st.epoch != seen {
                    seen = st.epoch;
                    if let Some(j) = st.job {
                        st.active += 1;
                        break j;
                    }
                }
                st.sleeping += 1;
                st = sh.wake.wait(st).unwrap_or_else(|p| p.into_inner());
                st.sleeping -= 1;
            }
        };
        work(sh, job, n);
        let mut st = lock(&sh.state);
        st.active -= 1;
        if st.active == 0 && st.caller_waiting {
            sh.done.notify_all();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        {
            let mut st = lock(&self.shared.state);
            st.shutdown = true;
            self.shared.wake.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// Panics unless the non-empty `ranges` are disjoint and end within `len`.
fn check_disjoint(ranges: &[std::ops::Range<usize>], len: usize) {
    let mut sorted: Vec<&std::ops::Range<usize>> = ranges.iter().filter(|r| !r.is_empty()).collect();
    sorted.sort_by_key(|r| r.start);
    for w in sorted.windows(2) {
        assert!(w[0].end <= w[1].start, "ranges {:?} and {:?} overlap", w[0], w[1]);
    }
    if let Some(last) = sorted.last() {
        assert!(last.end <= len, "range {last:?} leaves {len} elements");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_across_many_jobs() {
        let pool = ThreadPool::new(3).expect("spawn");
        for n in [1usize, 2, 7, 100, 1000] {
            for _ in 0..50 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(n, |i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }
}
