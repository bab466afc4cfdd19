//! Embeddings through the HTTP API of a real encoder: all-MiniLM-L6-v2 from its package, against
//! sentence-transformers' own embeddings of 200 ShareGPT sentences (fixture made by
//! `scripts/goldens/minilm_embeddings.py`); one request of 200 inputs and 200 requests of one
//! give the same bits; `dimensions` and `base64` against their formulas; vLLM's rerank and score
//! shapes; bad input answered with a 400 naming the field, on this server and on a generating one.

use crate::common::*;
use futures_util::future::join_all;
use serde_json::{json, Value};
use std::sync::OnceLock;

struct Golden {
    sentences: Vec<String>,
    input_ids: Vec<Vec<u32>>,
    dim: usize,
    embeddings: Vec<Vec<f32>>,
}

fn b64decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).expect("base64")
}

fn golden() -> &'static Golden {
    static G: OnceLock<Golden> = OnceLock::new();
    G.get_or_init(|| {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/minilm_embeddings.json");
        let v: Value = serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("json");
        let dim = v["dim"].as_u64().expect("dim") as usize;
        let bytes = b64decode(v["f16_base64"].as_str().expect("blob"));
        let flat: Vec<f32> =
            bytes.chunks(2).map(|b| sparrow_cpu::half::f16_to_f32(u16::from_le_bytes([b[0], b[1]]))).collect();
        Golden {
            sentences: serde_json::from_value(v["sentences"].clone()).expect("sentences"),
            input_ids: serde_json::from_value(v["input_ids"].clone()).expect("ids"),
            dim,
            embeddings: flat.chunks(dim).map(<[f32]>::to_vec).collect(),
        }
    })
}

fn server() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| {
        TestServer::start(Opts { model: Some(minilm()), max_total_tokens: Some(40_000), ..Opts::default() })
    })
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().expect("array").iter().map(|x| x.as_f64().expect("number") as f32).collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    d / (n(a) * n(b))
}

async fn embed(body: Value) -> Vec<Vec<f32>> {
    let (st, v) = post(server(), "/v1/embeddings", body).await;
    assert_eq!(st, 200, "{v}");
    v["data"].as_array().expect("data").iter().map(|d| floats(&d["embedding"])).collect()
}

#[tokio::test]
async fn minilm_matches_sentence_transformers_and_batching_changes_no_bit() {
    let g = golden();
    let (st, v) = post(server(), "/v1/embeddings", json!({"input": g.sentences, "model": "model"})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "list");
    let tokens: usize = g.input_ids.iter().map(Vec::len).sum();
    assert_eq!(v["usage"], json!({"prompt_tokens": tokens, "total_tokens": tokens}), "HF's token counts");
    let batched: Vec<Vec<f32>> = v["data"].as_array().expect("data").iter().map(|d| floats(&d["embedding"])).collect();
    assert_eq!(batched.len(), 200);
    for (i, (got, want)) in batched.iter().zip(&g.embeddings).enumerate() {
        assert_eq!(got.len(), g.dim);
        assert_eq!(v["data"][i]["index"], i);
        let c = cosine(got, want);
        // The issue asks 0.9999; measured: at least 0.99999997 (dense f32 weights, f64 norms).
        assert!(c >= 0.99999, "sentence {i}: cosine {c} to sentence-transformers ({:?})", g.sentences[i]);
        let norm: f64 = got.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "sentence {i}: norm {norm}");
    }
    // The same inputs as HF's token ids: the tokenizer is HF's, bit for bit.
    let by_ids = embed(json!({"input": g.input_ids})).await;
    assert!(by_ids == batched, "token-id inputs embed differently from their texts");
    // Each alone, all at once: other batch compositions, the same bits.
    let alone = join_all(g.sentences.iter().map(|s| embed(json!({"input": s})))).await;
    for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
        assert!(a.len() == 1 && a[0] == *b, "sentence {i}: alone differs from batched");
    }
    // Counted in /metrics: 401 requests at least (200 + 200 alone + 1 by ids of 200 inputs), and
    // their prompt tokens.
    let text = client().get(server().url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    let value = |name: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in /metrics"))
    };
    assert!(value("sglang:prompt_tokens_total") >= 3.0 * tokens as f64, "{text}");
    assert!(value("sglang:num_requests_total") >= 600.0, "{text}");
    // SGLang's /encode gives the same vectors.
    let (st, e) = post(server(), "/encode", json!({"text": g.sentences[3]})).await;
    assert_eq!(st, 200, "{e}");
    assert_eq!(floats(&e["embedding"]), batched[3]);
    assert_eq!(e["meta_info"]["prompt_tokens"], g.input_ids[3].len());
    let (st, e) = post(server(), "/encode", json!({"input_ids": [g.input_ids[0], g.input_ids[1]]})).await;
    assert_eq!(st, 200, "{e}");
    assert_eq!(floats(&e[1]["embedding"]), batched[1]);
}

