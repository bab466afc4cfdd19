//! `sparrow roofline`: the limits of this machine (clock, memory bandwidth, 8-bit and f32 peaks
//! of each ISA path, measured beside their theoretical values), the loaded model's decode
//! rooflines, and what the matmul kernels reach against them.
//!
//! Rooflines (Williams, Waterman, Patterson, "Roofline", CACM 2009): a single-stream decode step
//! must read every weight once, so it cannot beat `bandwidth / weight bytes` steps per second;
//! a batched step of B rows does `B · MACs per token` 8-bit products, so it cannot beat
//! `8-bit peak / MACs per token` tokens per second.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use sparrow_cpu::roofline::{self, Limits};
use sparrow_cpu::{Isa, ThreadPool, Weight};
use sparrow_engine::model::llama::LlamaModel;

/// Flags of `sparrow roofline`.
#[derive(Debug, clap::Args)]
pub struct RooflineArgs {
    /// Llama-family GGUF model (default: SmolLM2-135M-Instruct Q4_1, fetched on first use).
    #[arg(long)]
    pub model_path: Option<PathBuf>,
    /// Threads (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Token counts the kernels are timed at.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    pub tokens: Vec<usize>,
    /// Buffer streamed by the bandwidth test, MiB (several times the last-level cache).
    #[arg(long, default_value_t = 512)]
    pub bandwidth_mib: usize,
    /// Time every SIMD path this CPU has, not only the one the server would pick.
    #[arg(long)]
    pub all_paths: bool,
    /// Tokens in the KV cache before the timed decode steps.
    #[arg(long, default_value_t = 256)]
    pub context: usize,
}

/// `sparrow roofline`.
///
/// # Errors
/// Model loading failures.
pub fn roofline(a: &RooflineArgs) -> anyhow::Result<()> {
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let model_path = match &a.model_path {
        Some(p) => p.clone(),
        None => sparrow_assets::ensure(sparrow_assets::SMOLLM2_GGUF).context("fetching the default model")?,
    };
    let pool = ThreadPool::new(threads).context("thread pool")?;
    let (vendor, family, model) = roofline::cpu_id();
    let isas: Vec<&str> = Isa::available().iter().map(|i| i.name()).collect();
    println!(
        "CPU: {} ({vendor} family {family:#x} model {model:#x}), {threads} threads; kernels: {} (paths here: {})",
        roofline::cpu_name(),
        Isa::detect().name(),
        isas.join(", ")
    );
    let l = roofline::measure(&pool, a.bandwidth_mib << 20);
    print_limits(&l, a.bandwidth_mib);

    let t0 = Instant::now();
    let mut m = LlamaModel::load(&model_path, threads).with_context(|| format!("loading {}", model_path.display()))?;
    let mats = m.decode_matrices();
    let bytes: usize = mats.iter().map(|(_, w)| w.bytes()).sum();
    let macs: usize = mats.iter().map(|(_, w)| w.rows() * w.cols()).sum();
    println!(
        "\nmodel {} (loaded in {:.1} s): a decode step reads {:.1} MB of weights and does {:.1} M MACs per token",
        model_path.display(),
        t0.elapsed().as_secs_f64(),
        bytes as f64 / 1e6,
        macs as f64 / 1e6
    );
    let isa = Isa::detect();
    let peak = l.int8_gmacs(isa);
    println!(
        "  decode roofline (bandwidth / weight bytes): {:.0} steps/s = {:.1} ms per single-stream token",
        l.bandwidth_gbs * 1e9 / bytes as f64,
        bytes as f64 / (l.bandwidth_gbs * 1e9) * 1e3
    );
    println!(
        "  batched compute roofline ({} 8-bit peak / MACs per token): {:.0} tok/s",
        isa.name(),
        peak * 1e9 / macs as f64
    );

    decode_split(&mut m, &l, bytes, a.context)?;
    let mats = m.decode_matrices();

    let paths: Vec<Isa> =
        if a.all_paths { Isa::available().into_iter().filter(|i| *i != Isa::Scalar).collect() } else { vec![isa] };
    for isa in paths {
        kernels(&pool, isa, &l, &mats, &a.tokens);
    }
    Ok(())
}

