//! Seed inputs, made here rather than committed: tiny but complete files of each kind (a Llama
//! and a Qwen2 GGUF with a byte-level BPE vocabulary, a SentencePiece and a WordPiece
//! vocabulary, a Llama HF checkpoint, real chat templates, grammars of each field, streams of
//! each API), so the fuzzer starts from inputs that reach deep into each parser. The corpus
//! test checks that each complete seed is accepted, so a seed that rots fails CI instead of
//! silently fuzzing only the first error path.

use crate::SEP;

/// GGUF value type numbers (`ggml/include/gguf.h`).
const U32: u32 = 4;
const I32: u32 = 5;
const F32: u32 = 6;
const BOOL: u32 = 7;
const STRING: u32 = 8;
const ARRAY: u32 = 9;

/// A metadata value of a GGUF file being written.
pub enum Meta {
    /// `u32`.
    U32(u32),
    /// `f32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// A string.
    Str(String),
    /// An array of strings.
    Strs(Vec<String>),
    /// An array of `i32`.
    I32s(Vec<i32>),
    /// An array of `f32`.
    F32s(Vec<f32>),
}

fn put_str(f: &mut Vec<u8>, s: &str) {
    f.extend_from_slice(&(s.len() as u64).to_le_bytes());
    f.extend_from_slice(s.as_bytes());
}

/// A GGUF version 3 file: `meta` in order, then F32 tensors (name, GGUF shape innermost first,
/// values), data aligned to 32 bytes.
pub fn gguf(meta: &[(&str, Meta)], tensors: &[(String, Vec<u64>, Vec<f32>)]) -> Vec<u8> {
    let mut f = b"GGUF".to_vec();
    f.extend_from_slice(&3u32.to_le_bytes());
    f.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    f.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        put_str(&mut f, k);
        let arr = |f: &mut Vec<u8>, ty: u32, n: usize| {
            f.extend_from_slice(&ARRAY.to_le_bytes());
            f.extend_from_slice(&ty.to_le_bytes());
            f.extend_from_slice(&(n as u64).to_le_bytes());
        };
        match v {
            Meta::U32(x) => {
                f.extend_from_slice(&U32.to_le_bytes());
                f.extend_from_slice(&x.to_le_bytes());
            }
            Meta::F32(x) => {
                f.extend_from_slice(&F32.to_le_bytes());
                f.extend_from_slice(&x.to_le_bytes());
            }
            Meta::Bool(x) => {
                f.extend_from_slice(&BOOL.to_le_bytes());
                f.push(u8::from(*x));
            }
            Meta::Str(s) => {
                f.extend_from_slice(&STRING.to_le_bytes());
                put_str(&mut f, s);
            }
            Meta::Strs(v) => {
                arr(&mut f, STRING, v.len());
                v.iter().for_each(|s| put_str(&mut f, s));
            }
            Meta::I32s(v) => {
                arr(&mut f, I32, v.len());
                v.iter().for_each(|x| f.extend_from_slice(&x.to_le_bytes()));
            }
            Meta::F32s(v) => {
                arr(&mut f, F32, v.len());
                v.iter().for_each(|x| f.extend_from_slice(&x.to_le_bytes()));
            }
        }
    }
    let mut offset = 0u64;
    for (name, shape, values) in tensors {
        put_str(&mut f, name);
        f.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        shape.iter().for_each(|d| f.extend_from_slice(&d.to_le_bytes()));
        f.extend_from_slice(&0u32.to_le_bytes());
        f.extend_from_slice(&offset.to_le_bytes());
        offset += (values.len() as u64 * 4).next_multiple_of(32);
    }
    while !f.len().is_multiple_of(32) {
        f.push(0);
    }
    for (_, _, values) in tensors {
        values.iter().for_each(|x| f.extend_from_slice(&x.to_le_bytes()));
        while !f.len().is_multiple_of(32) {
            f.push(0);
        }
    }
    f
}

/// GPT-2's byte-to-character map (`bytes_to_unicode`): printable bytes stand for themselves,
/// the others for the characters from U+0100 on.
fn byte_char(b: u8) -> char {
    let keeps = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if keeps(b) {
        char::from(b)
    } else {
        let n = (0..b).filter(|&x| !keeps(x)).count() as u32;
        char::from_u32(256 + n).unwrap_or('?')
    }
}

