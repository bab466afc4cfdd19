//! Decode attention of one GQA group over an f16 cache (SmolLM2-135M's shape by default: 3
//! query heads per KV head, 64 dims): `attnbench [KEYS] [GROUP] [HD]`. Prints the time per key,
//! split into scores, softmax and values, and the f32 FMA rate against this core's peak
//! (`sparrow roofline`): every key costs `2 · group · hd` multiply-adds. One thread, best of
//! 12 rounds (the machine is shared).
use sparrow_cpu::half::f32_to_f16;
use sparrow_cpu::kernels::attend_group;
use sparrow_cpu::Isa;
fn main() {
    let a: Vec<usize> = std::env::args().skip(1).map(|s| s.parse().expect("number")).collect();
    let n = a.first().copied().unwrap_or(256);
    let group = a.get(1).copied().unwrap_or(3);
    let hd = a.get(2).copied().unwrap_or(64);
    let kv_heads = 3;
    let stride = kv_heads * hd;
    let mut x = 1u32;
    let mut rnd = || {
        x = x.wrapping_mul(1664525).wrapping_add(1013904223);
        (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5
    };
    // Slots in a shuffled order, as pages of a real cache are.
    let cap = n * 2;
    let k: Vec<u16> = (0..cap * stride).map(|_| f32_to_f16(rnd())).collect();
    let v: Vec<u16> = (0..cap * stride).map(|_| f32_to_f16(rnd())).collect();
    let slots: Vec<u32> = (0..n as u32).map(|i| (i * 7919) % cap as u32).collect();
    let q: Vec<f32> = (0..group * hd).map(|_| rnd()).collect();
    let mut out = vec![0f32; group * hd];
    let mut scores = Vec::new();
    let iters = (2e7 / n as f64).max(10.0) as usize;
    let isa = Isa::detect();
    let mut best = f64::MAX;
    for _round in 0..12 {
        let t0 = std::time::Instant::now();
        for _ in 0..iters {
            attend_group(isa, &q, hd, &k, &v, stride, hd, &slots, 0.125, &mut scores, &mut out);
        }
        best = best.min(t0.elapsed().as_secs_f64() / iters as f64);
    }
    let per_key = best / n as f64;
    let gflops = (2 * 2 * group * hd) as f64 / per_key / 1e9;
    println!(
        "{isa:?}: {n} keys, group {group}, hd {hd}: {:.2} us per call, {:.1} ns per key, {gflops:.1} GFLOP/s (f32 FMA peak of one core: see `sparrow roofline`)",
        best * 1e6,
        per_key * 1e9
    );
}
