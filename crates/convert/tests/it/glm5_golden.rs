//! GLM-5 (glm5-tiny, NVFP4 experts) against HF transformers' `GlmMoeDsaForCausalLM`.
//!
//! The fixture comes from `scripts/goldens/reference_glm5.py`, which dequantizes the checkpoint on its
//! own and runs HF's float32 forward: logits at several prefill positions (before, at and past
//! the indexer's top-k of 32) and at each of 6 greedy decode steps through HF's KV cache.
//! Here the same checkpoint is regenerated from its seed, loaded through the safetensors/NVFP4
//! loader, and run through a paged cache with page sizes 1 and 64 (pages deliberately out of
//! order), the prompt split into two prefill chunks, then one DECODE step per token.
//!
//! Tolerance: |Δlogit| ≤ 1e-4 on every stored logit (observed: 5.7e-6) (both sides are f32; the remaining
//! difference is summation order and the NVFP4 scale product's rounding; the observed maximum
//! is printed).

use std::path::Path;

use serde_json::Value;
use sparrow_convert::quantize::{quantize_state_dict, write_checkpoint, QuantStyle};
use sparrow_convert::toy;
use sparrow_cpu::format::nvfp4::ScaleRule;
use sparrow_engine::batch::{ForwardBatch, SeqMeta};
use sparrow_engine::checkpoint::hf::Checkpoint;
use sparrow_engine::kv::KvStore;
use sparrow_engine::model::glm5::{AttnImpl, Glm5Model, Glm5Options, MoeChoice, MoeImpl};
use sparrow_engine::model::Model;

const TOL: f32 = 1e-4;

fn golden() -> Value {
    let text = include_str!("../fixtures/glm5_tiny_golden.json");
    serde_json::from_str(text).expect("fixture parses")
}

fn write_toy(dir: &Path, seed: u64, style: QuantStyle, shards: usize) {
    let sd = toy::glm5_tiny_state_dict(seed);
    let ex = toy::glm5_tiny_exclude();
    let t = quantize_state_dict(&sd, &ex, ScaleRule::Amax).expect("quantize");
    write_checkpoint(dir, toy::glm5_tiny_config(), &t, shards, Some((&ex, style))).expect("write");
}

/// The slot of position `p` when a sequence's pages are `pages`.
fn slot(pages: &[u32], page: usize, p: usize) -> u32 {
    pages[p / page] * page as u32 + (p % page) as u32
}

/// A sequence in a batch: ids so far, new-token count, page list, rows whose logits are wanted.
type SeqSpec<'a> = (&'a [u32], usize, &'a [u32], Vec<usize>);

/// One batch of several sequences: `(ids of the sequence so far, new-token count, page list,
/// rows wanted)`; returns per sequence the logits of its wanted rows.
fn run(m: &mut Glm5Model, kv: &mut KvStore, page: usize, seqs: &[SeqSpec<'_>]) -> Vec<Vec<Vec<f32>>> {
    let mut b = ForwardBatch::default();
    let mut wanted = Vec::new();
    for (i, (ids, new, pages, rows)) in seqs.iter().enumerate() {
        let start = ids.len() - new;
        let token_start = b.input_ids.len() as u32;
        for p in start..ids.len() {
            b.input_ids.push(ids[p]);
            b.positions.push(p as u32);
            b.out_cache_loc.push(slot(pages, page, p));
        }
        b.seqs.push(SeqMeta {
            req_pool_idx: i as u32,
            prefix_len: start as u32,
            extend_len: *new as u32,
            token_start,
            num_logits: 1,
        });
        if b.kv_indptr.is_empty() {
            b.kv_indptr.push(0);
        }
        b.kv_indices.extend((0..ids.len()).map(|p| slot(pages, page, p)));
        b.kv_indptr.push(b.kv_indices.len() as u32);
        for &r in rows {
            b.logits_rows.push(token_start + (r - start) as u32);
            wanted.push(i);
        }
    }
    let logits = m.forward(&b, kv).expect("forward");
    let v = m.info().vocab_size;
    let mut out = vec![Vec::new(); seqs.len()];
    for (j, &i) in wanted.iter().enumerate() {
        out[i].push(logits[j * v..(j + 1) * v].to_vec());
    }
    out
}

fn compare(want: &Value, got: &[f32], what: &str, worst: &mut f32) {
    let ids = want["ids"].as_array().expect("ids");
    let vals = want["logits"].as_array().expect("logits");
    for (id, w) in ids.iter().zip(vals) {
        let (id, w) = (id.as_u64().expect("id") as usize, w.as_f64().expect("logit") as f32);
        let d = (got[id] - w).abs();
        *worst = worst.max(d);
        assert!(d <= TOL, "{what}: logit of token {id} is {} vs HF {w} (|Δ| {d} > {TOL})", got[id]);
    }
    let argmax = got.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|x| x.0).expect("vocab");
    assert_eq!(argmax as u64, want["argmax"].as_u64().expect("argmax"), "{what}: greedy token differs");
}

