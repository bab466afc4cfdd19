//! Synthetic Hugging Face checkpoints of the hybrid families beside their GGUF twins, the GGUF
//! made from the checkpoint as llama.cpp's converter makes it (`conversion/qwen.py`'s
//! `Qwen3NextModel` and `_LinearAttentionVReorderBase`, `conversion/mamba.py` for Nemotron-H):
//!
//! - `qwen3_5` (a multimodal config, the language model under `model.language_model`): HF's
//!   zero-centred RMSNorm weights (`x · (1 + w)`) become `w + 1`, all but the gated norm of the
//!   Gated DeltaNet layers; `A_log` becomes `A = −exp(A_log)`; the conv weight `[C, 1, K]` is
//!   squeezed; the value heads, grouped by key head in HF, are tiled (4 value heads over 2 key
//!   heads). Only the output projection's columns change order, so the twins' logits agree to
//!   rounding, not bit for bit; a copy read with the other grouping must be far off.
//! - `qwen3_5_moe`: the same, with experts one tensor each and fused as transformers 5 stores
//!   them (`mlp.experts.gate_up_proj`, `down_proj`), a shared expert `mlp.shared_expert` under
//!   `mlp.shared_expert_gate`; a copy with each expert's gate and up rows swapped must be far off.
//! - `qwen3_next` (root `model`): the value heads stay grouped; `in_proj_qkvz`, per key head
//!   `[q, k, v, z]`, becomes `attn_qkv` and `attn_gate`; `in_proj_ba` is `ssm_ba` as it is; a
//!   twin whose `in_proj_qkvz` was split as if not interleaved must be far off.
//! - `nemotron_h` (root `backbone`, one `norm` and one `mixer` per block): `A_log` as above, the
//!   conv weight squeezed, the same bits in both.

use sparrow_engine::model::llama::LlamaModel;
use sparrow_engine::model::Model;

use crate::hf_twins::{check_twins, gguf_tensors, run, values, write_hf, VOCAB, W};
use crate::moe_families::{f32v, u32v, write_gguf, MetaValue};

const HIDDEN: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 32;
const FFN: usize = 96;
const CTX: usize = 256;
const EPS: f32 = 1e-6;
const LAYERS: usize = 4;
const CONV: usize = 4;
const DK: usize = 16;
const K_HEADS: usize = 2;
const V_HEADS: usize = 4;
const INNER: usize = V_HEADS * DK;
const CONV_DIM: usize = 2 * K_HEADS * DK + INNER;
const N_EXPERT: usize = 8;
const TOP_K: usize = 2;
const EXPERT_FFN: usize = 32;
const SHARED_FFN: usize = 48;

/// One tensor of the checkpoint: HF name, llama.cpp name, HF shape, value range, and how the
/// converter turns its values for the GGUF file.
struct T {
    hf: String,
    gguf: String,
    shape: Vec<usize>,
    span: (f32, f32),
    to_gguf: Conv,
}

/// What the converter does to a tensor's values.
#[derive(Clone, Copy)]
enum Conv {
    Same,
    /// Zero-centred RMSNorm weight: `w + 1`.
    PlusOne,
    /// `A = −exp(A_log)`, then value heads tiled (`rows` per head).
    NegExp {
        tile: bool,
    },
    /// Value heads tiled: from row `first` on, blocks of `rows` rows (`cols` wide).
    TileRows {
        first: usize,
        rows: usize,
        cols: usize,
    },
    /// Value heads tiled along the columns (`out_proj`: blocks of `DK` columns, `rows` rows).
    TileCols {
        rows: usize,
    },
}

/// Grouped-by-key-head order → tiled: block `(k, r)` (`k · R + r`) moves to `r · K + k`.
fn tiled_block(b: usize) -> usize {
    let r = V_HEADS / K_HEADS;
    (b % r) * K_HEADS + b / r
}

/// The converter's values of `t` from the checkpoint's `v`; `tile: false` leaves the value
/// heads in the checkpoint's order (the broken twin).
fn convert(t: &T, v: &[f32], tile: bool) -> Vec<f32> {
    let tile_rows = |v: &[f32], first: usize, rows: usize, cols: usize| {
        let mut out = v.to_vec();
        for b in 0..V_HEADS {
            let (src, dst) = ((first + b * rows) * cols, (first + tiled_block(b) * rows) * cols);
            out[dst..dst + rows * cols].copy_from_slice(&v[src..src + rows * cols]);
        }
        out
    };
    match t.to_gguf {
        Conv::Same => v.to_vec(),
        Conv::TileRows { .. } | Conv::TileCols { .. } if !tile => v.to_vec(),
        Conv::PlusOne => v.iter().map(|x| x + 1.0).collect(),
        Conv::NegExp { tile: heads } => {
            let a: Vec<f32> = v.iter().map(|x| -x.exp()).collect();
            if heads && tile {
                tile_rows(&a, 0, 1, 1)
            } else {
                a
            }
        }
        Conv::TileRows { first, rows, cols } => tile_rows(v, first, rows, cols),
        Conv::TileCols { rows } => {
            let mut out = v.to_vec();
            for r in 0..rows {
                for b in 0..V_HEADS {
                    let (src, dst) = (r * INNER + b * DK, r * INNER + tiled_block(b) * DK);
                    out[dst..dst + DK].copy_from_slice(&v[src..src + DK]);
                }
            }
            out
        }
    }
}

