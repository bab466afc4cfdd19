//! Quantized matmul throughput on a random Q4_1 matrix (Q8_0 with `Q8=1`): `mmbench ROWS COLS TOKENS`.
use sparrow_cpu::format::ggml::{GgmlType, QActs, QMatrix};
use sparrow_cpu::kernels::matmul;
use sparrow_cpu::Isa;
use sparrow_cpu::ThreadPool;
use sparrow_cpu::Weight;
fn main() {
    let a: Vec<usize> = std::env::args().skip(1).map(|s| s.parse().expect("number")).collect();
    let (n, k, t) = (a[0], a[1], a[2]);
    let ty = if std::env::var("Q8").is_ok() { GgmlType::Q8_0 } else { GgmlType::Q4_1 };
    let mut raw = vec![0u8; ty.bytes_for(n * k)];
    let mut x = 1u32;
    raw.iter_mut().for_each(|b| {
        x = x.wrapping_mul(1664525).wrapping_add(1013904223);
        *b = (x >> 24) as u8;
    });
    for blk in raw.chunks_exact_mut(ty.bytes_for(32)) {
        blk[1] = 0x20;
        if ty == GgmlType::Q4_1 {
            blk[3] = 0xa0;
        }
    }
    let w = Weight::Quant(QMatrix::from_ggml(ty, &raw, n, k));
    let xs: Vec<f32> = (0..t * k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    // Both pools are timed in alternation, best of 12 rounds each: the machine is shared, and
    // the best round is the kernel's own speed while the other sits in the same noise.
    let pools = [ThreadPool::new(1).expect("pool"), ThreadPool::new(2).expect("pool")];
    let mut q = QActs::default();
    let mut out = vec![0f32; t * n];
    let iters = (1e10 / (n * k * t) as f64).max(2.0) as usize;
    let (mut best, mut best_cpu) = ([f64::MAX; 2], [f64::MAX; 2]);
    for _round in 0..12 {
        for (i, pool) in pools.iter().enumerate() {
            let c0 = cpu_secs();
            let t0 = std::time::Instant::now();
            for _ in 0..iters {
                matmul(pool, Isa::detect(), &w, &xs, t, &mut q, &mut out);
            }
            best[i] = best[i].min(t0.elapsed().as_secs_f64() / iters as f64);
            // CPU time of the calling thread (100 Hz ticks, so only a rough check that the
            // round was not descheduled).
            best_cpu[i] = best_cpu[i].min((cpu_secs() - c0) / iters as f64);
        }
    }
    for (i, pool) in pools.iter().enumerate() {
        println!(
            "threads {}: {:.3} ms, {:.1} GMAC/s (best of 12 rounds); calling thread's CPU time {:.3} ms",
            pool.threads(),
            best[i] * 1e3,
            (n * k * t) as f64 / best[i] / 1e9,
            best_cpu[i] * 1e3
        );
    }
}

/// User + system CPU seconds of the calling thread (`/proc/thread-self/stat`, 100 Hz ticks).
fn cpu_secs() -> f64 {
    let s = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    let f: Vec<&str> = s.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}
