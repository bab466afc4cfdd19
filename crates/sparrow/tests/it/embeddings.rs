//! `sparrow serve --model-path all-minilm-l6-v2` (the short name fetches and unpacks the
//! sentence-transformers package) driven by the OpenAI Python SDK's `embeddings.create`: the
//! default request (base64, decoded by the SDK) and `encoding_format="float"` give the same
//! unit vectors, `dimensions` gives a renormalized prefix. `.ci/run` installs `openai`.

use super::serve::serve_with;
use serde_json::Value;
use std::process::Command;

#[test]
fn openai_sdk_embeddings_create_against_minilm() {
    let s = serve_with(&["--model-path", "all-minilm-l6-v2", "--max-total-tokens", "20000"]);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/embeddings.py");
    let out = Command::new("python3").arg(&path).arg(s.1.to_string()).output().expect("python3 runs");
    assert!(out.status.success(), "SDK script failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("script prints JSON");
    let vecs = |k: &str| -> Vec<Vec<f64>> { serde_json::from_value(v[k].clone()).expect("vectors") };
    let (b64, floats) = (vecs("default"), vecs("float"));
    assert_eq!(b64.len(), 3);
    for (a, b) in b64.iter().zip(&floats) {
        assert_eq!(a.len(), 384);
        // The f32 values, whichever way they travelled (JSON prints them shortest-round-trip).
        for (x, y) in a.iter().zip(b) {
            assert_eq!(*x as f32, *y as f32);
        }
        let norm: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
    }
    assert_eq!(v["index"], serde_json::json!([0, 1, 2]));
    assert_eq!(v["object"], serde_json::json!(["list", "embedding", "embedding", "embedding"]));
    let usage: Vec<u64> = serde_json::from_value(v["usage"].clone()).expect("usage");
    assert!(usage[0] > 20 && usage[0] == usage[1], "{usage:?}");
    let short: Vec<f64> = serde_json::from_value(v["short"].clone()).expect("short");
    let n: f64 = b64[0][..32].iter().map(|x| x * x).sum::<f64>().sqrt();
    for (s, f) in short.iter().zip(&b64[0][..32]) {
        assert!((s - f / n).abs() < 1e-6);
    }
}