/// The checkpoint's tensors (`W` under HF names) and the GGUF twin's (converted values, the
/// value heads tiled unless `tile` is false).
fn both(ts: &[T], tile: bool) -> (Vec<W>, Vec<W>) {
    let mut hf = Vec::new();
    let mut gguf = Vec::new();
    for t in ts {
        let data = values(&t.hf, t.shape.iter().product(), t.span.0, t.span.1);
        // The GGUF file has the conv weight `[C, K]` where HF has `[C, 1, K]`.
        let gshape = match t.shape.as_slice() {
            [c, 1, k] => vec![*c, *k],
            // The shared expert's gate: HF `[1, hidden]`, llama.cpp `{hidden}`.
            [1, h] => vec![*h],
            s => s.to_vec(),
        };
        gguf.push(W { hf: t.hf.clone(), gguf: t.gguf.clone(), shape: gshape, data: convert(t, &data, tile) });
        hf.push(W { hf: t.hf.clone(), gguf: t.gguf.clone(), shape: t.shape.clone(), data });
    }
    (hf, gguf)
}

fn t(hf: String, gguf: &str, shape: &[usize], span: (f32, f32), to_gguf: Conv) -> T {
    T { hf, gguf: gguf.to_owned(), shape: shape.to_vec(), span, to_gguf }
}

/// Qwen3.5's tensors: layers 0 and 2 Gated DeltaNet, 1 and 3 gated attention, the language
/// model under `model.language_model`; with `moe`, Qwen3.5-MoE's: experts one tensor each
/// (the test fuses them as transformers 5 does), a shared expert under its gate.
fn qwen35_tensors(moe: bool) -> Vec<T> {
    let (w, n) = ((-0.4, 0.4), (-0.4, 0.4));
    let qd = HEADS * HEAD_DIM;
    let mut v = vec![t(
        "model.language_model.embed_tokens.weight".into(),
        "token_embd.weight",
        &[VOCAB, HIDDEN],
        (-1.0, 1.0),
        Conv::Same,
    )];
    for l in 0..LAYERS {
        let p = |s: &str| format!("model.language_model.layers.{l}.{s}");
        v.push(t(p("input_layernorm.weight"), &format!("blk.{l}.attn_norm.weight"), &[HIDDEN], n, Conv::PlusOne));
        let g = |s: &str| format!("blk.{l}.{s}");
        if l % 2 == 0 {
            let v_rows = Conv::TileRows { first: 2 * K_HEADS * DK, rows: DK, cols: HIDDEN };
            v.push(t(p("linear_attn.in_proj_qkv.weight"), &g("attn_qkv.weight"), &[CONV_DIM, HIDDEN], w, v_rows));
            let z = Conv::TileRows { first: 0, rows: DK, cols: HIDDEN };
            v.push(t(p("linear_attn.in_proj_z.weight"), &g("attn_gate.weight"), &[INNER, HIDDEN], w, z));
            let one = Conv::TileRows { first: 0, rows: 1, cols: HIDDEN };
            v.push(t(p("linear_attn.in_proj_b.weight"), &g("ssm_beta.weight"), &[V_HEADS, HIDDEN], w, one));
            v.push(t(p("linear_attn.in_proj_a.weight"), &g("ssm_alpha.weight"), &[V_HEADS, HIDDEN], w, one));
            let conv = Conv::TileRows { first: 2 * K_HEADS * DK, rows: DK, cols: CONV };
            v.push(t(p("linear_attn.conv1d.weight"), &g("ssm_conv1d.weight"), &[CONV_DIM, 1, CONV], (-0.6, 0.6), conv));
            let bias = Conv::TileRows { first: 0, rows: 1, cols: 1 };
            v.push(t(p("linear_attn.dt_bias"), &g("ssm_dt.bias"), &[V_HEADS], (-1.0, 1.0), bias));
            v.push(t(p("linear_attn.A_log"), &g("ssm_a"), &[V_HEADS], (-3.0, 0.0), Conv::NegExp { tile: true }));
            v.push(t(p("linear_attn.norm.weight"), &g("ssm_norm.weight"), &[DK], (0.6, 1.4), Conv::Same));
            v.push(t(
                p("linear_attn.out_proj.weight"),
                &g("ssm_out.weight"),
                &[HIDDEN, INNER],
                w,
                Conv::TileCols { rows: HIDDEN },
            ));
        } else {
            v.push(t(p("self_attn.q_proj.weight"), &g("attn_q.weight"), &[2 * qd, HIDDEN], w, Conv::Same));
            v.push(t(p("self_attn.k_proj.weight"), &g("attn_k.weight"), &[KV_HEADS * HEAD_DIM, HIDDEN], w, Conv::Same));
            v.push(t(p("self_attn.v_proj.weight"), &g("attn_v.weight"), &[KV_HEADS * HEAD_DIM, HIDDEN], w, Conv::Same));
            v.push(t(p("self_attn.o_proj.weight"), &g("attn_output.weight"), &[HIDDEN, qd], w, Conv::Same));
            v.push(t(p("self_attn.q_norm.weight"), &g("attn_q_norm.weight"), &[HEAD_DIM], n, Conv::PlusOne));
            v.push(t(p("self_attn.k_norm.weight"), &g("attn_k_norm.weight"), &[HEAD_DIM], n, Conv::PlusOne));
        }
        v.push(t(p("post_attention_layernorm.weight"), &g("post_attention_norm.weight"), &[HIDDEN], n, Conv::PlusOne));
        if !moe {
            v.push(t(p("mlp.gate_proj.weight"), &g("ffn_gate.weight"), &[FFN, HIDDEN], w, Conv::Same));
            v.push(t(p("mlp.up_proj.weight"), &g("ffn_up.weight"), &[FFN, HIDDEN], w, Conv::Same));
            v.push(t(p("mlp.down_proj.weight"), &g("ffn_down.weight"), &[HIDDEN, FFN], w, Conv::Same));
            continue;
        }
        v.push(t(p("mlp.gate.weight"), &g("ffn_gate_inp.weight"), &[N_EXPERT, HIDDEN], (-1.0, 1.0), Conv::Same));
        for e in 0..N_EXPERT {
            let ex = |s: &str| p(&format!("mlp.experts.{e}.{s}"));
            let gx = |s: &str| format!("blk.{l}.{s}#{e}");
            v.push(t(ex("gate_proj.weight"), &gx("ffn_gate_exps.weight"), &[EXPERT_FFN, HIDDEN], w, Conv::Same));
            v.push(t(ex("up_proj.weight"), &gx("ffn_up_exps.weight"), &[EXPERT_FFN, HIDDEN], w, Conv::Same));
            v.push(t(ex("down_proj.weight"), &gx("ffn_down_exps.weight"), &[HIDDEN, EXPERT_FFN], w, Conv::Same));
        }
        v.push(t(
            p("mlp.shared_expert.gate_proj.weight"),
            &g("ffn_gate_shexp.weight"),
            &[SHARED_FFN, HIDDEN],
            w,
            Conv::Same,
        ));
        v.push(t(
            p("mlp.shared_expert.up_proj.weight"),
            &g("ffn_up_shexp.weight"),
            &[SHARED_FFN, HIDDEN],
            w,
            Conv::Same,
        ));
        v.push(t(
            p("mlp.shared_expert.down_proj.weight"),
            &g("ffn_down_shexp.weight"),
            &[HIDDEN, SHARED_FFN],
            w,
            Conv::Same,
        ));
        v.push(t(p("mlp.shared_expert_gate.weight"), &g("ffn_gate_inp_shexp.weight"), &[1, HIDDEN], w, Conv::Same));
    }
    v.push(t("model.language_model.norm.weight".into(), "output_norm.weight", &[HIDDEN], n, Conv::PlusOne));
    v.push(t("lm_head.weight".into(), "output.weight", &[VOCAB, HIDDEN], (-0.5, 0.5), Conv::Same));
    v
}

