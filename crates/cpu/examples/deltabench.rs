//! The gated delta rule alone: ns per (token, value head) at d_k = d_v = 128, one thread, over a
//! prefill chunk (`n` tokens) and a decode step (1 token), against the FMA-bound estimate.
use sparrow_cpu::kernels::recurrent::{self, DeltaToken};

fn main() {
    let d = 128;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = |n: usize, s: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * s
            })
            .collect()
    };
    for n in [512usize, 64, 1] {
        let mut q = rnd(n * d, 1.0);
        let mut k = rnd(n * d, 1.0);
        for t in 0..n {
            recurrent::l2_norm_in_place(&mut q[t * d..(t + 1) * d], 1e-6);
            recurrent::l2_norm_in_place(&mut k[t * d..(t + 1) * d], 1e-6);
        }
        let v = rnd(n * d, 2.0);
        let g: Vec<f32> = rnd(n, 0.2).iter().map(|x| -x.abs()).collect();
        let b: Vec<f32> = rnd(n, 1.0).iter().map(|x| recurrent::sigmoid(*x)).collect();
        let mut state = rnd(d * d, 0.1);
        let mut out = vec![0f32; n * d];
        let reps = (200_000 / n).max(20);
        let t0 = std::time::Instant::now();
        for _ in 0..reps {
            let tok = |t: usize| DeltaToken {
                q: &q[t * d..(t + 1) * d],
                k: &k[t * d..(t + 1) * d],
                v: &v[t * d..(t + 1) * d],
                g: g[t],
                beta: b[t],
            };
            recurrent::gated_delta_rule(&mut state, n, tok, &mut out);
        }
        let ns = t0.elapsed().as_secs_f64() * 1e9 / (reps * n) as f64;
        println!("n={n:4}: {ns:8.1} ns per token-head (checksum {:.4})", out.iter().sum::<f32>());
    }
}
