//! Pool overhead: time per `run` with trivial tasks.
use sparrow_cpu::ThreadPool;
fn main() {
    for threads in [1, 2] {
        let p = ThreadPool::new(threads).expect("pool");
        let acc = std::sync::atomic::AtomicU64::new(0);
        let t0 = std::time::Instant::now();
        let n = 100_000;
        for _ in 0..n {
            p.run(60, |i| {
                acc.fetch_add(i as u64, std::sync::atomic::Ordering::Relaxed);
            });
        }
        println!("threads {threads}: {:.2} us per run", t0.elapsed().as_secs_f64() / n as f64 * 1e6);
    }
}