/// The GGUF twin's keys of the Qwen hybrids here (llama.cpp's converter writes them from the
/// config): with `moe`, the experts' instead of the dense MLP's width.
fn qwen_keys(moe: bool) -> Vec<(&'static str, MetaValue)> {
    let mut keys = vec![
        ("block_count", u32v(LAYERS)),
        ("context_length", u32v(CTX)),
        ("embedding_length", u32v(HIDDEN)),
        ("attention.head_count", u32v(HEADS)),
        ("attention.head_count_kv", u32v(KV_HEADS)),
        ("attention.key_length", u32v(HEAD_DIM)),
        ("attention.value_length", u32v(HEAD_DIM)),
        ("rope.freq_base", f32v(1e7)),
        ("rope.dimension_count", u32v(HEAD_DIM / 4)),
        ("attention.layer_norm_rms_epsilon", f32v(EPS)),
        ("ssm.conv_kernel", u32v(CONV)),
        ("ssm.state_size", u32v(DK)),
        ("ssm.group_count", u32v(K_HEADS)),
        ("ssm.time_step_rank", u32v(V_HEADS)),
        ("ssm.inner_size", u32v(INNER)),
        ("full_attention_interval", u32v(2)),
    ];
    match moe {
        true => keys.extend([
            ("expert_count", u32v(N_EXPERT)),
            ("expert_used_count", u32v(TOP_K)),
            ("expert_feed_forward_length", u32v(EXPERT_FFN)),
            ("expert_shared_feed_forward_length", u32v(SHARED_FFN)),
        ]),
        false => keys.push(("feed_forward_length", u32v(FFN))),
    }
    keys
}

