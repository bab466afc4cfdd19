//! `tokenizer.json` files read through `sparrow_tokenizer::hf_json`: a real SentencePiece
//! `Precompiled` charsmap (built by SentencePiece, `scripts/goldens/precompiled_charsmap.py`)
//! normalizes as SentencePiece does; malformed charsmaps, malformed JSON and a post-processor
//! that names an undefined special token are load errors naming the file and the fault, where
//! the `tokenizers` crate alone panicked or indexed out of bounds (at load or at every encode).

use std::path::PathBuf;

use base64::Engine as _;
use serde_json::{json, Value};
use sparrow_tokenizer::Tokenizer;

fn golden() -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/precompiled_charsmap.json");
    serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("json")
}

/// A byte-fallback BPE with no merges behind `normalizer`: every character becomes its UTF-8
/// byte tokens and decodes back, so decode(encode(x)) is x normalized.
fn tokenizer_json(normalizer: Value) -> Value {
    let mut vocab = serde_json::Map::new();
    vocab.insert("<unk>".into(), json!(0));
    for b in 0..=255u32 {
        vocab.insert(format!("<0x{b:02X}>"), json!(b + 1));
    }
    json!({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": normalizer, "pre_tokenizer": null, "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": true, "ignore_merges": false,
            "vocab": vocab, "merges": []}})
}

fn load(text: &str) -> Result<Tokenizer, String> {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, text).expect("write");
    Tokenizer::load(&path).map_err(|e| e.to_string())
}

fn precompiled(blob: &[u8]) -> Value {
    json!({"type": "Sequence", "normalizers": [{"type": "Precompiled",
        "precompiled_charsmap": base64::engine::general_purpose::STANDARD.encode(blob)}]})
}

fn charsmap() -> Vec<u8> {
    let g = golden();
    base64::engine::general_purpose::STANDARD.decode(g["precompiled_charsmap"].as_str().expect("b64")).expect("b64")
}

#[test]
fn a_real_charsmap_normalizes_as_sentencepiece() {
    let g = golden();
    let blob = charsmap();
    sparrow_tokenizer::hf_json::check_charsmap(&blob).expect("SentencePiece's own charsmap passes");
    let tok = load(&tokenizer_json(precompiled(&blob)).to_string()).expect("loads");
    for case in g["cases"].as_array().expect("cases") {
        let (input, want) = (case[0].as_str().expect("in"), case[1].as_str().expect("out"));
        let ids = tok.encode(input, false).expect("encode");
        assert_eq!(tok.decode(&ids, false).expect("decode"), want, "{input:?}");
    }
}

#[test]
fn malformed_charsmaps_are_load_errors_naming_the_fault() {
    let real = charsmap();
    let trie_bytes = u32::from_le_bytes([real[0], real[1], real[2], real[3]]) as usize;
    let with_size = |size: u32, rest: &[u8]| [&size.to_le_bytes()[..], rest].concat();
    // The replacement strings cut to 3 bytes: leaves point past them.
    let short_strings = [&real[..4 + trie_bytes], &real[4 + trie_bytes..4 + trie_bytes + 3]].concat();
    // A NUL-free byte in the strings made invalid UTF-8.
    let mut bad_utf8 = real.clone();
    let last = bad_utf8.len() - 2;
    bad_utf8[last] = 0xFF;
    // Root offset 2^20: the first step lands far past the one unit.
    let far_root = with_size(4, &((1u32 << 20) << 10).to_le_bytes());
    let cases: Vec<(&str, Value)> = vec![
        ("shorter than its 4-byte trie size", precompiled(&[1, 2])),
        ("a trie of 4294967295 bytes", precompiled(&with_size(u32::MAX, &real[4..]))),
        ("an empty trie", precompiled(&with_size(0, b"a\0"))),
        ("steps from node", precompiled(&far_root)),
        ("not a character's start", precompiled(&short_strings)),
        ("not UTF-8", precompiled(&bad_utf8)),
        ("not base64", json!({"type": "Precompiled", "precompiled_charsmap": "@@not base64@@"})),
        ("without a precompiled_charsmap string", json!({"type": "Precompiled"})),
        // serde reads an enum from a one-key map too: the same normalizer, the same check.
        ("a trie of 4294967295 bytes", json!({"type": {"Precompiled": null}, "precompiled_charsmap": "/////w=="})),
    ];
    for (want, normalizer) in cases {
        let e = load(&tokenizer_json(normalizer).to_string()).map(|_| ()).expect_err(want);
        assert!(e.contains("tokenizer.json") && e.contains(want), "{want}: {e}");
    }
}

/// A normalizer given twice: `tokenizers` would deserialize both (the first, a charsmap whose
/// trie size asks for 8 GiB, unchecked); what it reads is the checked value, the last.
#[test]
fn a_repeated_key_is_read_once() {
    let t = tokenizer_json(Value::Null).to_string();
    let twice = t.replacen(
        "\"normalizer\":null",
        "\"normalizer\":{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"/////w==\"},\"normalizer\":null",
        1,
    );
    assert_ne!(twice, t);
    let tok = load(&twice).expect("the last normalizer, none, is the one read");
    assert_eq!(tok.encode("ab", false).expect("encode"), [0x61 + 1, 0x62 + 1]);
}

/// A post-processor template naming a special token it does not define (`tokenizers` panics
/// at every encode: "no entry found for key") fails the load, found by the probe encode.
#[test]
fn a_post_processor_broken_for_every_input_is_a_load_error() {
    let mut t = tokenizer_json(Value::Null);
    t["post_processor"] = json!({"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {}});
    let e = load(&t.to_string()).map(|_| ()).expect_err("no <s>");
    assert!(e.contains("tokenizer.json: the tokenizers library fails on a probe text"), "{e}");
    // The same tokenizer with the token defined loads and puts it first.
    t["post_processor"]["special_tokens"] = json!({"<s>": {"id": "<s>", "ids": [1], "tokens": ["<0x00>"]}});
    let tok = load(&t.to_string()).expect("loads");
    assert_eq!(tok.encode("a", true).expect("encode"), [1, 0x61 + 1]);
}

/// A syntax error inside `decoder` (where `tokenizers` panics with `.expect("Helper")`) is a
/// JSON error with its place.
#[test]
fn malformed_json_is_a_load_error() {
    let text = tokenizer_json(Value::Null).to_string().replacen("\"ByteFallback\"}", "\"ByteFallback\" 0.0}", 1);
    let e = load(&text).map(|_| ()).expect_err("not JSON");
    assert!(e.contains("tokenizer.json: not JSON: expected `,` or `}`"), "{e}");
}
