//! The Hugging Face / ModelOpt NVFP4 loader on small hand-made checkpoints: values decoded
//! bit for bit against a hand-checked table, both quantization-config styles, glob exclusion,
//! shards with an index, and a clear refusal for everything it does not understand.

use std::path::Path;

use safetensors::tensor::Dtype;
use serde_json::json;
use sparrow_convert::quantize::{write_checkpoint, QuantStyle, TensorOut};
use sparrow_cpu::Weight;
use sparrow_engine::checkpoint::hf::{Checkpoint, QuantConfig};

/// One NVFP4 row of 32 weights, decoded by hand:
/// - bytes: `0x21` → elements 0, 1 = codes 1, 2 → 0.5, 1.0; `0xf7` → codes 7, 0xf → 6, −6;
///   `0x9a` → codes 0xa, 0x9 → −1.0, −0.5; the rest 0.
/// - block scales (E4M3): block 0 `0x40` = 2.0, block 1 `0x30` = 0.5; `weight_scale_2` = 0.25.
/// - so block 0 multiplies by 0.5 and block 1 by 0.125.
fn nvfp4_row() -> (Vec<TensorOut>, Vec<f32>) {
    let mut w = vec![0u8; 16];
    w[0] = 0x21;
    w[7] = 0xf7;
    w[8] = 0x9a;
    let mut want = vec![0f32; 32];
    want[0] = 0.5 * 0.5;
    want[1] = 1.0 * 0.5;
    want[14] = 6.0 * 0.5;
    want[15] = -6.0 * 0.5;
    want[16] = -0.125; // −1 · 0.125
    want[17] = -0.5 * 0.125;
    let m = "model.layers.0.mlp.down_proj";
    let t = vec![
        TensorOut { name: format!("{m}.weight"), dtype: Dtype::U8, shape: vec![1, 16], data: w },
        TensorOut {
            name: format!("{m}.weight_scale"),
            dtype: Dtype::F8_E4M3,
            shape: vec![1, 2],
            data: vec![0x40, 0x30],
        },
        TensorOut::f32(&format!("{m}.weight_scale_2"), vec![], &[0.25]),
        TensorOut::f32(&format!("{m}.input_scale"), vec![], &[1.0]),
    ];
    (t, want)
}

fn dense(name: &str, rows: usize, cols: usize) -> TensorOut {
    let v: Vec<f32> = (0..rows * cols).map(|i| i as f32 * 0.25 - 1.0).collect();
    TensorOut::bf16(&format!("{name}.weight"), vec![rows, cols], &v)
}

fn write(dir: &Path, tensors: &[TensorOut], exclude: &[&str], style: QuantStyle, shards: usize) {
    let ex: Vec<String> = exclude.iter().map(|s| s.to_string()).collect();
    write_checkpoint(dir, json!({"model_type": "test"}), tensors, shards, Some((&ex, style))).expect("write");
}

fn row(w: &Weight, cols: usize) -> Vec<f32> {
    let mut r = vec![0f32; cols];
    w.row_f32(0, &mut r);
    r
}

#[test]
fn nvfp4_values_match_the_hand_table_in_both_config_styles() {
    for style in [QuantStyle::HfQuantConfig, QuantStyle::ConfigJson] {
        let tmp = tempfile::tempdir().expect("tmp");
        let (mut t, want) = nvfp4_row();
        t.push(dense("model.layers.0.self_attn.o_proj", 2, 16));
        t.push(dense("lm_head", 3, 16));
        write(tmp.path(), &t, &["lm_head", "model.layers.*.self_attn*"], style, 3);
        assert!(tmp.path().join("model.safetensors.index.json").is_file(), "sharded with an index");
        let ck = Checkpoint::open(tmp.path()).expect("open");
        let q = ck.quant.as_ref().expect("quant config");
        assert_eq!(q.group_size, 16);
        let w = ck.linear("model.layers.0.mlp.down_proj", 1, 32).expect("nvfp4");
        assert!(matches!(w, Weight::Nvfp4(_)));
        let got = row(&w, 32);
        for (c, (g, e)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), e.to_bits(), "{style:?} column {c}: {g} vs {e}");
        }
        // BF16 values of the excluded modules are exact here (multiples of 0.25).
        let o = ck.linear("model.layers.0.self_attn.o_proj", 2, 16).expect("dense");
        assert_eq!(row(&o, 16)[..3], [-1.0, -0.75, -0.5]);
        assert!(matches!(ck.linear("lm_head", 3, 16).expect("lm_head"), Weight::Dense { .. }));
    }
}