/// Times 32 single-sequence decode steps of the real model after a `context`-token prefill, and
/// prints the step against the bandwidth bound and its time split: matmuls by weight type (a
/// fused projection of two types split by bytes), attention, and everything else (norms, RoPE,
/// activations, embedding, the pool's hand-offs).
fn decode_split(m: &mut LlamaModel, l: &Limits, bytes: usize, context: usize) -> anyhow::Result<()> {
    use sparrow_engine::batch::ForwardBatch;
    use sparrow_engine::kv::KvStore;
    use sparrow_engine::model::{Model, GEMM_KINDS};
    const STEPS: usize = 32;
    let vocab = m.info().vocab_size as u64;
    let mut seq: Vec<u32> = (0..context.max(1) as u64).map(|i| ((i * 2_654_435_761 + 17) % vocab) as u32).collect();
    let mut kv = KvStore::new(m.attention_needs().kv_layout, seq.len() + STEPS + 8);
    let mut done = 0;
    // Warm-up: the prefill, and two decode steps outside the timing.
    for _ in 0..3 {
        let logits = m.forward(&ForwardBatch::single_sequence(&seq, done), &mut kv)?;
        done = seq.len();
        seq.push(sparrow_engine::sampler::argmax(&logits));
    }
    m.set_profile(true);
    for _ in 0..STEPS {
        let logits = m.forward(&ForwardBatch::single_sequence(&seq, done), &mut kv)?;
        done = seq.len();
        seq.push(sparrow_engine::sampler::argmax(&logits));
    }
    let p = m.part_times();
    m.set_profile(false);
    let n = STEPS as f64;
    let step = p.total / n;
    let bound = bytes as f64 / (l.bandwidth_gbs * 1e9);
    println!(
        "  decode step (one sequence, {} to {} tokens of context): {:.1} ms = {:.1} tok/s, {:.0} % of the bound ({:.1} ms)",
        context,
        context + STEPS,
        step * 1e3,
        1.0 / step,
        100.0 * bound / step,
        bound * 1e3
    );
    let mut kinds: Vec<String> = Vec::new();
    for (k, t) in GEMM_KINDS.iter().zip(p.gemm_by_kind) {
        if t > 0.0 {
            kinds.push(format!("{k} {:.2} ms", t / n * 1e3));
        }
    }
    println!(
        "    matmuls {:.2} ms ({:.1} GB/s: {}); attention {:.2} ms; other {:.2} ms",
        p.gemm / n * 1e3,
        bytes as f64 / (p.gemm / n) / 1e9,
        kinds.join(", "),
        p.attention / n * 1e3,
        p.other() / n * 1e3
    );
    Ok(())
}

fn print_limits(l: &Limits, mib: usize) {
    let idiom = |l: &Limits| {
        if l.avx2_idiom_gmacs > 0.0 {
            println!(
                "8-bit avx2 idiom vpmaddubsw + vpaddw (exact i16 accumulation, what the AVX2 kernel issues): {:.0} GMAC/s measured",
                l.avx2_idiom_gmacs
            );
        }
    };
    match l.clock_ghz {
        Some(c) => println!("clock: {c:.2} GHz (dependent 64-bit imul chain, 3 cycles each, one thread)"),
        None => println!(
            "clock: cannot be measured here (an imul chain gave an implausible rate); theoretical peaks omitted"
        ),
    }
    println!("memory bandwidth: {:.1} GB/s (streaming read of {mib} MiB, {} threads)", l.bandwidth_gbs, l.threads);
    if l.fma_gflops > 0.0 {
        println!(
            "f32 FMA: {:.0} GFLOP/s measured, {:.0} theoretical ({:.0} %)",
            l.fma_gflops,
            l.fma_theory_gflops,
            100.0 * l.fma_gflops / l.fma_theory_gflops
        );
    }
    for p in &l.int8 {
        if p.theory_gmacs <= 0.0 {
            println!("8-bit {:<11} {}: {:.0} GMAC/s measured", p.isa.name(), p.instruction, p.gmacs);
            continue;
        }
        println!(
            "8-bit {:<11} {}: {:.0} GMAC/s measured, {:.0} theoretical at {} per cycle per core ({:.0} %)",
            p.isa.name(),
            p.instruction,
            p.gmacs,
            p.theory_gmacs,
            p.per_cycle,
            100.0 * p.gmacs / p.theory_gmacs.max(1e-9)
        );
    }
    idiom(l);
}

