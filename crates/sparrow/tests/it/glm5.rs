//! glm5-tiny end to end: `sparrow gen-model` writes it, `sparrow serve` refuses a backend
//! without sparse attention by name, then serves a `sparrow bench` load small enough for CI but
//! tight enough (KV pool, chunk size) that chunked prefill, retraction and radix-cache hits all
//! happen; the counters are read from `/metrics` and nothing fails.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn sparrow() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sparrow"))
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{metrics}"))
}

fn get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out
}

#[test]
fn glm5_tiny_served_under_pressure() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("glm5-tiny");
    let out = sparrow().args(["gen-model", "glm5-tiny", "--output"]).arg(&model).output().expect("gen-model");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for f in ["config.json", "hf_quant_config.json", "model.safetensors.index.json", "tokenizer.json"] {
        assert!(model.join(f).is_file(), "{f} written");
    }

    // A DSA model on a backend without sparse attention: refused at start-up, naming both.
    let out = sparrow()
        .args(["serve", "--port", "1", "--attention-backend", "cpu", "--model-path"])
        .arg(&model)
        .output()
        .expect("serve runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("\"cpu\"") && err.contains("mla+dsa") && err.contains("\"dsa\""), "{err}");

    // SGLang's CUDA kernel names are refused with a hint, before the model loads.
    let out = sparrow()
        .args(["serve", "--port", "1", "--nsa-decode-backend", "flashmla_sparse", "--model-path"])
        .arg(&model)
        .output()
        .expect("serve runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--nsa-decode-backend") && err.contains("sparse"), "{err}");

    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
    let child = sparrow()
        .args(["serve", "--port", &port.to_string(), "--max-total-tokens", "4096", "--chunked-prefill-size", "64"])
        // All 64 at once, so that the pool must retract (and no batch cap is timed under the
        // test's load and cached).
        .args(["--max-running-requests", "64"])
        .args(["--page-size", "16", "--model-path"])
        .arg(&model)
        .stderr(Stdio::null())
        .spawn()
        .expect("serve starts");
    let _server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "sparrow serve never listened");
        std::thread::sleep(Duration::from_millis(100));
    }
    let info = get(port, "/get_server_info");
    assert!(info.contains("\"attention_backend\":\"dsa\"") && info.contains("moe_autotune"), "{info}");

    let out = sparrow()
        .args(["bench", "--backend", "sglang-oai", "--port", &port.to_string(), "--dataset-name", "random"])
        .args(["--random-input-len", "100", "--random-output-len", "128", "--random-range-ratio", "1"])
        .args(["--num-prompts", "64", "--max-concurrency", "64"])
        .arg("--output-file")
        .arg(tmp.path().join("bench.jsonl"))
        .output()
        .expect("bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("Successful requests:                     64"), "{stdout}");
    assert!(stdout.contains("Failed requests:                         0"), "{stdout}");

    let m = get(port, "/metrics");
    assert!(counter(&m, "sparrow:num_prefill_chunks_total") > 0.0, "chunked prefill ran");
    assert!(counter(&m, "sparrow:num_retractions_total") > 0.0, "retraction ran");
    assert!(counter(&m, "sparrow:radix_hit_tokens_total") > 0.0, "the radix cache hit");
    assert!(get(port, "/health").starts_with("HTTP/1.1 200"), "still serving");
}

fn ppl(model: &std::path::Path) -> f64 {
    let out = sparrow()
        .args(["perplexity", "--num-samples", "6", "--max-tokens", "96", "--model-path"])
        .arg(model)
        .output()
        .expect("perplexity runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON line");
    v["perplexity"].as_f64().expect("perplexity")
}

/// `sparrow quantize` on the SmolLM2 GGUF: with everything excluded the BF16 copy (HF names, Q/K
/// rows un-permuted to HF's rotate-half order, which the loader rotates as halves) scores like
/// the original;
/// round-to-nearest NVFP4 of every linear layer costs some perplexity, within bounds. Input
/// scales come from 8 calibration replies (64 by default): the bounds hold for either, and the
/// quantizer's run is 4× shorter.
#[test]
fn quantize_smollm2_round_trip_and_nvfp4() {
    let gguf = sparrow_assets::ensure(sparrow_assets::SMOLLM2_GGUF).expect("SmolLM2");
    let tmp = tempfile::tempdir().expect("tmp");
    let (bf16, fp4) = (tmp.path().join("bf16"), tmp.path().join("nvfp4"));
    for (dir, extra) in [(&bf16, &["--exclude", "*"][..]), (&fp4, &[][..])] {
        let out = sparrow()
            .args(["quantize", "--method", "rtn", "--calibration-samples", "8", "--model-path"])
            .arg(&gguf)
            .arg("--output")
            .arg(dir)
            .args(extra)
            .output()
            .expect("quantize runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(std::fs::read_to_string(fp4.join("hf_quant_config.json")).expect("quant config").contains("NVFP4"));
    let (p0, p1, p4) = (ppl(&gguf), ppl(&bf16), ppl(&fp4));
    assert!((p1 / p0 - 1.0).abs() < 0.02, "BF16 copy {p1} vs Q4_1 {p0}");
    assert!(p4 > p0 * 0.98 && p4 < p0 * 1.6, "NVFP4 {p4} vs Q4_1 {p0}");
}