/// The largest difference between two sets of logit rows, relative to the rows' largest value.
fn rel_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    let scale = b.iter().flatten().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().flatten().zip(b.iter().flatten()).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[test]
fn qwen3_5_checkpoint_equals_its_gguf_twin() {
    let (hf, gguf) = both(&qwen35_tensors(false), true);
    let layer_types: Vec<&str> =
        (0..LAYERS).map(|l| if l % 2 == 0 { "linear_attention" } else { "full_attention" }).collect();
    let config = serde_json::json!({
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "text_config": {
            "model_type": "qwen3_5_text", "hidden_size": HIDDEN, "intermediate_size": FFN,
            "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
            "head_dim": HEAD_DIM, "rms_norm_eps": EPS, "vocab_size": VOCAB, "max_position_embeddings": CTX,
            "tie_word_embeddings": false, "layer_types": layer_types, "full_attention_interval": 2,
            "linear_conv_kernel_dim": CONV, "linear_key_head_dim": DK, "linear_value_head_dim": DK,
            "linear_num_key_heads": K_HEADS, "linear_num_value_heads": V_HEADS, "attn_output_gate": true,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                "mrope_section": [2, 1, 1], "mrope_interleaved": true}
        }
    });
    let keys = qwen_keys(false);
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("twin.gguf");
    write_gguf(&path, "qwen35", &keys, &gguf_tensors(&gguf));
    write_hf(&dir.path().join("hf"), &config, &hf);
    // The GGUF twin written with the checkpoint's (grouped) value-head order: read tiled, it is
    // another model.
    let ungrouped = dir.path().join("ungrouped.gguf");
    let (_, plain) = both(&qwen35_tensors(false), false);
    write_gguf(&ungrouped, "qwen35", &keys, &gguf_tensors(&plain));
    let mut g = LlamaModel::load(&path, 2).expect("GGUF twin");
    let mut h = LlamaModel::load_hf(&dir.path().join("hf"), 2).expect("checkpoint");
    let mut b = LlamaModel::load(&ungrouped, 2).expect("ungrouped twin");
    assert_eq!((h.info().architecture.as_str(), g.info().architecture.as_str()), ("qwen3_5", "qwen35"));
    assert_eq!(h.state_layout().map(|s| s.bytes_per_request()), g.state_layout().map(|s| s.bytes_per_request()));
    let (rg, tg) = run(&mut g);
    let (rh, th) = run(&mut h);
    let (rb, _) = run(&mut b);
    let (d, db) = (rel_diff(&rh, &rg), rel_diff(&rb, &rg));
    println!("qwen3_5: checkpoint vs GGUF twin {d:.2e} of the logits' scale, greedy {th:?}; heads in the wrong order {db:.2e}");
    assert_eq!(th, tg, "qwen3_5: greedy tokens of the checkpoint and of its GGUF twin");
    assert!(d < 1e-4, "qwen3_5: the checkpoint's logits are {d} from its twin's");
    assert!(db > 100.0 * d.max(1e-6), "qwen3_5: value heads in the wrong order give the same logits ({db})");
}

/// The checkpoint's per-expert tensors fused as transformers 5 stores them: per layer one
/// `experts.gate_up_proj` `[E, 2F, H]` (each expert's gate rows, then its up rows; ungated
/// experts: `experts.up_proj` `[E, F, H]`) and one `experts.down_proj` `[E, H, F]`; `swap`
/// puts the up rows first (the broken copy).
fn fuse_experts(ws: &[W], swap: bool) -> Vec<W> {
    let mut out: Vec<W> = Vec::new();
    for w in ws {
        let Some((layer, rest)) = w.hf.split_once(".experts.") else {
            out.push(W { hf: w.hf.clone(), gguf: w.gguf.clone(), shape: w.shape.clone(), data: w.data.clone() });
            continue;
        };
        let (e, proj) = rest.split_once('.').expect("expert index");
        let e: usize = e.parse().expect("expert index");
        // Ungated experts (Nemotron-H's ReLU²) keep `up_proj` alone, `[E, F, H]`.
        let gated = ws.iter().any(|o| o.hf.starts_with(layer) && o.hf.ends_with("gate_proj.weight"));
        let (name, rows, first) = match proj {
            "gate_proj.weight" => ("gate_up_proj", 2 * EXPERT_FFN, usize::from(swap) * EXPERT_FFN),
            "up_proj.weight" if gated => ("gate_up_proj", 2 * EXPERT_FFN, usize::from(!swap) * EXPERT_FFN),
            "up_proj.weight" => ("up_proj", EXPERT_FFN, 0),
            _ => ("down_proj", HIDDEN, 0),
        };
        let hf = format!("{layer}.experts.{name}");
        if !out.iter().any(|o| o.hf == hf) {
            let cols = w.shape[1];
            out.push(W {
                hf: hf.clone(),
                gguf: String::new(),
                shape: vec![N_EXPERT, rows, cols],
                data: vec![0.0; N_EXPERT * rows * cols],
            });
        }
        let f = out.iter_mut().find(|o| o.hf == hf).expect("pushed");
        let (rows, cols) = (f.shape[1], f.shape[2]);
        let at = (e * rows + first) * cols;
        f.data[at..at + w.data.len()].copy_from_slice(&w.data);
    }
    out
}

