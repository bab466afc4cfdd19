//! Where a forward of a GGUF model goes (meant for MoE files, any family works): `moe_forward
//! MODEL.gguf [PREFILL_TOKENS] [DECODE_ROWS] [ROUNDS]` times a prefill of one sequence and a
//! decode step of `DECODE_ROWS` sequences (256 cached tokens each), and prints per step the
//! wall time, the matmuls' share (experts, router, attention projections, head), attention, and
//! the rest (norms, routing, gathering, activations, the combine): the parts the profile
//! (`Model::set_profile`) splits a step into. Best of the rounds.
use std::time::Instant;

use sparrow_engine::batch::{ForwardBatch, SeqMeta};
use sparrow_engine::kv::KvStore;
use sparrow_engine::model::glm5::{Glm5Model, Glm5Options, GGUF_ARCH as DEEPSEEK2};
use sparrow_engine::model::llama::LlamaModel;
use sparrow_engine::model::load::gguf_architecture;
use sparrow_engine::model::{Model, PartTimes, GEMM_KINDS};

/// `rows` sequences of `prefix` cached tokens each, one new token each.
fn decode_batch(rows: usize, prefix: usize) -> ForwardBatch {
    let mut b = ForwardBatch::default();
    let per = prefix + 1;
    for i in 0..rows {
        let base = (i * per + 1) as u32;
        b.input_ids.push((i * 7919 % 1000) as u32);
        b.positions.push(prefix as u32);
        b.out_cache_loc.push(base + prefix as u32);
        b.seqs.push(SeqMeta {
            req_pool_idx: i as u32,
            prefix_len: prefix as u32,
            extend_len: 1,
            token_start: i as u32,
            num_logits: 1,
        });
        b.kv_indptr.push((i * per) as u32);
        b.kv_indices.extend(base..base + per as u32);
        b.logits_rows.push(i as u32);
    }
    b.kv_indptr.push((rows * per) as u32);
    b
}

fn run(m: &mut dyn Model, label: &str, batch: &ForwardBatch, kv: &mut KvStore, rounds: usize) {
    let mut best: Option<(f64, PartTimes)> = None;
    for _ in 0..rounds {
        m.set_profile(true);
        let t0 = Instant::now();
        m.forward(batch, kv).expect("forward");
        let wall = t0.elapsed().as_secs_f64();
        let pt = m.part_times();
        if best.as_ref().is_none_or(|(w, _)| wall < *w) {
            best = Some((wall, pt));
        }
    }
    let Some((wall, pt)) = best else { return };
    let ms = |s: f64| s * 1e3;
    let kinds: Vec<String> = GEMM_KINDS
        .iter()
        .zip(pt.gemm_by_kind)
        .filter(|(_, t)| *t > 0.0)
        .map(|(k, t)| format!("{k} {:.1}", ms(t)))
        .collect();
    println!(
        "{label}: {:.1} ms ({:.1} tok/s): matmuls {:.1} ms ({}), attention {:.1} ms, rest {:.1} ms",
        ms(wall),
        batch.num_tokens() as f64 / wall,
        ms(pt.gemm),
        kinds.join(", "),
        ms(pt.attention),
        ms(wall - pt.gemm - pt.attention)
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect("usage: moe_forward MODEL.gguf [PREFILL_TOKENS] [DECODE_ROWS] [ROUNDS]");
    let prefill: usize = args.get(2).map_or(512, |s| s.parse().expect("tokens"));
    let rows: usize = args.get(3).map_or(16, |s| s.parse().expect("rows"));
    let rounds: usize = args.get(4).map_or(5, |s| s.parse().expect("rounds"));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let p = std::path::Path::new(path);
    // `deepseek2` files run on GLM-5's MLA model, the rest on the Llama decoder.
    let (mut m, isa): (Box<dyn Model>, &str) = if gguf_architecture(p).expect("GGUF") == DEEPSEEK2 {
        let m = Glm5Model::load_gguf(p, threads, Glm5Options::default()).expect("model");
        let isa = m.isa().name();
        (Box::new(m), isa)
    } else {
        let m = LlamaModel::load(p, threads).expect("model");
        let isa = m.isa().name();
        (Box::new(m), isa)
    };
    println!("{} ({}), kernels {isa}, {threads} threads", path, m.info().architecture);
    let prefix = 256;
    let slots = (prefill + 1).max(rows * (prefix + 1) + 1);
    let mut kv = KvStore::new(m.attention_needs().kv_layout, slots);
    let ids: Vec<u32> = (0..prefill as u32).map(|i| i * 7919 % 1000).collect();
    run(m.as_mut(), &format!("prefill {prefill}"), &ForwardBatch::single_sequence(&ids, 0), &mut kv, rounds);
    run(m.as_mut(), &format!("decode {rows} rows"), &decode_batch(rows, prefix), &mut kv, rounds);
    run(m.as_mut(), "decode 1 row", &decode_batch(1, prefix), &mut kv, rounds);
}
