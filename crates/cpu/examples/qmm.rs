//! One quantized matmul, every ISA path, best of rounds: `qmm TYPE ROWS COLS TOKENS [THREADS]`
//! (TYPE a GGML name: Q4_K, Q6_K, Q8_0, ...).
use sparrow_cpu::format::ggml::{random_blocks, GgmlType, QActs, QMatrix, BLOCK_TYPES};
use sparrow_cpu::{kernels::matmul, Isa, ThreadPool, Weight};
fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let ty: GgmlType = BLOCK_TYPES.into_iter().find(|t| t.name() == a[0]).expect("type");
    let (n, k, t): (usize, usize, usize) =
        (a[1].parse().expect("rows"), a[2].parse().expect("cols"), a[3].parse().expect("tokens"));
    let threads: usize = a.get(4).map_or(1, |s| s.parse().expect("threads"));
    let mut x = 1u32;
    let raw = random_blocks(ty, n * k, &mut || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    });
    let w = Weight::Quant(QMatrix::from_ggml(ty, &raw, n, k));
    let xs: Vec<f32> = (0..t * k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let pool = ThreadPool::new(threads).expect("pool");
    let mut q = QActs::default();
    let mut out = vec![0f32; t * n];
    let iters = (2e9 / (n * k * t) as f64).max(2.0) as usize;
    for isa in Isa::available() {
        if isa == Isa::Scalar || std::env::var("ISA").is_ok_and(|v| v != isa.name()) {
            continue;
        }
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t0 = std::time::Instant::now();
            for _ in 0..iters {
                matmul(&pool, isa, &w, &xs, t, &mut q, &mut out);
            }
            best = best.min(t0.elapsed().as_secs_f64() / iters as f64);
        }
        println!(
            "{:<12} {ty:?} {n}x{k} T={t} threads {threads}: {:.3} ms, {:.1} GMAC/s",
            isa.name(),
            best * 1e3,
            (n * k * t) as f64 / best / 1e9
        );
    }
}
