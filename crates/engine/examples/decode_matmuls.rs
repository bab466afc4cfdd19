//! The matmuls of one decode step of a GGUF model, streamed from memory as a real step streams
//! them: `decode_matmuls MODEL.gguf [TOKENS] [ROUNDS]` prints the step's weight bytes, the best
//! and median time over the rounds, GB/s, and the machine's streaming bandwidth measured in the
//! same run (interleaved), so a kernel change is judged by its share of the roofline.
use std::time::Instant;

use sparrow_cpu::format::ggml::QActs;
use sparrow_cpu::{kernels, roofline, Isa};
use sparrow_engine::model::llama::LlamaModel;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect("usage: decode_matmuls MODEL.gguf [TOKENS] [ROUNDS]");
    let tokens: usize = args.get(2).map_or(1, |s| s.parse().expect("tokens"));
    let rounds: usize = args.get(3).map_or(15, |s| s.parse().expect("rounds"));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let m = LlamaModel::load(std::path::Path::new(path), threads).expect("model");
    let (pool, isa) = m.pool_isa();
    let isa =
        std::env::var("ISA").ok().and_then(|n| Isa::available().into_iter().find(|i| i.name() == n)).unwrap_or(isa);
    let mats = m.decode_matrices();
    let bytes: usize = mats.iter().map(|(_, w)| w.bytes()).sum();
    let kmax = mats.iter().map(|(_, w)| w.cols()).max().unwrap_or(0);
    let nmax = mats.iter().map(|(_, w)| w.rows()).max().unwrap_or(0);
    let x: Vec<f32> = (0..tokens * kmax).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect();
    let mut out = vec![0f32; tokens * nmax];
    let mut xq = QActs::default();
    let (mut step, mut bw) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t0 = Instant::now();
        for (_, w) in &mats {
            let (k, n) = (w.cols(), w.rows());
            kernels::matmul(pool, isa, w, &x[..tokens * k], tokens, &mut xq, &mut out[..tokens * n]);
        }
        step.push(t0.elapsed().as_secs_f64());
        bw.push(roofline::bandwidth(pool, 512 << 20));
    }
    step.sort_by(f64::total_cmp);
    bw.sort_by(f64::total_cmp);
    let (best, med) = (step[0], step[rounds / 2]);
    println!(
        "{} path, {threads} threads, {tokens} token(s): {:.1} MB of weights; step best {:.2} ms ({:.1} GB/s), median {:.2} ms ({:.1} GB/s); streaming read best {:.1} GB/s, median {:.1}; best step at {:.0} % of the best bandwidth",
        isa.name(),
        bytes as f64 / 1e6,
        best * 1e3,
        bytes as f64 / best / 1e9,
        med * 1e3,
        bytes as f64 / med / 1e9,
        bw[rounds - 1],
        bw[rounds / 2],
        100.0 * bytes as f64 / best / 1e9 / bw[rounds - 1]
    );
}