#[test]
fn qwen3_5_moe_checkpoint_equals_its_gguf_twin() {
    let (hf, gguf) = both(&qwen35_tensors(true), true);
    let layer_types: Vec<&str> =
        (0..LAYERS).map(|l| if l % 2 == 0 { "linear_attention" } else { "full_attention" }).collect();
    let config = serde_json::json!({
        "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
        "text_config": {
            "model_type": "qwen3_5_moe_text", "hidden_size": HIDDEN,
            "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
            "head_dim": HEAD_DIM, "rms_norm_eps": EPS, "vocab_size": VOCAB, "max_position_embeddings": CTX,
            "tie_word_embeddings": false, "layer_types": layer_types, "full_attention_interval": 2,
            "linear_conv_kernel_dim": CONV, "linear_key_head_dim": DK, "linear_value_head_dim": DK,
            "linear_num_key_heads": K_HEADS, "linear_num_value_heads": V_HEADS, "attn_output_gate": true,
            "num_experts": N_EXPERT, "num_experts_per_tok": TOP_K, "moe_intermediate_size": EXPERT_FFN,
            "shared_expert_intermediate_size": SHARED_FFN,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                "mrope_section": [2, 1, 1], "mrope_interleaved": true}
        }
    });
    let keys = qwen_keys(true);
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("twin.gguf");
    write_gguf(&path, "qwen35moe", &keys, &gguf_tensors(&gguf));
    // Both spellings of the experts: one tensor each (transformers 4) and fused (5).
    write_hf(&dir.path().join("hf"), &config, &hf);
    write_hf(&dir.path().join("fused"), &config, &fuse_experts(&hf, false));
    write_hf(&dir.path().join("swapped"), &config, &fuse_experts(&hf, true));
    let mut g = LlamaModel::load(&path, 2).expect("GGUF twin");
    let mut h = LlamaModel::load_hf(&dir.path().join("hf"), 2).expect("checkpoint");
    let mut f = LlamaModel::load_hf(&dir.path().join("fused"), 2).expect("fused checkpoint");
    let mut b = LlamaModel::load_hf(&dir.path().join("swapped"), 2).expect("swapped checkpoint");
    assert_eq!((f.info().architecture.as_str(), g.info().architecture.as_str()), ("qwen3_5_moe", "qwen35moe"));
    let (rg, tg) = run(&mut g);
    let (rh, th) = run(&mut h);
    let (rf, tf) = run(&mut f);
    let (rb, _) = run(&mut b);
    assert_eq!(rh, rf, "qwen3_5_moe: the fused experts are the per-expert tensors");
    let (d, db) = (rel_diff(&rf, &rg), rel_diff(&rb, &rg));
    println!("qwen3_5_moe: checkpoint vs GGUF twin {d:.2e} of the logits' scale, greedy {tf:?}; gate and up swapped {db:.2e}");
    assert_eq!((&th, &tf), (&tg, &tg), "qwen3_5_moe: greedy tokens of the checkpoints and of their GGUF twin");
    assert!(d < 1e-4, "qwen3_5_moe: the checkpoint's logits are {d} from its twin's");
    assert!(db > 100.0 * d.max(1e-6), "qwen3_5_moe: gate and up swapped give the same logits ({db})");
}

/// Qwen3-Next's tensors: Qwen3.5-MoE's under `model.` with the value heads left grouped (its
/// converter does not tile them), β and the decay's inputs in one `in_proj_ba` (per key head
/// `[b × r, a × r]`, as the GGUF's `ssm_ba`), and `q k v z` in one `in_proj_qkvz`, made by
/// [`qwen3next_qkvz`].
fn qwen3next_tensors() -> Vec<T> {
    let split = ["in_proj_qkv.", "in_proj_z.", "in_proj_b.", "in_proj_a."];
    let mut v: Vec<T> = qwen35_tensors(true)
        .into_iter()
        .filter(|t| !split.iter().any(|s| t.hf.contains(s)))
        .map(|t| T {
            hf: t.hf.replace("model.language_model.", "model."),
            to_gguf: match t.to_gguf {
                Conv::TileRows { .. } | Conv::TileCols { .. } => Conv::Same,
                Conv::NegExp { .. } => Conv::NegExp { tile: false },
                c => c,
            },
            ..t
        })
        .collect();
    for l in (0..LAYERS).step_by(2) {
        let hf = format!("model.layers.{l}.linear_attn.in_proj_ba.weight");
        v.push(t(hf, &format!("blk.{l}.ssm_ba.weight"), &[2 * V_HEADS, HIDDEN], (-0.4, 0.4), Conv::Same));
    }
    v
}

/// Each recurrent layer's `in_proj_qkvz` (HF) and the GGUF twin's `attn_qkv` and `attn_gate`,
/// split as llama.cpp's `Qwen3NextModel.modify_tensors` splits it (viewed per key head as
/// `[q, k, v, z]`); `interleaved: false` splits it as if it were `[q k v | z]` already (the
/// broken twin).
fn qwen3next_qkvz(interleaved: bool) -> (Vec<W>, Vec<W>) {
    let r = V_HEADS / K_HEADS;
    let blk = 2 * DK + 2 * r * DK;
    let (mut hf, mut gguf) = (Vec::new(), Vec::new());
    for l in (0..LAYERS).step_by(2) {
        let name = format!("model.layers.{l}.linear_attn.in_proj_qkvz.weight");
        let data = values(&name, K_HEADS * blk * HIDDEN, -0.4, 0.4);
        let (qkv, z) = match interleaved {
            true => {
                let part = |from: usize, n: usize| -> Vec<f32> {
                    (0..K_HEADS)
                        .flat_map(|b| data[(b * blk + from) * HIDDEN..(b * blk + from + n) * HIDDEN].to_vec())
                        .collect()
                };
                let qkv = [part(0, DK), part(DK, DK), part(2 * DK, r * DK)].concat();
                (qkv, part(2 * DK + r * DK, r * DK))
            }
            false => (data[..CONV_DIM * HIDDEN].to_vec(), data[CONV_DIM * HIDDEN..].to_vec()),
        };
        gguf.push(W {
            hf: name.clone(),
            gguf: format!("blk.{l}.attn_qkv.weight"),
            shape: vec![CONV_DIM, HIDDEN],
            data: qkv,
        });
        gguf.push(W {
            hf: name.clone(),
            gguf: format!("blk.{l}.attn_gate.weight"),
            shape: vec![INNER, HIDDEN],
            data: z,
        });
        hf.push(W { hf: name, gguf: String::new(), shape: vec![K_HEADS * blk, HIDDEN], data });
    }
    (hf, gguf)
}

