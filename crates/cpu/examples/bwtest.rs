//! Streaming-read bandwidth at several buffer sizes: `bwtest`.
fn main() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pool = sparrow_cpu::ThreadPool::new(threads).expect("pool");
    for mib in [64usize, 256, 512, 1024, 2048] {
        let bw = sparrow_cpu::roofline::bandwidth(&pool, mib << 20);
        println!("{mib} MiB: {bw:.1} GB/s");
    }
}