#[test]
fn disagreements_and_unknown_formats_are_refused_by_name() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (mut t, _) = nvfp4_row();
    t.push(dense("model.layers.0.mlp.up_proj", 2, 16));
    // down_proj is NVFP4 yet excluded; up_proj is dense yet not excluded.
    write(tmp.path(), &t, &["*.down_proj"], QuantStyle::HfQuantConfig, 1);
    let ck = Checkpoint::open(tmp.path()).expect("open");
    let e = ck.linear("model.layers.0.mlp.down_proj", 1, 32).expect_err("excluded but quantized").to_string();
    assert!(e.contains("model.layers.0.mlp.down_proj") && e.contains("excludes"), "{e}");
    let e = ck.linear("model.layers.0.mlp.up_proj", 2, 16).expect_err("dense, not excluded").to_string();
    assert!(e.contains("model.layers.0.mlp.up_proj") && e.contains("not quantized"), "{e}");
    let e = ck.linear("model.layers.0.mlp.down_proj", 2, 32);
    assert!(e.is_err(), "wrong shape is refused");

    // Another algorithm.
    std::fs::write(tmp.path().join("hf_quant_config.json"), r#"{"quantization": {"quant_algo": "FP8"}}"#)
        .expect("write");
    let e = Checkpoint::open(tmp.path()).expect_err("fp8").to_string();
    assert!(e.contains("FP8") && e.contains("NVFP4"), "{e}");
    std::fs::remove_file(tmp.path().join("hf_quant_config.json")).expect("rm");
    std::fs::write(
        tmp.path().join("config.json"),
        r#"{"model_type": "test", "quantization_config": {"quant_method": "gptq", "bits": 4}}"#,
    )
    .expect("write");
    let e = Checkpoint::open(tmp.path()).expect_err("gptq").to_string();
    assert!(e.contains("gptq"), "{e}");

    // An index naming a shard that is not there.
    std::fs::write(tmp.path().join("config.json"), r#"{"model_type": "test"}"#).expect("write");
    std::fs::write(
        tmp.path().join("model.safetensors.index.json"),
        r#"{"weight_map": {"a.weight": "model-00009-of-00009.safetensors"}}"#,
    )
    .expect("write");
    let e = Checkpoint::open(tmp.path()).expect_err("missing shard").to_string();
    assert!(e.contains("model-00009-of-00009.safetensors"), "{e}");
}

#[test]
fn exclusion_globs_cross_dots_and_match_whole_names() {
    let q = QuantConfig {
        source: "test".into(),
        group_size: 16,
        exclude: vec!["lm_head".into(), "model.layers.*.self_attn*".into(), "*.mlp.gate".into()],
    };
    assert!(q.is_excluded("lm_head"));
    assert!(q.is_excluded("model.layers.12.self_attn.indexer.wk"));
    assert!(q.is_excluded("model.layers.3.mlp.gate"));
    assert!(!q.is_excluded("model.layers.3.mlp.gate_proj"), "whole-name match");
    assert!(!q.is_excluded("model.layers.3.mlp.experts.0.up_proj"));
    assert!(!q.is_excluded("lm_head_extra"));
}

#[test]
fn nan_block_scales_are_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (mut t, _) = nvfp4_row();
    t[1].data[1] = 0x7f; // S.1111.111: NaN in E4M3
    write(tmp.path(), &t, &[], QuantStyle::HfQuantConfig, 1);
    let ck = Checkpoint::open(tmp.path()).expect("open");
    let e = ck.linear("model.layers.0.mlp.down_proj", 1, 32).expect_err("NaN scale").to_string();
    assert!(e.contains("NaN") && e.contains("down_proj"), "{e}");
}

/// Writing into a directory that holds another checkpoint replaces it whole: stale shards and
/// index files would otherwise be loaded instead of the new weights.
#[test]
fn rewriting_a_directory_leaves_no_stale_shards() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (mut t, _) = nvfp4_row();
    t.push(dense("model.layers.0.self_attn.o_proj", 2, 16));
    t.push(dense("lm_head", 3, 16));
    write(tmp.path(), &t, &["*self_attn*", "lm_head"], QuantStyle::HfQuantConfig, 3);
    assert!(tmp.path().join("model.safetensors.index.json").is_file());
    let (t2, _) = nvfp4_row();
    write(tmp.path(), &t2, &[], QuantStyle::ConfigJson, 1);
    let files: Vec<String> = std::fs::read_dir(tmp.path())
        .expect("dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(files.iter().filter(|f| f.ends_with(".safetensors")).count() == 1, "{files:?}");
    assert!(
        !files.contains(&"model.safetensors.index.json".to_owned())
            && !files.contains(&"hf_quant_config.json".to_owned())
    );
    let ck = Checkpoint::open(tmp.path()).expect("open");
    assert!(!ck.has("model.layers.0.self_attn.o_proj.weight"), "the old tensor is gone");
}