#[test]
fn qwen3_next_checkpoint_equals_its_gguf_twin() {
    let (mut hf, mut gguf) = both(&qwen3next_tensors(), true);
    let (qkvz, split) = qwen3next_qkvz(true);
    hf.extend(qkvz);
    let mut plain = std::mem::take(&mut gguf);
    gguf.extend(plain.iter().map(|w| W {
        hf: w.hf.clone(),
        gguf: w.gguf.clone(),
        shape: w.shape.clone(),
        data: w.data.clone(),
    }));
    gguf.extend(split);
    plain.extend(qwen3next_qkvz(false).1);
    let config = serde_json::json!({
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "rms_norm_eps": EPS, "vocab_size": VOCAB, "max_position_embeddings": CTX,
        "tie_word_embeddings": false, "full_attention_interval": 2, "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25, "linear_conv_kernel_dim": CONV, "linear_key_head_dim": DK,
        "linear_value_head_dim": DK, "linear_num_key_heads": K_HEADS, "linear_num_value_heads": V_HEADS,
        "num_experts": N_EXPERT, "num_experts_per_tok": TOP_K, "moe_intermediate_size": EXPERT_FFN,
        "shared_expert_intermediate_size": SHARED_FFN, "norm_topk_prob": true, "decoder_sparse_step": 1,
        "mlp_only_layers": []
    });
    let keys = qwen_keys(true);
    let dir = tempfile::tempdir().expect("tmp");
    let (path, broken) = (dir.path().join("twin.gguf"), dir.path().join("plain.gguf"));
    write_gguf(&path, "qwen3next", &keys, &gguf_tensors(&gguf));
    write_gguf(&broken, "qwen3next", &keys, &gguf_tensors(&plain));
    write_hf(&dir.path().join("hf"), &config, &hf);
    let mut g = LlamaModel::load(&path, 2).expect("GGUF twin");
    let mut h = LlamaModel::load_hf(&dir.path().join("hf"), 2).expect("checkpoint");
    let mut b = LlamaModel::load(&broken, 2).expect("plainly split twin");
    assert_eq!((h.info().architecture.as_str(), g.info().architecture.as_str()), ("qwen3_next", "qwen3next"));
    let (rg, tg) = run(&mut g);
    let (rh, th) = run(&mut h);
    let (rb, _) = run(&mut b);
    let (d, db) = (rel_diff(&rh, &rg), rel_diff(&rb, &rg));
    println!(
        "qwen3_next: checkpoint vs GGUF twin {d:.2e} of the logits' scale, greedy {th:?}; qkvz split plainly {db:.2e}"
    );
    assert_eq!(th, tg, "qwen3_next: greedy tokens of the checkpoint and of its GGUF twin");
    assert!(d < 1e-4, "qwen3_next: the checkpoint's logits are {d} from its twin's");
    assert!(db > 100.0 * d.max(1e-6), "qwen3_next: in_proj_qkvz split plainly gives the same logits ({db})");
}

