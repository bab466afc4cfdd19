//! Long-prompt prefill split into the model's parts (GEMMs, attention, the DSA indexer, the
//! rest) for prompts of N tokens (the attention kernels alone: the `attnbench` example of
//! `sparrow-cpu`).
//!
//! ```text
//! cargo run --release -p sparrow-convert --example prefill_bench -- llama MODEL.gguf [N ...]
//! cargo run --release -p sparrow-convert --example prefill_bench -- glm5 [N ...]
//! ```
//!
//! `llama`: a Llama-family GGUF (e.g. SmolLM2-135M Q4_1); N defaults to 512 1024 2048 4096
//! 8192. `glm5`: the synthetic glm5-tiny checkpoint (NVFP4, MLA + DSA, MoE) with sparse and
//! dense attention; N defaults to 1024 2048 4096. One sequence is prefilled in chunks of
//! `CHUNK` tokens (default 512, the server's `--chunked-prefill-size`; `CHUNK=-1` for one
//! chunk); each row is the best of `ROUNDS` runs (default 1); `KERNEL=sparse` skips glm5's dense
//! run. Prints a markdown table.

use std::time::Instant;

use sparrow_convert::quantize::{quantize_state_dict, write_checkpoint, QuantStyle};
use sparrow_cpu::format::nvfp4::ScaleRule;
use sparrow_engine::batch::ForwardBatch;
use sparrow_engine::model::glm5::{AttnImpl, Glm5Model, Glm5Options, MoeChoice, MoeImpl};
use sparrow_engine::model::llama::LlamaModel;
use sparrow_engine::model::{Model, PartTimes};

fn env_num(key: &str, default: i64) -> i64 {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Prefills `n` pseudo-random ids over one sequence in chunks; the part times of the best
/// round, and its last logits.
fn prefill<M: Model>(m: &mut M, n: usize, vocab: usize) -> (PartTimes, Vec<f32>) {
    let chunk = match env_num("CHUNK", 512) {
        c if c <= 0 => n,
        c => c as usize,
    };
    let ids: Vec<u32> =
        (0..n as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 8) % (vocab as u32 - 200) + 100).collect();
    let mut best: Option<(PartTimes, Vec<f32>)> = None;
    for _ in 0..env_num("ROUNDS", 1).max(1) {
        let mut kv = sparrow_engine::model::kv_store(m, n + 1, 1, 0);
        m.set_profile(true);
        let t0 = Instant::now();
        let mut done = 0;
        let mut logits = Vec::new();
        while done < n {
            let end = (done + chunk).min(n);
            logits = m.forward(&ForwardBatch::single_sequence(&ids[..end], done), &mut kv).expect("prefill");
            done = end;
        }
        let wall = t0.elapsed().as_secs_f64();
        let mut pt = m.part_times();
        m.set_profile(false);
        pt.total = wall;
        if best.as_ref().is_none_or(|b| wall < b.0.total) {
            best = Some((pt, logits));
        }
    }
    best.unwrap_or_default()
}

fn row(n: usize, label: &str, p: &PartTimes) -> String {
    let f = |x: f64| format!("{x:.2} ({:.0} %)", 100.0 * x / p.total);
    format!(
        "| {n} | {label} | {:.2} | {:.0} | {} | {} | {} | {} |",
        p.total,
        n as f64 / p.total,
        f(p.gemm),
        f(p.attention),
        f(p.indexer),
        f(p.other())
    )
}

fn lens(args: &[String], default: &[usize]) -> Vec<usize> {
    let l: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    if l.is_empty() {
        default.to_vec()
    } else {
        l
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // As `sparrow` does at start-up.
    sparrow_cpu::mem::retain_freed_memory();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let isa = sparrow_cpu::Isa::detect();
    let head = "| N | attention | total s | tok/s | GEMM s | attention s | indexer s | other s |\n|---|---|---|---|---|---|---|---|";
    let chunk = env_num("CHUNK", 512);
    match args.first().map(String::as_str) {
        Some("llama") => {
            let path = args.get(1).ok_or("usage: prefill_bench llama MODEL.gguf [N ...]")?;
            let mut m = LlamaModel::load(std::path::Path::new(path), threads)?;
            let vocab = m.info().vocab_size;
            println!("{path}: {threads} threads, ISA {isa:?}, chunks of {chunk}\n\n{head}");
            for n in lens(&args[2..], &[512, 1024, 2048, 4096, 8192]) {
                let (pt, _) = prefill(&mut m, n, vocab);
                println!("{}", row(n, "tiled", &pt));
            }
        }
        Some("glm5") => {
            let dir = std::env::temp_dir().join(format!("sparrow-prefill-bench-{}", std::process::id()));
            let sd = sparrow_convert::toy::glm5_tiny_state_dict(0);
            let ex = sparrow_convert::toy::glm5_tiny_exclude();
            let t = quantize_state_dict(&sd, &ex, ScaleRule::Amax)?;
            write_checkpoint(
                &dir,
                sparrow_convert::toy::glm5_tiny_config(),
                &t,
                1,
                Some((&ex, QuantStyle::HfQuantConfig)),
            )?;
            println!("glm5-tiny: {threads} threads, ISA {isa:?}, chunks of {chunk}\n\n{head}");
            let load = |a: AttnImpl| {
                let o = Glm5Options { prefill_attn: a, decode_attn: a, moe: MoeChoice::Fixed(MoeImpl::ExpertMajor) };
                Glm5Model::load(&dir, threads, o)
            };
            let (mut sparse, mut dense) = (load(AttnImpl::Sparse)?, load(AttnImpl::Dense)?);
            let vocab = sparse.info().vocab_size;
            for n in lens(&args[1..], &[1024, 2048, 4096]) {
                let (ps, ls) = prefill(&mut sparse, n, vocab);
                println!("{}", row(n, "sparse", &ps));
                if std::env::var("KERNEL").is_ok_and(|k| k == "sparse") {
                    continue;
                }
                let (pd, ld) = prefill(&mut dense, n, vocab);
                println!("{}", row(n, "dense", &pd));
                assert!(ls.iter().zip(&ld).all(|(a, b)| a.to_bits() == b.to_bits()), "sparse and dense logits differ");
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
        _ => return Err("usage: prefill_bench (llama MODEL.gguf | glm5) [N ...]".into()),
    }
    Ok(())
}