#[tokio::test]
async fn dimensions_and_base64_follow_their_formulas() {
    let g = golden();
    let texts = &g.sentences[..4];
    let full = embed(json!({"input": texts})).await;
    let short = embed(json!({"input": texts, "dimensions": 64})).await;
    for (f, s) in full.iter().zip(&short) {
        // Matryoshka: the first 64 values, normalized again.
        let n: f64 = f[..64].iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
        assert_eq!(s.len(), 64);
        for (a, b) in s.iter().zip(&f[..64]) {
            assert!((*a as f64 - *b as f64 / n).abs() < 1e-6, "{a} vs {}", *b as f64 / n);
        }
    }
    let (st, v) = post(server(), "/v1/embeddings", json!({"input": texts, "encoding_format": "base64"})).await;
    assert_eq!(st, 200, "{v}");
    for (i, f) in full.iter().enumerate() {
        let raw = b64decode(v["data"][i]["embedding"].as_str().expect("a base64 string"));
        let got: Vec<f32> = raw.chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert!(got == *f, "base64 of input {i} is not its little-endian f32 values");
    }
    let (st, v) = post(server(), "/v1/embeddings", json!({"input": "x", "dimensions": 385})).await;
    assert_eq!((st, v["error"]["param"].as_str()), (400, Some("dimensions")), "{v}");
}

