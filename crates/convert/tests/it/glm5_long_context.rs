//! GLM-5 past one key block: glm5-tiny with the indexer's top-k raised to 160, a 400-token
//! prompt, so every path of the tiled MLA and indexer scoring runs across several 128-key
//! blocks (dense rows over key blocks, rows that attend to more than 128 selected or leading
//! keys, index scores of several blocks). The logits must be the same bits whether the prompt
//! is prefilled in chunks of 128 or at once, and with the sparse or the dense backend, through
//! three greedy DECODE steps.

use sparrow_convert::quantize::{quantize_state_dict, write_checkpoint, QuantStyle};
use sparrow_convert::toy;
use sparrow_cpu::format::nvfp4::ScaleRule;
use sparrow_engine::batch::ForwardBatch;
use sparrow_engine::kv::KvStore;
use sparrow_engine::model::glm5::{AttnImpl, Glm5Model, Glm5Options, MoeChoice, MoeImpl};
use sparrow_engine::model::Model;

const TOPK: u64 = 160;
const PROMPT: usize = 400;

/// Logits of the last prefill position and of 3 greedy decode steps.
fn run(m: &mut Glm5Model, ids: &[u32], chunk: usize) -> Vec<Vec<f32>> {
    let mut kv = KvStore::new(m.attention_needs().kv_layout, ids.len() + 4);
    let mut ids = ids.to_vec();
    let mut done = 0;
    let mut logits = Vec::new();
    while done < ids.len() {
        let end = (done + chunk).min(ids.len());
        logits = m.forward(&ForwardBatch::single_sequence(&ids[..end], done), &mut kv).expect("prefill");
        done = end;
    }
    let mut out = vec![logits.clone()];
    for _ in 0..3 {
        let next = logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |x| x.0) as u32;
        ids.push(next);
        logits = m.forward(&ForwardBatch::single_sequence(&ids, ids.len() - 1), &mut kv).expect("decode");
        out.push(logits.clone());
    }
    out
}

fn same(a: &[Vec<f32>], b: &[Vec<f32>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()))
}

#[test]
fn chunking_and_backends_agree_across_key_blocks() {
    let dir = std::env::temp_dir().join(format!("sparrow-glm5-long-{}", std::process::id()));
    let mut cfg = toy::glm5_tiny_config();
    cfg["index_topk"] = TOPK.into();
    let sd = toy::glm5_tiny_state_dict(3);
    let ex = toy::glm5_tiny_exclude();
    let t = quantize_state_dict(&sd, &ex, ScaleRule::Amax).expect("quantize");
    write_checkpoint(&dir, cfg, &t, 1, Some((&ex, QuantStyle::HfQuantConfig))).expect("write");
    let ids: Vec<u32> = (0..PROMPT as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 16) % 49_000 + 100).collect();
    let mut results = Vec::new();
    for imp in [AttnImpl::Sparse, AttnImpl::Dense] {
        let opts = Glm5Options { prefill_attn: imp, decode_attn: imp, moe: MoeChoice::Fixed(MoeImpl::ExpertMajor) };
        let mut m = Glm5Model::load(&dir, 2, opts).expect("load");
        assert_eq!(m.config().idx_topk as u64, TOPK);
        let chunked = run(&mut m, &ids, 128);
        let whole = run(&mut m, &ids, PROMPT);
        assert!(chunked[0].iter().all(|x| x.is_finite()), "{imp:?}: non-finite logits");
        assert!(same(&chunked, &whole), "{imp:?}: chunks of 128 and one chunk differ");
        results.push(chunked);
    }
    assert!(same(&results[0], &results[1]), "sparse and dense differ");
    let _ = std::fs::remove_dir_all(&dir);
}
