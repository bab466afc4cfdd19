//! Sparse (DSA top-k) against dense attention on glm5-tiny, at contexts of 1k–4k tokens.
//!
//! `cargo run --release -p sparrow-convert --example dsa_bench [-- 1024 2048 4096]`
//!
//! For each context length N: prefill N tokens in chunks of 512 (as the server does), then 32
//! DECODE steps, once with `--nsa-*-backend sparse` and once with `dense`; prints the wall time
//! of each phase, the attention key reads (query × head × key) each did, and the ratios, all
//! measured in one run. Both produce the same logits (checked here, bit for bit).

use std::time::Instant;

use sparrow_convert::quantize::{quantize_state_dict, write_checkpoint, QuantStyle};
use sparrow_cpu::format::nvfp4::ScaleRule;
use sparrow_engine::batch::{ForwardBatch, SeqMeta};
use sparrow_engine::kv::KvStore;
use sparrow_engine::model::glm5::{AttnImpl, Glm5Model, Glm5Options, MoeChoice, MoeImpl};
use sparrow_engine::model::Model;

const CHUNK: usize = 512;
const DECODE_STEPS: usize = 32;

fn batch(ids: &[u32], start: usize) -> ForwardBatch {
    let n = ids.len() - start;
    ForwardBatch {
        input_ids: ids[start..].to_vec(),
        positions: (start as u32..ids.len() as u32).collect(),
        out_cache_loc: (start as u32..ids.len() as u32).collect(),
        seqs: vec![SeqMeta {
            req_pool_idx: 0,
            prefix_len: start as u32,
            extend_len: n as u32,
            token_start: 0,
            num_logits: 1,
        }],
        kv_indptr: vec![0, ids.len() as u32],
        kv_indices: (0..ids.len() as u32).collect(),
        logits_rows: vec![n as u32 - 1],
    }
}

/// Returns (prefill s, decode s per step, attention key reads, last logits).
fn run(m: &mut Glm5Model, prompt: &[u32]) -> (f64, f64, u64, u64, Vec<f32>) {
    let mut kv = KvStore::new(m.attention_needs().kv_layout, prompt.len() + DECODE_STEPS + 1);
    let before = m.attn_stats();
    let t0 = Instant::now();
    let mut logits = Vec::new();
    let mut done = 0;
    while done < prompt.len() {
        let end = (done + CHUNK).min(prompt.len());
        logits = m.forward(&batch(&prompt[..end], done), &mut kv).expect("prefill");
        done = end;
    }
    let prefill = t0.elapsed().as_secs_f64();
    let mid = m.attn_stats();
    let mut ids = prompt.to_vec();
    let t1 = Instant::now();
    for _ in 0..DECODE_STEPS {
        let next = logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |x| x.0) as u32;
        ids.push(next);
        logits = m.forward(&batch(&ids, ids.len() - 1), &mut kv).expect("decode");
    }
    let decode = t1.elapsed().as_secs_f64() / DECODE_STEPS as f64;
    let end = m.attn_stats();
    (prefill, decode, mid.attn_keys - before.attn_keys, end.attn_keys - mid.attn_keys, logits)
}

fn main() {
    // As `sparrow` does at start-up.
    sparrow_cpu::mem::retain_freed_memory();
    let lens: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let lens = if lens.is_empty() { vec![1024, 2048, 4096] } else { lens };
    let dir = std::env::temp_dir().join(format!("sparrow-dsa-bench-{}", std::process::id()));
    let sd = sparrow_convert::toy::glm5_tiny_state_dict(0);
    let ex = sparrow_convert::toy::glm5_tiny_exclude();
    let t = quantize_state_dict(&sd, &ex, ScaleRule::Amax).expect("quantize");
    write_checkpoint(&dir, sparrow_convert::toy::glm5_tiny_config(), &t, 1, Some((&ex, QuantStyle::HfQuantConfig)))
        .expect("write");
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load = |a: AttnImpl| {
        let o = Glm5Options { prefill_attn: a, decode_attn: a, moe: MoeChoice::Fixed(MoeImpl::ExpertMajor) };
        Glm5Model::load(&dir, threads, o).expect("load")
    };
    let (mut sparse, mut dense) = (load(AttnImpl::Sparse), load(AttnImpl::Dense));
    println!("glm5-tiny, index_topk 32, {threads} threads, prefill in chunks of {CHUNK}, {DECODE_STEPS} decode steps");
    println!("| context | prefill sparse s | prefill dense s | ratio | decode sparse ms/step | decode dense ms/step | ratio | attn keys prefill sparse/dense | attn keys decode sparse/dense |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for n in lens {
        // Deterministic pseudo-text ids.
        let prompt: Vec<u32> = (0..n as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 16) % 49_000 + 100).collect();
        let (ps, ds, pks, dks, ls) = run(&mut sparse, &prompt);
        let (pd, dd, pkd, dkd, ld) = run(&mut dense, &prompt);
        assert!(ls.iter().zip(&ld).all(|(a, b)| a.to_bits() == b.to_bits()), "sparse and dense logits differ");
        println!(
            "| {n} | {ps:.3} | {pd:.3} | {:.2}× | {:.2} | {:.2} | {:.2}× | {:.3} | {:.3} |",
            pd / ps,
            ds * 1e3,
            dd * 1e3,
            dd / ds,
            pks as f64 / pkd as f64,
            dks as f64 / dkd as f64
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