/// Times layer 0's matrices and the LM head at every token count, and the whole decode step's
/// matmuls (every layer: weights stream from memory) at every token count.
fn kernels(pool: &ThreadPool, isa: Isa, l: &Limits, mats: &[(String, &Weight)], tokens: &[usize]) {
    let peak = l.int8_gmacs(isa).max(l.int8_gmacs(Isa::Avx2));
    let theory = l.int8.iter().find(|p| p.isa == isa).map_or(0.0, |p| p.theory_gmacs);
    println!(
        "\nkernels, {} path ({} threads); % of the measured 8-bit peak {peak:.0} GMAC/s and of theory {theory:.0}{}",
        isa.name(),
        pool.threads(),
        if isa == Isa::Avx2 { format!("; AVX2 idiom peak {:.0} GMAC/s", l.avx2_idiom_gmacs) } else { String::new() }
    );
    println!(
        "{:<10} {:>12} {:>5} {:>6} {:>10} {:>8} {:>6} {:>7} {:>7} {:>5}",
        "matrix", "shape", "type", "T", "time", "GMAC/s", "%peak", "%theory", "GB/s", "%bw"
    );
    let one_layer = mats.iter().filter(|(n, _)| n.starts_with("blk.0.") || n == "lm_head");
    for (name, w) in one_layer {
        for &t in tokens {
            let s = roofline::time_matmul(pool, isa, w, t);
            row(name.trim_start_matches("blk.0."), w, t, s, w.rows() * w.cols(), w.bytes(), peak, theory, l);
        }
    }
    // The whole step: every matrix once per token count, so T = 1 streams all the weights.
    let bytes: usize = mats.iter().map(|(_, w)| w.bytes()).sum();
    let macs: usize = mats.iter().map(|(_, w)| w.rows() * w.cols()).sum();
    for &t in tokens {
        let kmax = mats.iter().map(|(_, w)| w.cols()).max().unwrap_or(0);
        let nmax = mats.iter().map(|(_, w)| w.rows()).max().unwrap_or(0);
        let x: Vec<f32> = (0..t * kmax).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect();
        let mut out = vec![0f32; t * nmax];
        let mut xq = sparrow_cpu::format::ggml::QActs::default();
        let mut best = f64::INFINITY;
        for _ in 0..4 {
            let t0 = Instant::now();
            for (_, w) in mats {
                let (k, n) = (w.cols(), w.rows());
                sparrow_cpu::kernels::matmul(pool, isa, w, &x[..t * k], t, &mut xq, &mut out[..t * n]);
            }
            best = best.min(t0.elapsed().as_secs_f64());
        }
        let first = mats.first().map(|(_, w)| *w);
        if let Some(w) = first {
            row("all", w, t, best, macs, bytes, peak, theory, l);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn row(name: &str, w: &Weight, t: usize, secs: f64, macs: usize, bytes: usize, peak: f64, theory: f64, l: &Limits) {
    let gmacs = (macs * t) as f64 / secs / 1e9;
    let gbs = bytes as f64 / secs / 1e9;
    let ty = w.kind();
    let shape = if name == "all" { "step".to_string() } else { format!("{}x{}", w.rows(), w.cols()) };
    println!(
        "{:<10} {:>12} {:>5} {:>6} {:>8.3}ms {:>8.1} {:>6.0} {:>7.0} {:>7.1} {:>5.0}",
        name,
        shape,
        ty,
        t,
        secs * 1e3,
        gmacs,
        100.0 * gmacs / peak.max(1e-9),
        100.0 * gmacs / theory.max(1e-9),
        gbs,
        100.0 * gbs / l.bandwidth_gbs.max(1e-9)
    );
}