/// Prefill (two chunks) + decode of every golden prompt; returns the largest |Δ|.
fn check_against_hf(m: &mut Glm5Model, page: usize) -> f32 {
    let g = golden();
    let mut worst = 0f32;
    for (ci, case) in g["cases"].as_array().expect("cases").iter().enumerate() {
        let prompt: Vec<u32> =
            case["prompt_ids"].as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect();
        let decode = case["decode"].as_array().expect("decode");
        let total = prompt.len() + decode.len();
        let n_pages = total.div_ceil(page);
        // Pages out of order and away from 0: page i → 2·(n − i) + 1.
        let pages: Vec<u32> = (0..n_pages).map(|i| (2 * (n_pages - i) + 1) as u32).collect();
        let mut kv = KvStore::new(m.attention_needs().kv_layout, (2 * n_pages + 2) * page);
        let prefill = case["prefill"].as_array().expect("prefill");
        let split = prompt.len() / 2;
        let mut all = prompt.clone();
        for (lo, hi) in [(0, split), (split, prompt.len())] {
            let rows: Vec<usize> = prefill
                .iter()
                .map(|p| p["position"].as_u64().expect("pos") as usize)
                .filter(|&p| p >= lo && p < hi)
                .collect();
            let out = run(m, &mut kv, page, &[(&all[..hi], hi - lo, &pages, rows.clone())]);
            for (r, logits) in rows.iter().zip(&out[0]) {
                let want = prefill.iter().find(|p| p["position"].as_u64() == Some(*r as u64)).expect("row");
                compare(want, logits, &format!("page {page}, prompt {ci}, prefill position {r}"), &mut worst);
            }
        }
        for (s, step) in decode.iter().enumerate() {
            all.push(step["token"].as_u64().expect("token") as u32);
            let last = all.len() - 1;
            let out = run(m, &mut kv, page, &[(&all, 1, &pages, vec![last])]);
            compare(step, &out[0][0], &format!("page {page}, prompt {ci}, decode step {s}"), &mut worst);
        }
    }
    worst
}

fn load(dir: &Path, prefill: AttnImpl, decode: AttnImpl, moe: MoeImpl) -> Glm5Model {
    let opts = Glm5Options { prefill_attn: prefill, decode_attn: decode, moe: MoeChoice::Fixed(moe) };
    Glm5Model::load(dir, 2, opts).expect("load glm5-tiny")
}