/// Nemotron-H's tensors (`pattern`: `M-M*`, or `MEM*` for Nemotron-H MoE), under the
/// checkpoint's `backbone` names.
fn nemotron_tensors(pattern: &str) -> Vec<T> {
    let (nh, hd, ng, ds) = (4usize, 16usize, 2usize, 16usize);
    let inner = nh * hd;
    let cd = inner + 2 * ng * ds;
    let w = (-0.4, 0.4);
    let mut v =
        vec![t("backbone.embeddings.weight".into(), "token_embd.weight", &[VOCAB, HIDDEN], (-1.0, 1.0), Conv::Same)];
    for (l, kind) in pattern.chars().enumerate() {
        let p = |s: &str| format!("backbone.layers.{l}.{s}");
        let g = |s: &str| format!("blk.{l}.{s}");
        v.push(t(p("norm.weight"), &g("attn_norm.weight"), &[HIDDEN], (0.6, 1.4), Conv::Same));
        match kind {
            'M' => {
                v.push(t(p("mixer.in_proj.weight"), &g("ssm_in.weight"), &[inner + cd + nh, HIDDEN], w, Conv::Same));
                v.push(t(p("mixer.conv1d.weight"), &g("ssm_conv1d.weight"), &[cd, 1, CONV], (-0.6, 0.6), Conv::Same));
                v.push(t(p("mixer.conv1d.bias"), &g("ssm_conv1d.bias"), &[cd], (-0.3, 0.3), Conv::Same));
                v.push(t(p("mixer.dt_bias"), &g("ssm_dt.bias"), &[nh], (-1.0, 1.0), Conv::Same));
                v.push(t(p("mixer.A_log"), &g("ssm_a"), &[nh], (-3.0, 0.0), Conv::NegExp { tile: false }));
                v.push(t(p("mixer.D"), &g("ssm_d"), &[nh], (0.5, 1.5), Conv::Same));
                v.push(t(p("mixer.norm.weight"), &g("ssm_norm.weight"), &[inner], (0.6, 1.4), Conv::Same));
                v.push(t(p("mixer.out_proj.weight"), &g("ssm_out.weight"), &[HIDDEN, inner], w, Conv::Same));
            }
            '*' => {
                let qd = HEADS * HEAD_DIM;
                v.push(t(p("mixer.q_proj.weight"), &g("attn_q.weight"), &[qd, HIDDEN], w, Conv::Same));
                v.push(t(p("mixer.k_proj.weight"), &g("attn_k.weight"), &[KV_HEADS * HEAD_DIM, HIDDEN], w, Conv::Same));
                v.push(t(p("mixer.v_proj.weight"), &g("attn_v.weight"), &[KV_HEADS * HEAD_DIM, HIDDEN], w, Conv::Same));
                v.push(t(p("mixer.o_proj.weight"), &g("attn_output.weight"), &[HIDDEN, qd], w, Conv::Same));
            }
            'E' => {
                v.push(t(
                    p("mixer.gate.weight"),
                    &g("ffn_gate_inp.weight"),
                    &[N_EXPERT, HIDDEN],
                    (-1.0, 1.0),
                    Conv::Same,
                ));
                let bias = p("mixer.gate.e_score_correction_bias");
                v.push(t(bias, &g("exp_probs_b.bias"), &[N_EXPERT], (-0.5, 0.5), Conv::Same));
                for e in 0..N_EXPERT {
                    let ex = |s: &str| p(&format!("mixer.experts.{e}.{s}"));
                    let gx = |s: &str| format!("blk.{l}.{s}#{e}");
                    v.push(t(ex("up_proj.weight"), &gx("ffn_up_exps.weight"), &[EXPERT_FFN, HIDDEN], w, Conv::Same));
                    v.push(t(
                        ex("down_proj.weight"),
                        &gx("ffn_down_exps.weight"),
                        &[HIDDEN, EXPERT_FFN],
                        w,
                        Conv::Same,
                    ));
                }
                let (up, down) = (p("mixer.shared_experts.up_proj.weight"), p("mixer.shared_experts.down_proj.weight"));
                v.push(t(up, &g("ffn_up_shexp.weight"), &[SHARED_FFN, HIDDEN], w, Conv::Same));
                v.push(t(down, &g("ffn_down_shexp.weight"), &[HIDDEN, SHARED_FFN], w, Conv::Same));
            }
            _ => {
                v.push(t(p("mixer.up_proj.weight"), &g("ffn_up.weight"), &[FFN, HIDDEN], w, Conv::Same));
                v.push(t(p("mixer.down_proj.weight"), &g("ffn_down.weight"), &[HIDDEN, FFN], w, Conv::Same));
            }
        }
    }
    v.push(t("backbone.norm_f.weight".into(), "output_norm.weight", &[HIDDEN], (0.6, 1.4), Conv::Same));
    v.push(t("lm_head.weight".into(), "output.weight", &[VOCAB, HIDDEN], (-0.5, 0.5), Conv::Same));
    v
}

/// The GGUF twin's keys of the Nemotron-H files here (layers `M?M*`, the second an MLP block:
/// ReLU² of `FFN`, or experts with `moe`).
fn nemotron_keys(moe: bool) -> Vec<(&'static str, MetaValue)> {
    let mut keys = vec![
        ("block_count", u32v(4)),
        ("context_length", u32v(CTX)),
        ("embedding_length", u32v(HIDDEN)),
        ("feed_forward_length", u32_array(&[0, if moe { EXPERT_FFN } else { FFN }, 0, 0])),
        ("attention.head_count", u32v(HEADS)),
        ("attention.head_count_kv", u32_array(&[0, 0, 0, KV_HEADS])),
        ("attention.key_length", u32v(HEAD_DIM)),
        ("attention.value_length", u32v(HEAD_DIM)),
        ("attention.layer_norm_rms_epsilon", f32v(EPS)),
        ("ssm.conv_kernel", u32v(CONV)),
        ("ssm.state_size", u32v(16)),
        ("ssm.group_count", u32v(2)),
        ("ssm.time_step_rank", u32v(4)),
        ("ssm.inner_size", u32v(64)),
    ];
    if moe {
        keys.extend([
            ("expert_count", u32v(N_EXPERT)),
            ("expert_used_count", u32v(TOP_K)),
            ("expert_feed_forward_length", u32v(EXPERT_FFN)),
            ("expert_shared_feed_forward_length", u32v(SHARED_FFN)),
            ("expert_shared_count", u32v(1)),
            ("expert_weights_norm", (ggus::GGufMetaDataValueType::Bool, vec![1u8])),
            ("expert_weights_scale", f32v(2.5)),
        ]);
    }
    keys
}

/// A `u32` array metadata value.
fn u32_array(v: &[usize]) -> MetaValue {
    let mut b = 4u32.to_le_bytes().to_vec();
    b.extend_from_slice(&(v.len() as u64).to_le_bytes());
    v.iter().for_each(|x| b.extend_from_slice(&(*x as u32).to_le_bytes()));
    (ggus::GGufMetaDataValueType::Array, b)
}