/// A byte-level BPE vocabulary: the 256 byte characters, 6 merged words, 2 control tokens; its
/// merges; its token types.
fn bpe_vocab() -> (Vec<String>, Vec<String>, Vec<i32>) {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let merges = ["Ġ t", "Ġt h", "h e", "Ġth e", "i n", "Ġ a"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
    }
    tokens.push("<|im_start|>".into());
    tokens.push("<|im_end|>".into());
    let types = (0..tokens.len()).map(|i| if i >= 262 { 3 } else { 1 }).collect();
    (tokens, merges.iter().map(|s| s.to_string()).collect(), types)
}

/// ChatML, as SmolLM2 and Qwen2 ship it.
pub const CHATML: &str =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + \
     '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// A tokenizer's metadata for a GGUF file of `arch`: `bpe` (gpt2 with merges), `spm` (llama
/// with scores and byte tokens) or `wpm` (bert).
pub fn tokenizer_meta(kind: &str) -> Vec<(&'static str, Meta)> {
    match kind {
        "spm" => {
            let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
            tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
            for w in ["▁", "▁a", "▁the", "he", "llo", "▁he", "▁hello", "o"] {
                tokens.push(w.into());
            }
            let types: Vec<i32> =
                (0..tokens.len()).map(|i| [2, 3, 3].get(i).copied().unwrap_or(if i < 259 { 6 } else { 1 })).collect();
            let scores: Vec<f32> = (0..tokens.len()).map(|i| -(i as f32)).collect();
            vec![
                ("tokenizer.ggml.model", Meta::Str("llama".into())),
                ("tokenizer.ggml.tokens", Meta::Strs(tokens)),
                ("tokenizer.ggml.scores", Meta::F32s(scores)),
                ("tokenizer.ggml.token_type", Meta::I32s(types)),
                ("tokenizer.ggml.bos_token_id", Meta::U32(1)),
                ("tokenizer.ggml.eos_token_id", Meta::U32(2)),
                ("tokenizer.ggml.unknown_token_id", Meta::U32(0)),
                ("tokenizer.ggml.add_bos_token", Meta::Bool(true)),
                ("tokenizer.chat_template", Meta::Str(LLAMA2_TEMPLATE.into())),
            ]
        }
        "wpm" => {
            let tokens = wpm_tokens();
            let types: Vec<i32> = (0..tokens.len()).map(|i| if i < 5 { 3 } else { 1 }).collect();
            vec![
                ("tokenizer.ggml.model", Meta::Str("bert".into())),
                ("tokenizer.ggml.tokens", Meta::Strs(tokens)),
                ("tokenizer.ggml.token_type", Meta::I32s(types)),
                ("tokenizer.ggml.unknown_token_id", Meta::U32(1)),
                ("tokenizer.ggml.cls_token_id", Meta::U32(2)),
                ("tokenizer.ggml.seperator_token_id", Meta::U32(3)),
                ("tokenizer.ggml.padding_token_id", Meta::U32(0)),
            ]
        }
        _ => {
            let (tokens, merges, types) = bpe_vocab();
            vec![
                ("tokenizer.ggml.model", Meta::Str("gpt2".into())),
                ("tokenizer.ggml.pre", Meta::Str("smollm".into())),
                ("tokenizer.ggml.tokens", Meta::Strs(tokens)),
                ("tokenizer.ggml.token_type", Meta::I32s(types)),
                ("tokenizer.ggml.merges", Meta::Strs(merges)),
                ("tokenizer.ggml.bos_token_id", Meta::U32(262)),
                ("tokenizer.ggml.eos_token_id", Meta::U32(263)),
                ("tokenizer.chat_template", Meta::Str(CHATML.into())),
            ]
        }
    }
}

/// A WordPiece vocabulary: BERT's 5 control tokens, letters, `##` letters, a few words.
fn wpm_tokens() -> Vec<String> {
    let mut tokens: Vec<String> =
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"].iter().map(|s| s.to_string()).collect();
    tokens.extend(('a'..='z').map(|c| c.to_string()));
    tokens.extend(('a'..='z').map(|c| format!("##{c}")));
    tokens.extend(["hello", "world", "the", ",", "!", "1", "2", "3"].iter().map(|s| s.to_string()));
    tokens
}

/// A Hugging Face tokenizer directory's two files, `tokenizer.json` then
/// `tokenizer_config.json` (bos, eos, chat template), joined by [`SEP`], for `kind`: `bpe`
/// (byte-level BPE with a digit split and added control tokens, as SmolLM2's), `spm` (BPE with
/// byte fallback and the `▁` normalizer, as Llama 2's), `unigram` (a SentencePiece `Precompiled` normalizer and Metaspace, as T5's), `wpm`
/// (BERT's normalizer, WordPiece and a `[CLS] … [SEP]` template, as all-MiniLM-L6-v2's).
pub fn tokenizer_json(kind: &str) -> Vec<u8> {
    use serde_json::json;
    let added = |names: &[&str], first: usize| -> serde_json::Value {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                json!({"id": first + i, "content": n, "single_word": false, "lstrip": false, "rstrip": false,
                    "normalized": false, "special": true})
            })
            .collect()
    };
    let vocab = |tokens: &[String]| -> serde_json::Value {
        tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect::<serde_json::Map<_, _>>().into()
    };
    let (tokenizer, config) = match kind {
        "spm" => {
            let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
            tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
            let pieces = ["▁", "a", "d", "e", "h", "l", "o", "r", "t", "w"];
            let merges =
                ["▁ t", "h e", "▁t he", "l l", "ll o", "he llo", "▁ hello", "o r", "w or", "▁ wor", "l d", "▁wor ld"];
            tokens.extend(pieces.iter().map(|p| p.to_string()));
            tokens.extend(merges.iter().map(|m| m.replace(' ', "")));
            (
                json!({"version": "1.0", "truncation": null, "padding": null,
                    "added_tokens": added(&["<unk>", "<s>", "</s>"], 0),
                    "normalizer": {"type": "Sequence", "normalizers": [
                        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
                    "pre_tokenizer": null,
                    "post_processor": {"type": "TemplateProcessing",
                        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
                    "decoder": {"type": "Sequence", "decoders": [
                        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
                        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
                    "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                        "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                        "vocab": vocab(&tokens), "merges": merges}}),
                json!({"bos_token": "<s>", "eos_token": {"content": "</s>", "special": true}, "chat_template": LLAMA2_TEMPLATE}),
            )
        }
        "unigram" => {
            let pieces = [
                "<unk>", "</s>", "▁", "▁the", "▁hello", "▁world", "▁w", "or", "ld", "h", "e", "l", "o", "t", "w", "r",
                "d", ",",
            ];
            let vocab: Vec<serde_json::Value> = pieces
                .iter()
                .enumerate()
                .map(|(i, p)| json!([p, if i < 2 { 0.0 } else { -(i as f64) * 0.5 }]))
                .collect();
            (
                json!({"version": "1.0", "truncation": null, "padding": null,
                    "added_tokens": added(&["<unk>", "</s>"], 0),
                    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Precompiled",
                            "precompiled_charsmap": precompiled_charsmap()},
                        {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]},
                    "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
                    "post_processor": {"type": "TemplateProcessing",
                        "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 0}}],
                        "special_tokens": {"</s>": {"id": "</s>", "ids": [1], "tokens": ["</s>"]}}},
                    "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
                    "model": {"type": "Unigram", "unk_id": 0, "vocab": vocab, "byte_fallback": false}}),
                json!({"eos_token": "</s>", "chat_template": CHATML}),
            )
        }
        "wpm" => {
            let tokens = wpm_tokens();
            (
                json!({"version": "1.0", "truncation": {"direction": "Right", "max_length": 128, "strategy": "LongestFirst", "stride": 0},
                    "padding": {"strategy": {"Fixed": 128}, "direction": "Right", "pad_to_multiple_of": null, "pad_id": 0,
                        "pad_type_id": 0, "pad_token": "[PAD]"},
                    "added_tokens": added(&["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], 0),
                    "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                        "strip_accents": null, "lowercase": true},
                    "pre_tokenizer": {"type": "BertPreTokenizer"},
                    "post_processor": {"type": "TemplateProcessing",
                        "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                            {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
                        "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                            {"SpecialToken": {"id": "[SEP]", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                            {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
                        "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                            "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
                    "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
                    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                        "max_input_chars_per_word": 100, "vocab": vocab(&tokens)}}),
                json!({"cls_token": "[CLS]", "sep_token": "[SEP]", "unk_token": "[UNK]", "do_lower_case": true}),
            )
        }
        _ => {
            let (tokens, merges, _) = bpe_vocab();
            (
                json!({"version": "1.0", "truncation": null, "padding": null,
                    "added_tokens": added(&["<|im_start|>", "<|im_end|>"], 262),
                    "normalizer": null,
                    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                        {"type": "Digits", "individual_digits": true},
                        {"type": "Split", "pattern": {"Regex": "'s|'t|'re| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},
                            "behavior": "Isolated", "invert": false},
                        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
                    "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
                    "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
                    "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                        "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                        "vocab": vocab(&tokens), "merges": merges}}),
                json!({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": CHATML}),
            )
        }
    };
    let mut b = serde_json::to_vec_pretty(&tokenizer).unwrap_or_default();
    b.extend_from_slice(SEP);
    b.extend_from_slice(&serde_json::to_vec(&config).unwrap_or_default());
    b
}

/// A real SentencePiece `precompiled_charsmap` (base64), the tokenizer crate's fixture made by
/// `scripts/goldens/precompiled_charsmap.py`: a few NFKC-like rules compiled by `spm_train`.
fn precompiled_charsmap() -> String {
    const FIXTURE: &str = include_str!("../../crates/tokenizer/tests/fixtures/precompiled_charsmap.json");
    serde_json::from_str::<serde_json::Value>(FIXTURE)
        .ok()
        .and_then(|v| v["precompiled_charsmap"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Llama 2's template (system folded into the first user turn, `raise_exception` on roles out
/// of turn).
pub const LLAMA2_TEMPLATE: &str = "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}\
{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}\
{% for message in loop_messages %}{% if loop.index0 == 0 and system_message != false %}\
{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}\
{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}\
{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

/// Small deterministic weights: `n` values of a sine, never all equal, within ±0.1.
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| 0.1 * ((i * 7 + seed * 13) as f32 * 0.37).sin()).collect()
}

/// Hidden size, heads, KV heads, FFN width and context of the tiny models.
const HIDDEN: u64 = 32;
const HEADS: u32 = 2;
const KV_HEADS: u32 = 1;
const FFN: u64 = 64;
const CTX: u32 = 256;

/// A one-layer `arch` (`llama` or `qwen2`, which adds Q/K/V biases) GGUF with the BPE
/// vocabulary of [`tokenizer_meta`].
pub fn tiny_gguf(arch: &str) -> Vec<u8> {
    let key = |k: &str| -> &'static str { Box::leak(format!("{arch}.{k}").into_boxed_str()) };
    let mut meta = vec![
        ("general.architecture", Meta::Str(arch.into())),
        ("general.name", Meta::Str(format!("tiny-{arch}"))),
        (key("context_length"), Meta::U32(CTX)),
        (key("embedding_length"), Meta::U32(HIDDEN as u32)),
        (key("block_count"), Meta::U32(1)),
        (key("feed_forward_length"), Meta::U32(FFN as u32)),
        (key("attention.head_count"), Meta::U32(HEADS)),
        (key("attention.head_count_kv"), Meta::U32(KV_HEADS)),
        (key("attention.layer_norm_rms_epsilon"), Meta::F32(1e-5)),
        (key("rope.freq_base"), Meta::F32(10000.0)),
    ];
    meta.extend(tokenizer_meta("bpe"));
    let vocab = bpe_vocab().0.len() as u64;
    let head = HIDDEN / HEADS as u64;
    let kv = head * KV_HEADS as u64;
    let mut t = vec![
        ("token_embd.weight".to_string(), vec![HIDDEN, vocab]),
        ("output_norm.weight".into(), vec![HIDDEN]),
        ("blk.0.attn_norm.weight".into(), vec![HIDDEN]),
        ("blk.0.attn_q.weight".into(), vec![HIDDEN, HIDDEN]),
        ("blk.0.attn_k.weight".into(), vec![HIDDEN, kv]),
        ("blk.0.attn_v.weight".into(), vec![HIDDEN, kv]),
        ("blk.0.attn_output.weight".into(), vec![HIDDEN, HIDDEN]),
        ("blk.0.ffn_norm.weight".into(), vec![HIDDEN]),
        ("blk.0.ffn_gate.weight".into(), vec![HIDDEN, FFN]),
        ("blk.0.ffn_up.weight".into(), vec![HIDDEN, FFN]),
        ("blk.0.ffn_down.weight".into(), vec![FFN, HIDDEN]),
    ];
    if arch == "qwen2" {
        t.push(("blk.0.attn_q.bias".into(), vec![HIDDEN]));
        t.push(("blk.0.attn_k.bias".into(), vec![kv]));
        t.push(("blk.0.attn_v.bias".into(), vec![kv]));
    }
    let tensors: Vec<(String, Vec<u64>, Vec<f32>)> = t
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let n = shape.iter().product::<u64>() as usize;
            let v = if name.ends_with("norm.weight") { vec![1.0; n] } else { values(n, i) };
            (name, shape, v)
        })
        .collect();
    gguf(&meta, &tensors)
}

/// A vocabulary-only GGUF (no tensors) of tokenizer `kind`, as llama.cpp's `ggml-vocab-*.gguf`.
pub fn vocab_gguf(kind: &str) -> Vec<u8> {
    let mut meta = vec![("general.architecture", Meta::Str("llama".into()))];
    meta.extend(tokenizer_meta(kind));
    gguf(&meta, &[])
}

/// A safetensors file of F32 tensors (`safetensors`' format: u64 header length, JSON header,
/// data).
pub fn safetensors(tensors: &[(String, Vec<u64>, Vec<f32>)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, shape, values) in tensors {
        let start = data.len();
        values.iter().for_each(|x: &f32| data.extend_from_slice(&x.to_le_bytes()));
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut h = serde_json::Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut f = (h.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(&h);
    f.extend_from_slice(&data);
    f
}

/// A one-layer Llama HF checkpoint as [`crate::hf_checkpoint`] reads it: `config.json`,
/// [`SEP`], `model.safetensors`.
pub fn tiny_hf() -> Vec<u8> {
    let vocab = 64u64;
    let config = serde_json::json!({
        "model_type": "llama", "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": 1,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "vocab_size": vocab,
        "max_position_embeddings": CTX, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": true,
    });
    let kv = HIDDEN / HEADS as u64 * KV_HEADS as u64;
    let p = "model.layers.0.";
    let shapes: Vec<(String, Vec<u64>)> = vec![
        ("model.embed_tokens.weight".into(), vec![vocab, HIDDEN]),
        ("model.norm.weight".into(), vec![HIDDEN]),
        (format!("{p}input_layernorm.weight"), vec![HIDDEN]),
        (format!("{p}post_attention_layernorm.weight"), vec![HIDDEN]),
        (format!("{p}self_attn.q_proj.weight"), vec![HIDDEN, HIDDEN]),
        (format!("{p}self_attn.k_proj.weight"), vec![kv, HIDDEN]),
        (format!("{p}self_attn.v_proj.weight"), vec![kv, HIDDEN]),
        (format!("{p}self_attn.o_proj.weight"), vec![HIDDEN, HIDDEN]),
        (format!("{p}mlp.gate_proj.weight"), vec![FFN, HIDDEN]),
        (format!("{p}mlp.up_proj.weight"), vec![FFN, HIDDEN]),
        (format!("{p}mlp.down_proj.weight"), vec![HIDDEN, FFN]),
    ];
    let tensors: Vec<(String, Vec<u64>, Vec<f32>)> = shapes
        .into_iter()
        .enumerate()
        .map(|(i, (n, s))| {
            let len = s.iter().product::<u64>() as usize;
            (n, s, values(len, i))
        })
        .collect();
    let mut out = serde_json::to_vec_pretty(&config).unwrap_or_default();
    out.extend_from_slice(SEP);
    out.extend_from_slice(&safetensors(&tensors));
    out
}

/// Phi-4-mini's chat template as its `tokenizer_config.json` ships it (tools in the system
/// turn).
const PHI4_TEMPLATE: &str =
    include_str!("../../crates/tokenizer/tests/fixtures/templates/microsoft-Phi-4-mini-instruct.jinja");

/// A Llama 3.1-style template: tools as JSON, tool calls and tool results, `loop` variables,
/// filters, namespaces.
const TOOLS_TEMPLATE: &str = "{{- bos_token }}{%- set ns = namespace(sys='') %}\
{%- if messages[0]['role'] == 'system' %}{%- set ns.sys = messages[0]['content']|trim %}{%- set messages = messages[1:] %}{%- endif %}\
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}{%- if tools is not none %}{{- 'Tools:\\n' }}\
{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n\\n' }}{%- endfor %}{%- endif %}{{- ns.sys }}{{- '<|eot_id|>' }}\
{%- for message in messages %}{%- if message.role == 'assistant' and message.tool_calls %}\
{%- for tc in message.tool_calls %}{{- '{\"name\": \"' + tc.function.name + '\", \"parameters\": ' }}{{- tc.function.arguments | tojson }}{{- '}' }}{%- endfor %}\
{%- elif message.role == 'tool' %}{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content | string + '<|eot_id|>' }}\
{%- else %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endif %}\
{%- if loop.last and add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}{%- endfor %}";

/// Every target's seeds: (target, name, bytes).
pub fn all() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let mut v: Vec<(&'static str, &'static str, Vec<u8>)> = Vec::new();
    for (name, f) in [("llama", tiny_gguf("llama")), ("qwen2", tiny_gguf("qwen2"))] {
        v.push(("gguf_index", name, f.clone()));
        v.push(("gguf_load", name, f));
    }
    for kind in ["bpe", "spm", "wpm"] {
        v.push(("tokenizer_gguf", kind, vocab_gguf(kind)));
    }
    v.push(("gguf_index", "vocab_spm", vocab_gguf("spm")));
    for kind in ["bpe", "spm", "unigram", "wpm"] {
        v.push(("tokenizer_json", kind, tokenizer_json(kind)));
    }
    v.push(("hf_checkpoint", "llama", tiny_hf()));
    for (name, t) in
        [("chatml", CHATML), ("llama2", LLAMA2_TEMPLATE), ("phi4_mini", PHI4_TEMPLATE), ("tools", TOOLS_TEMPLATE)]
    {
        v.push(("chat_template", name, t.as_bytes().to_vec()));
    }
    let schema = r#"{"type":"object","properties":{"name":{"type":"string","maxLength":8},"age":{"type":"integer","minimum":0},"tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":3}},"required":["name","age"]}"#;
    for (name, kind, text) in [
        ("schema", 0u8, schema),
        ("regex", 1, r"[a-z]{1,8}@[a-z]+\.(com|org)"),
        ("lark", 2, "start: item+\nitem: \"a\" | \"the\" NUMBER\nNUMBER: /[0-9]+/\n"),
        ("gbnf", 2, "root ::= answer\nanswer ::= \"yes\" | \"no\" | [0-9]+\n"),
        ("choice", 3, "true\nfalse\nabc"),
    ] {
        let mut b = vec![kind];
        b.extend_from_slice(text.as_bytes());
        v.push(("grammar", name, b));
    }
    let mut stream = |name: &'static str, api: u8, frames: &[&str]| {
        let mut b = vec![api];
        for (i, f) in frames.iter().enumerate() {
            if i > 0 {
                b.extend_from_slice(SEP);
            }
            b.extend_from_slice(f.as_bytes());
        }
        v.push(("sse_stream", name, b));
    };
    stream(
        "generate",
        0,
        &[
            "data: {\"text\":\"Hel\",\"meta_info\":{\"completion_tokens\":1,\"finish_reason\":null}}\n\n",
            "data: {\"text\":\"Hello\",\"meta_info\":{\"completion_tokens\":2,\"prompt_tokens\":5,\"finish_reason\":{\"type\":\"length\",\"length\":2}}}\n\ndata: [DONE]\n\n",
        ],
    );
    stream(
        "completions",
        1,
        &[
            "data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n: keep-alive\n\n",
            "data: {\"choices\":[{\"text\":\"b\",\"finish_reason\":\"stop\"}]}\r\n\r\ndata: [DONE]\n\n",
        ],
    );
    stream(
        "chat",
        2,
        &[
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"reasoning_content\":\"hm\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"\\u00e9t\\u00e9\"},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"error\":{\"message\":\"boom\",\"code\":500}}\n\n",
        ],
    );
    stream("trt", 3, &["data: {\"text_output\":\"x\"}\n\n"]);
    v
}