#[test]
fn glm5_tiny_matches_hf_transformers() {
    let g = golden();
    let seed = g["gen_model_seed"].as_u64().expect("seed");
    let tmp = tempfile::tempdir().expect("tmp");
    write_toy(tmp.path(), seed, QuantStyle::HfQuantConfig, 2);
    // The regenerated checkpoint is the one the goldens were made from.
    let ck = Checkpoint::open(tmp.path()).expect("open");
    for (name, want) in g["weight_sums"].as_object().expect("sums") {
        let module = name.strip_suffix(".weight").expect("weight");
        let (rows, cols) = match ck.raw(name).expect("tensor").shape.as_slice() {
            [r, c] if ck.has(&format!("{module}.weight_scale")) => (*r, 2 * c),
            [r, c] => (*r, *c),
            s => panic!("{name}: shape {s:?}"),
        };
        let sum: f64 = if module == "model.embed_tokens" {
            ck.f32(name).expect("embed").1.iter().map(|&v| v as f64).sum()
        } else {
            let w = ck.linear(module, rows, cols).expect("linear");
            let mut row = vec![0f32; cols];
            (0..rows)
                .map(|r| {
                    w.row_f32(r, &mut row);
                    row.iter().map(|&v| v as f64).sum::<f64>()
                })
                .sum()
        };
        let want = want.as_f64().expect("sum");
        assert!((sum - want).abs() <= 1e-6 * want.abs().max(1.0), "{name}: sum {sum} vs the fixture's {want}");
    }
    let mut m = load(tmp.path(), AttnImpl::Sparse, AttnImpl::Sparse, MoeImpl::ExpertMajor);
    let w1 = check_against_hf(&mut m, 1);
    let st = m.attn_stats();
    assert!(st.queries_sparse > 0 && st.queries_dense > 0, "both the sparse and the within-top-k path ran: {st:?}");
    let mut m = load(tmp.path(), AttnImpl::Dense, AttnImpl::Sparse, MoeImpl::TokenMajor);
    let w64 = check_against_hf(&mut m, 64);
    eprintln!("largest |logit − HF| page 1: {w1:.2e}, page 64: {w64:.2e} (tolerance {TOL})");
}

/// Sparse and dense attention, token- and expert-major MoE, and batching all prompts together
/// give bit-identical logits (each is a different order of work, not of arithmetic).
#[test]
fn implementations_and_batching_are_bit_identical() {
    let g = golden();
    let tmp = tempfile::tempdir().expect("tmp");
    // The other quant-config style and a single shard: the loader reads both.
    write_toy(tmp.path(), g["gen_model_seed"].as_u64().expect("seed"), QuantStyle::ConfigJson, 1);
    assert!(!tmp.path().join("hf_quant_config.json").exists());
    let prompts: Vec<Vec<u32>> = g["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| c["prompt_ids"].as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect())
        .collect();
    let page = 16;
    let per_seq_pages = 8;
    let pages: Vec<Vec<u32>> =
        (0..prompts.len()).map(|i| (0..per_seq_pages).map(|j| (j * prompts.len() + i + 1) as u32).collect()).collect();
    let slots = (per_seq_pages * prompts.len() + 2) * page;
    let mut results = Vec::new();
    for (pa, moe, batched) in [
        (AttnImpl::Sparse, MoeImpl::ExpertMajor, false),
        (AttnImpl::Dense, MoeImpl::ExpertMajor, false),
        (AttnImpl::Sparse, MoeImpl::TokenMajor, false),
        (AttnImpl::Sparse, MoeImpl::ExpertMajor, true),
    ] {
        let mut m = load(tmp.path(), pa, pa, moe);
        let mut kv = KvStore::new(m.attention_needs().kv_layout, slots);
        let mut out = Vec::new();
        if batched {
            let seqs: Vec<SeqSpec<'_>> =
                prompts.iter().zip(&pages).map(|(p, pg)| (&p[..], p.len(), &pg[..], (0..p.len()).collect())).collect();
            for r in run(&mut m, &mut kv, page, &seqs) {
                out.extend(r);
            }
        } else {
            for (p, pg) in prompts.iter().zip(&pages) {
                out.extend(run(&mut m, &mut kv, page, &[(&p[..], p.len(), &pg[..], (0..p.len()).collect())]).remove(0));
            }
        }
        results.push(out);
    }
    for (i, r) in results.iter().enumerate().skip(1) {
        assert_eq!(r.len(), results[0].len());
        for (row, (a, b)) in results[0].iter().zip(r).enumerate() {
            assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "variant {i}, row {row} differs");
        }
    }
}