#[test]
fn nemotron_h_checkpoint_equals_its_gguf_twin() {
    let (hf, gguf) = both(&nemotron_tensors("M-M*"), true);
    let config = serde_json::json!({
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": HIDDEN,
        "intermediate_size": FFN, "num_hidden_layers": 4, "hybrid_override_pattern": "M-M*",
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "mamba_num_heads": 4, "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 2, "conv_kernel": CONV,
        "layer_norm_epsilon": EPS, "vocab_size": VOCAB, "max_position_embeddings": CTX,
        "tie_word_embeddings": false, "use_conv_bias": true, "mlp_hidden_act": "relu2",
        // transformers 5 writes expert counts into every Nemotron-H config, dense ones too.
        "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32
    });
    let keys = nemotron_keys(false);
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("twin.gguf");
    write_gguf(&path, "nemotron_h", &keys, &gguf_tensors(&gguf));
    write_hf(&dir.path().join("hf"), &config, &hf);
    // The broken copy: `A_log` stored where `A` belongs (the converter's step skipped).
    let broken: Vec<W> = hf
        .iter()
        .map(|w| {
            let hf = if w.hf.ends_with("mixer.A_log") { w.hf.replace("A_log", "A") } else { w.hf.clone() };
            W { hf, gguf: w.gguf.clone(), shape: w.shape.clone(), data: w.data.clone() }
        })
        .collect();
    write_hf(&dir.path().join("broken"), &config, &broken);
    let mut g = LlamaModel::load(&path, 2).expect("GGUF twin");
    let mut h = LlamaModel::load_hf(&dir.path().join("hf"), 2).expect("checkpoint");
    let mut b = LlamaModel::load_hf(&dir.path().join("broken"), 2).expect("broken checkpoint");
    assert_eq!((h.info().architecture.as_str(), g.info().architecture.as_str()), ("nemotron_h", "nemotron_h"));
    check_twins("nemotron_h", &mut g, &mut h, &mut b);
}

#[test]
fn nemotron_h_moe_checkpoint_equals_its_gguf_twin() {
    let (hf, gguf) = both(&nemotron_tensors("MEM*"), true);
    let config = serde_json::json!({
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": HIDDEN,
        "intermediate_size": FFN, "num_hidden_layers": 4,
        "layers_block_type": ["mamba", "moe", "mamba", "attention"],
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "mamba_num_heads": 4, "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 2, "conv_kernel": CONV,
        "layer_norm_epsilon": EPS, "vocab_size": VOCAB, "max_position_embeddings": CTX,
        "tie_word_embeddings": false, "use_conv_bias": true, "mlp_hidden_act": "relu2",
        "n_routed_experts": N_EXPERT, "num_experts_per_tok": TOP_K, "moe_intermediate_size": EXPERT_FFN,
        "moe_shared_expert_intermediate_size": SHARED_FFN, "norm_topk_prob": true, "routed_scaling_factor": 2.5,
        "n_group": 1, "topk_group": 1
    });
    let keys = nemotron_keys(true);
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("twin.gguf");
    write_gguf(&path, "nemotron_h_moe", &keys, &gguf_tensors(&gguf));
    write_hf(&dir.path().join("hf"), &config, &hf);
    write_hf(&dir.path().join("fused"), &config, &fuse_experts(&hf, false));
    let copy = |w: &W, data: Vec<f32>| W { hf: w.hf.clone(), gguf: w.gguf.clone(), shape: w.shape.clone(), data };
    // The broken copy: the selection bias negated (the router's choice changes).
    let broken: Vec<W> = hf
        .iter()
        .map(|w| match w.hf.ends_with("e_score_correction_bias") {
            true => copy(w, w.data.iter().map(|x| -x).collect()),
            false => copy(w, w.data.clone()),
        })
        .collect();
    write_hf(&dir.path().join("broken"), &config, &broken);
    // Without the selection bias the checkpoint is refused, the tensor named.
    let unbiased: Vec<W> =
        hf.iter().filter(|w| !w.hf.ends_with("e_score_correction_bias")).map(|w| copy(w, w.data.clone())).collect();
    write_hf(&dir.path().join("unbiased"), &config, &unbiased);
    match LlamaModel::load_hf(&dir.path().join("unbiased"), 2) {
        Ok(_) => panic!("a Nemotron-H MoE checkpoint without its selection bias loaded"),
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains("tensor backbone.layers.1.mixer.gate.e_score_correction_bias missing"), "{e}");
            assert!(!e.contains("model: model:"), "{e}");
        }
    }
    let mut g = LlamaModel::load(&path, 2).expect("GGUF twin");
    let mut h = LlamaModel::load_hf(&dir.path().join("hf"), 2).expect("checkpoint");
    let mut f = LlamaModel::load_hf(&dir.path().join("fused"), 2).expect("fused checkpoint");
    let mut b = LlamaModel::load_hf(&dir.path().join("broken"), 2).expect("broken checkpoint");
    assert_eq!((h.info().architecture.as_str(), g.info().architecture.as_str()), ("nemotron_h", "nemotron_h_moe"));
    assert_eq!(run(&mut f), run(&mut h), "nemotron_h: the fused experts are the per-expert tensors");
    check_twins("nemotron_h (experts)", &mut g, &mut h, &mut b);
}
