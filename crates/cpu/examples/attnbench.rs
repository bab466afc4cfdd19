//! Attention of one GQA group over an f16 cache (SmolLM2-135M's shape by default: 3 query
//! heads per KV head, 64 dims): `attnbench [KEYS] [GROUP] [HD] [QUERIES]`. Times the tiled
//! online-softmax kernel (`flash_attend`) on a block of QUERIES consecutive tokens (default 1:
//! a DECODE row; 32: an EXTEND query block whose last token sees KEYS keys), and, for one
//! query, the two-pass kernel it replaced (`attend_group`), alternating rounds of the two in one
//! run. Prints the time per (query, key) and the f32 FMA rate (every (query, key) costs
//! `2 · group · hd` multiply-adds; compare with `sparrow roofline`). One thread, best of 12
//! rounds (the machine is shared).
use sparrow_cpu::half::f32_to_f16;
use sparrow_cpu::kernels::{attend_group, flash_attend, FlashScratch, KvView};
use sparrow_cpu::Isa;
fn main() {
    let a: Vec<usize> = std::env::args().skip(1).map(|s| s.parse().expect("number")).collect();
    let n = a.first().copied().unwrap_or(256);
    let group = a.get(1).copied().unwrap_or(3);
    let hd = a.get(2).copied().unwrap_or(64);
    let nq = a.get(3).copied().unwrap_or(1).clamp(1, n);
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
    let q: Vec<f32> = (0..nq * group * hd).map(|_| rnd()).collect();
    let positions: Vec<u32> = (n - nq..n).map(|p| p as u32).collect();
    let view = KvView { k: &k, v: &v, stride, off: hd, slots: &slots };
    let mut out = vec![0f32; nq * group * hd];
    let mut scores = Vec::new();
    let mut sc = FlashScratch::default();
    // (query, key) pairs of one call: the block's causal triangle.
    let pairs: usize = positions.iter().map(|&p| p as usize + 1).sum();
    let iters = (2e7 / pairs as f64).max(10.0) as usize;
    let isa = Isa::detect();
    let (mut tiled, mut two_pass) = (f64::MAX, f64::MAX);
    for _round in 0..12 {
        let t0 = std::time::Instant::now();
        for _ in 0..iters {
            flash_attend(isa, &q, group * hd, &positions, group, hd, &view, 0.125, &mut sc, &mut out);
        }
        tiled = tiled.min(t0.elapsed().as_secs_f64() / iters as f64);
        if nq == 1 {
            let t0 = std::time::Instant::now();
            for _ in 0..iters {
                attend_group(isa, &q, hd, &k, &v, stride, hd, &slots, 0.125, &mut scores, &mut out[..group * hd]);
            }
            two_pass = two_pass.min(t0.elapsed().as_secs_f64() / iters as f64);
        }
    }
    let report = |name: &str, t: f64| {
        let per = t / pairs as f64;
        let gflops = (2 * 2 * group * hd) as f64 / per / 1e9;
        println!(
            "{isa:?} {name}: {nq} queries, {n} keys, group {group}, hd {hd}: {:.2} us per call, {:.2} ns per (query, key), {gflops:.1} GFLOP/s",
            t * 1e6,
            per * 1e9
        );
    };
    report("tiled", tiled);
    if nq == 1 {
        report("two-pass", two_pass);
        println!("tiled is {:.2}x faster", two_pass / tiled);
    }
}