/// vLLM's documented examples, field for field (`docs/serving/openai_compatible_server.md`:
/// Re-rank API, Score API), with our scores checked against the embeddings' cosines.
#[tokio::test]
async fn rerank_and_score_have_vllms_shapes() {
    let docs =
        ["The capital of Brazil is Brasilia.", "The capital of France is Paris.", "Horses and cows are both animals"];
    let q = "What is the capital of France?";
    let e = embed(json!({"input": [q, docs[0], docs[1], docs[2]]})).await;
    let want: Vec<f64> = (1..4).map(|j| cosine(&e[0], &e[j])).collect();
    let (st, v) = post(server(), "/v1/rerank", json!({"model": "model", "query": q, "documents": docs})).await;
    assert_eq!(st, 200, "{v}");
    let keys: Vec<&String> = v.as_object().expect("object").keys().collect();
    assert_eq!(keys, ["id", "model", "usage", "results"], "{v}");
    assert!(v["id"].as_str().is_some_and(|s| s.starts_with("rerank-")));
    assert!(v["usage"]["total_tokens"].as_u64().is_some_and(|t| t > 20), "{v}");
    let res = v["results"].as_array().expect("results");
    assert_eq!(res.len(), 3);
    assert_eq!(res[0]["index"], 1, "Paris first: {v}");
    assert_eq!(res[0]["document"], json!({"text": docs[1]}));
    let rkeys: Vec<&String> = res[0].as_object().expect("object").keys().collect();
    assert_eq!(rkeys, ["index", "document", "relevance_score"]);
    let mut last = f64::INFINITY;
    for r in res {
        let (i, s) = (r["index"].as_u64().expect("index") as usize, r["relevance_score"].as_f64().expect("score"));
        assert!((s - want[i]).abs() < 1e-6, "document {i}: {s} vs cosine {}", want[i]);
        assert!(s <= last, "sorted best first: {v}");
        last = s;
    }
    let (st, v) = post(
        server(),
        "/rerank",
        json!({"query": q, "documents": [{"text": docs[0]}, docs[1]], "top_n": 1, "return_documents": false}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["results"], json!([{"index": 1, "relevance_score": v["results"][0]["relevance_score"]}]));
    let (st, v) = post(server(), "/v1/score", json!({"model": "model", "text_1": q, "text_2": docs})).await;
    assert_eq!(st, 200, "{v}");
    let keys: Vec<&String> = v.as_object().expect("object").keys().collect();
    assert_eq!(keys, ["id", "object", "created", "model", "data", "usage"], "{v}");
    assert_eq!(v["object"], "list");
    for (j, d) in v["data"].as_array().expect("data").iter().enumerate() {
        assert_eq!((d["index"].as_u64(), d["object"].as_str()), (Some(j as u64), Some("score")));
        assert!((d["score"].as_f64().expect("score") - want[j]).abs() < 1e-6);
    }
    assert_eq!(v["usage"]["completion_tokens"], 0);
    // One to one, pairwise.
    let (st, v) = post(server(), "/score", json!({"text_1": [q, q], "text_2": [docs[1], docs[2]]})).await;
    assert_eq!(st, 200, "{v}");
    assert!((v["data"][1]["score"].as_f64().expect("score") - want[2]).abs() < 1e-6);
    // Each distinct text is embedded once: "cat" four times is one input of 3 tokens; a text
    // with itself scores at most 1.
    let (st, v) = post(server(), "/v1/score", json!({"text_1": ["cat", "cat"], "text_2": ["cat", "cat"]})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 3, "{v}");
    for d in v["data"].as_array().expect("data") {
        let x = d["score"].as_f64().expect("score");
        assert!(x <= 1.0 && x > 0.999_999, "{v}");
    }
    // vLLM's `normalize: false`: the pooled values as the model gave them.
    let raw = embed(json!({"input": [q], "normalize": false})).await;
    let n: f64 = raw[0].iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    assert!((n - 1.0).abs() > 0.01, "not normalized: norm {n}");
    for (a, b) in raw[0].iter().zip(&e[0]) {
        assert!((*a as f64 / n - *b as f64).abs() < 1e-6);
    }
}

async fn refused(s: &TestServer, path: &str, body: Value, param: &str) -> String {
    let (st, v) = post(s, path, body.clone()).await;
    assert_eq!(st, 400, "{path} {body}: {v}");
    assert_eq!(v["error"]["param"].as_str(), Some(param), "{path} {body}: {v}");
    v["error"]["message"].as_str().expect("message").to_owned()
}

#[tokio::test]
async fn bad_input_is_a_400_naming_the_field() {
    let s = server();
    refused(s, "/v1/embeddings", json!({"input": ""}), "input").await;
    refused(s, "/v1/embeddings", json!({"input": []}), "input").await;
    refused(s, "/v1/embeddings", json!({"input": ["fine", ""]}), "input[1]").await;
    refused(s, "/v1/embeddings", json!({"input": [[101, 99999999]]}), "input[0]").await;
    refused(s, "/v1/embeddings", json!({"input": "x", "encoding_format": "int8"}), "encoding_format").await;
    let long = "word ".repeat(400);
    let m = refused(s, "/v1/embeddings", json!({"input": long}), "input").await;
    assert!(m.contains("256"), "{m}");
    // vLLM's truncate_prompt_tokens keeps the last k tokens of a text, special tokens kept:
    // `[CLS]` + the text's last k − 2 tokens + `[SEP]` (HF's left truncation).
    let (st, v) = post(s, "/v1/embeddings", json!({"input": long, "truncate_prompt_tokens": 100})).await;
    assert_eq!((st, v["usage"]["prompt_tokens"].as_u64()), (200, Some(100)), "{v}");
    let (_, t) = post(s, "/tokenize", json!({"text": long, "add_special_tokens": false})).await;
    let content: Vec<u64> = serde_json::from_value(t["tokens"].clone()).expect("ids");
    let mut want: Vec<u64> = vec![101];
    want.extend(&content[content.len() - 98..]);
    want.push(102);
    let by_ids = embed(json!({"input": [want]})).await;
    assert_eq!(floats(&v["data"][0]["embedding"]), by_ids[0], "truncation keeps [CLS] and [SEP]");
    // On token ids it keeps the last k ids as they are.
    let (st, v) =
        post(s, "/v1/embeddings", json!({"input": [[101, 7592, 2088, 102]], "truncate_prompt_tokens": 2})).await;
    assert_eq!((st, v["usage"]["prompt_tokens"].as_u64()), (200, Some(2)), "{v}");
    refused(s, "/v1/embeddings", json!({"input": long, "truncate_prompt_tokens": 0}), "truncate_prompt_tokens").await;
    // A missing field is named.
    refused(s, "/v1/embeddings", json!({}), "input").await;
    refused(s, "/v1/rerank", json!({"documents": ["d"]}), "query").await;
    refused(s, "/v1/score", json!({"text_1": "a"}), "text_2").await;
    // An item of a list is named by its index, even in a list of one.
    refused(s, "/v1/rerank", json!({"query": "q", "documents": [long]}), "documents[0]").await;
    refused(s, "/v1/score", json!({"text_1": "q", "text_2": [long]}), "text_2[0]").await;
    refused(s, "/v1/score", json!({"text_1": long, "text_2": ["x"]}), "text_1").await;
    refused(s, "/v1/rerank", json!({"query": "q", "documents": []}), "documents").await;
    refused(s, "/v1/rerank", json!({"query": "", "documents": ["d"]}), "query").await;
    refused(s, "/v1/score", json!({"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}), "text_2").await;
    refused(s, "/encode", json!({}), "text").await;
    // Generation routes on an embedding server.
    refused(s, "/v1/completions", json!({"prompt": "hi", "max_tokens": 4}), "model").await;
    refused(s, "/v1/chat/completions", json!({"messages": [{"role": "user", "content": "hi"}]}), "model").await;
    refused(s, "/generate", json!({"text": "hi"}), "model").await;
    // Anthropic's routes answer in Anthropic's error shape.
    let (st, v) = post(s, "/v1/messages/count_tokens", json!({"model": "m", "messages": []})).await;
    assert_eq!(st, 400, "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("serves embeddings")), "{v}");
    // And embedding routes on a generating one.
    let gen = shared();
    for path in ["/v1/embeddings", "/encode", "/v1/rerank", "/v1/score"] {
        let body = json!({"input": "x", "text": "x", "query": "q", "documents": ["d"], "text_1": "a", "text_2": "b"});
        refused(gen, path, body, "model").await;
    }
    // Both still serve.
    assert_eq!(embed(json!({"input": "still here"})).await.len(), 1);
    let st = client().get(s.url("/health_generate")).send().await.expect("request").status();
    assert_eq!(st, 200);
    // Nothing of an embedding request stays in the KV pool.
    assert_drained(s).await;
}

/// SmolLM2 served with `--is-embedding`: the last token's final-norm output, normalized, as
/// llama.cpp computes it with `pooling_type = last` on the same GGUF file
/// (`scripts/goldens/decoder_embedding_golden.py`); texts tokenize to llama.cpp's ids.
#[tokio::test]
async fn a_decoder_with_is_embedding_gives_llama_cpps_last_token_embeddings() {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2_last_token_embeddings.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("json");
    let dim = v["dim"].as_u64().expect("dim") as usize;
    let want: Vec<Vec<f32>> = b64decode(v["f16_base64"].as_str().expect("blob"))
        .chunks(2)
        .map(|b| sparrow_cpu::half::f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
        .collect::<Vec<f32>>()
        .chunks(dim)
        .map(<[f32]>::to_vec)
        .collect();
    let s = TestServer::start(Opts { model: Some(gguf()), is_embedding: true, ..Opts::default() });
    let (st, by_ids) = post(&s, "/v1/embeddings", json!({"input": v["input_ids"]})).await;
    assert_eq!(st, 200, "{by_ids}");
    let (st, by_text) = post(&s, "/v1/embeddings", json!({"input": v["sentences"]})).await;
    assert_eq!(st, 200, "{by_text}");
    assert_eq!(by_ids["data"], by_text["data"], "texts tokenize to llama.cpp's ids");
    // Both sides quantize activations to 8 bits and sum in their own orders through 30 layers
    // (their logits differ by up to ~1, see the engine's llama.cpp golden): measured cosines
    // 0.99896 … 0.99987, mean 0.99970.
    let mut sum = 0.0;
    for (i, w) in want.iter().enumerate() {
        let got = floats(&by_ids["data"][i]["embedding"]);
        assert_eq!(got.len(), 576);
        let c = cosine(&got, w);
        assert!(c >= 0.998, "sentence {i}: cosine {c} to llama.cpp's last-token embedding");
        sum += c;
    }
    assert!(sum / want.len() as f64 >= 0.9995, "mean cosine {}", sum / want.len() as f64);
    // The bound tells one token apart: the second-to-last token's embedding (what pooling one
    // position early would give) is far (measured at most 0.982).
    let cut: Vec<Vec<u32>> = v["input_ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|x| {
            let ids: Vec<u32> = serde_json::from_value(x.clone()).expect("ids");
            ids[..ids.len() - 1].to_vec()
        })
        .collect();
    let (st, short) = post(&s, "/v1/embeddings", json!({"input": cut})).await;
    assert_eq!(st, 200, "{short}");
    for (i, w) in want.iter().enumerate() {
        let c = cosine(&floats(&short["data"][i]["embedding"]), w);
        assert!(c < 0.995, "sentence {i}: one token short still matches ({c}): the test cannot tell");
    }
    // A decoder embedding server generates nothing.
    refused(&s, "/v1/completions", json!({"prompt": "hi"}), "model").await;
    assert_drained(&s).await;
}

/// A synthetic BERT cross-encoder (`scripts/goldens/bert_cross_encoder.py`): `/v1/score` and
/// `/v1/rerank` score each pair `[CLS] q [SEP] d [SEP]` jointly, equal to numpy's f64 forward of
/// the same weights; segment ids matter (the fixture's all-type-0 score is far).
#[tokio::test]
async fn a_cross_encoder_scores_pairs_as_the_f64_reference() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bert_cross_encoder");
    let g: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).expect("golden")).expect("json");
    let s = TestServer::start(Opts { model: Some(dir), ..Opts::default() });
    let pairs = g["pairs"].as_array().expect("pairs");
    let queries: Vec<&str> = {
        let mut q: Vec<&str> = pairs.iter().map(|p| p["query"].as_str().expect("query")).collect();
        q.dedup();
        q
    };
    let mut told_apart = 0;
    for q in queries {
        let mine: Vec<&Value> = pairs.iter().filter(|p| p["query"] == q).collect();
        let docs: Vec<&str> = mine.iter().map(|p| p["document"].as_str().expect("doc")).collect();
        let (st, v) = post(&s, "/v1/score", json!({"text_1": q, "text_2": docs})).await;
        assert_eq!(st, 200, "{v}");
        let tokens: usize = mine.iter().map(|p| p["input_ids"].as_array().expect("ids").len()).sum();
        assert_eq!(v["usage"]["prompt_tokens"], tokens, "pair tokenization: {v}");
        for (j, p) in mine.iter().enumerate() {
            let got = v["data"][j]["score"].as_f64().expect("score");
            let want = p["score"].as_f64().expect("score");
            assert!((got - want).abs() < 1e-5, "{q:?} / {:?}: {got} vs f64 {want}", docs[j]);
            if (p["score_all_type_0"].as_f64().expect("broken") - want).abs() > 1e-3 {
                told_apart += 1;
            }
        }
        let (st, r) = post(&s, "/v1/rerank", json!({"query": q, "documents": docs, "top_n": 2})).await;
        assert_eq!(st, 200, "{r}");
        let best = mine
            .iter()
            .enumerate()
            .max_by(|a, b| a.1["score"].as_f64().unwrap_or(0.0).total_cmp(&b.1["score"].as_f64().unwrap_or(0.0)))
            .map(|(j, _)| j);
        assert_eq!(r["results"][0]["index"].as_u64().map(|x| x as usize), best, "{r}");
        assert_eq!(r["results"].as_array().map(Vec::len), Some(2));
    }
    assert!(told_apart >= 20, "only {told_apart} of 24 pairs tell segment ids apart");
    refused(&s, "/v1/embeddings", json!({"input": "x"}), "model").await;
}
