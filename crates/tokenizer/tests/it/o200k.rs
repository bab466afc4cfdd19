//! GPT-4o's o200k vocabulary under llama.cpp's `gpt-4o` pre-tokenizer (Phi-4-mini's GGUFs), against
//! OpenAI's own BPE (tiktoken, as the tiktoken-rs crate ports it); and the same vocabulary under
//! Mistral's `tekken` pre-tokenizer (Mistral Nemo's and Ministral's GGUFs), against tiktoken run
//! with Tekken's split pattern, which is how Mistral's own tokenizer (`mistral-common`'s
//! `Tekkenizer`) encodes: its vocabulary is a tiktoken one.
//!
//! No `ggml-vocab-*.gguf` of o200k is vendored with llama.cpp, so the test writes one the way
//! llama.cpp's converter writes a tiktoken vocabulary (`convert_hf_to_gguf.py`, `QwenModel.bpe` and
//! `token_bytes_to_string`): every rank's bytes through GPT-2's byte-to-unicode map, and each
//! merge found by re-running BPE on the token with only the ranks below its own.

use std::collections::HashMap;
use std::path::Path;

use ggus::{GGufFileHeader, GGufFileWriter, GGufMetaDataValueType as Ty};
use sparrow_tokenizer::Tokenizer;

/// o200k_base's ranks (its special tokens come after them).
const RANKS: u32 = 199_998;

/// GPT-2's byte-to-unicode map (printable bytes as themselves, the rest from U+0100).
fn byte_map() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut n = 0;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        map[b as usize] = if printable {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).expect("char")
        };
    }
    map
}

/// The merge that builds `tok` (rank `rank`): BPE over its bytes with the lower ranks only,
/// which must end in two parts.
fn merge_of<'a>(tok: &'a [u8], rank: u32, ranks: &HashMap<&[u8], u32>) -> (&'a [u8], &'a [u8]) {
    let mut cuts: Vec<usize> = (0..=tok.len()).collect();
    loop {
        let best = (0..cuts.len() - 2)
            .filter_map(|i| ranks.get(&tok[cuts[i]..cuts[i + 2]]).filter(|&&r| r < rank).map(|&r| (r, i)))
            .min();
        match best {
            Some((_, i)) => {
                cuts.remove(i + 1);
            }
            None => break,
        }
    }
    assert_eq!(cuts.len(), 3, "token {tok:?} is not one merge of lower ranks");
    (&tok[..cuts[1]], &tok[cuts[1]..])
}

fn gguf_string(s: &str) -> Vec<u8> {
    [&(s.len() as u64).to_le_bytes()[..], s.as_bytes()].concat()
}

fn string_array(items: &[String]) -> Vec<u8> {
    let mut v = (Ty::String as u32).to_le_bytes().to_vec();
    v.extend((items.len() as u64).to_le_bytes());
    items.iter().for_each(|s| v.extend(gguf_string(s)));
    v
}

/// A vocabulary-only GGUF of o200k (ranks, then `<|endoftext|>` as EOS) with the pre-tokenizer
/// `pre`.
fn write_o200k(path: &Path, toks: &[Vec<u8>], pre: &str) {
    let map = byte_map();
    let text = |b: &[u8]| b.iter().map(|&x| map[x as usize]).collect::<String>();
    let ranks: HashMap<&[u8], u32> = toks.iter().enumerate().map(|(i, t)| (t.as_slice(), i as u32)).collect();
    let mut tokens: Vec<String> = toks.iter().map(|t| text(t)).collect();
    tokens.push("<|endoftext|>".into());
    let merges: Vec<String> = toks
        .iter()
        .enumerate()
        .filter(|(_, t)| t.len() > 1)
        .map(|(r, t)| {
            let (a, b) = merge_of(t, r as u32, &ranks);
            format!("{} {}", text(a), text(b))
        })
        .collect();
    let mut types = (Ty::I32 as u32).to_le_bytes().to_vec();
    types.extend((tokens.len() as u64).to_le_bytes());
    for i in 0..tokens.len() {
        types.extend(if i < toks.len() { 1i32 } else { 3 }.to_le_bytes());
    }
    let meta: Vec<(&str, Ty, Vec<u8>)> = vec![
        ("general.architecture", Ty::String, gguf_string("phi3")),
        ("tokenizer.ggml.model", Ty::String, gguf_string("gpt2")),
        ("tokenizer.ggml.pre", Ty::String, gguf_string(pre)),
        ("tokenizer.ggml.tokens", Ty::Array, string_array(&tokens)),
        ("tokenizer.ggml.token_type", Ty::Array, types),
        ("tokenizer.ggml.merges", Ty::Array, string_array(&merges)),
        ("tokenizer.ggml.eos_token_id", Ty::U32, RANKS.to_le_bytes().to_vec()),
        ("tokenizer.ggml.add_bos_token", Ty::Bool, vec![0]),
    ];
    let file = std::fs::File::create(path).expect("create gguf");
    let mut w = GGufFileWriter::new(std::io::BufWriter::new(file), GGufFileHeader::new(3, 0, meta.len() as u64))
        .expect("header");
    for (k, ty, v) in &meta {
        w.write_meta_kv(k, *ty, v).expect("meta");
    }
    w.finish::<Vec<u8>>(true).finish().expect("write");
}

/// Strings where GPT-4o's pre-tokenizer differs from Llama 3's or Qwen2's: capitals kept with
/// the lowercase run after them (`CamelCase`, `HTTPServer`), contractions attached to any word,
/// `/` and newlines after punctuation, three-digit runs, marks, CJK, emoji and whitespace runs.
const CASES: &[&str] = &[
    "Hello world",
    "CamelCaseWords and HTTPServer, XMLHttpRequest",
    "I'm sure they'll say we've DON'T it's",
    "https://example.com/path/to?x=1&y=22\n",
    "1234567 + 89 = 1234656; 3.14159",
    "naïve café — Zürich Ångström",
    "日本語のテキストと한국어 텍스트",
    "emoji 🙂🚀 and symbols ©®™",
    "  leading spaces\n\n\ttabs\t\tand\r\nCRLF  ",
    "fn main() {\n    println!(\"{}\", x);\n}\n",
    "a//b /// c ...\n\n\n",
];

#[test]
fn gpt4o_pre_tokenizer_matches_tiktoken() {
    let bpe = tiktoken_rs::o200k_base().expect("o200k_base");
    let toks: Vec<Vec<u8>> = bpe._decode_native_and_split((0..RANKS).collect()).collect();
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("o200k.gguf");
    write_o200k(&path, &toks, "gpt-4o");
    let t = Tokenizer::load(&path).expect("o200k GGUF loads");
    assert_eq!(t.vocab_size(), RANKS as usize + 1);
    for s in CASES {
        let want = bpe.encode_ordinary(s);
        let got = t.encode(s, false).expect("encode");
        assert_eq!(got, want, "{s:?}");
        assert_eq!(t.decode(&got, false).expect("decode"), *s);
    }
    // The same vocabulary read with Llama 3's pre-tokenizer differs from tiktoken: the cases
    // can see a wrong split.
    let llama = dir.path().join("o200k-llama-bpe.gguf");
    write_o200k(&llama, &toks, "llama-bpe");
    let t = Tokenizer::load(&llama).expect("loads");
    let differ = CASES.iter().filter(|s| t.encode(s, false).expect("encode") != bpe.encode_ordinary(s)).count();
    assert!(differ > 0, "no case tells the gpt-4o pre-tokenizer from Llama 3's");
}

/// Tekken's split pattern as `tekken.json` states it (Mistral Nemo, Ministral 8B).
const TEKKEN_PATTERN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

#[test]
fn tekken_pre_tokenizer_matches_tiktoken_with_tekkens_pattern() {
    let o200k = tiktoken_rs::o200k_base().expect("o200k_base");
    let toks: Vec<Vec<u8>> = o200k._decode_native_and_split((0..RANKS).collect()).collect();
    let encoder = toks.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let special = [("<|endoftext|>".to_owned(), RANKS)].into_iter().collect();
    let bpe = tiktoken_rs::CoreBPE::new(encoder, special, TEKKEN_PATTERN).expect("tiktoken with Tekken's pattern");
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("tekken.gguf");
    write_o200k(&path, &toks, "tekken");
    let t = Tokenizer::load(&path).expect("tekken GGUF loads");
    for s in CASES {
        let want = bpe.encode_ordinary(s);
        let got = t.encode(s, false).expect("encode");
        assert_eq!(got, want, "{s:?}");
        assert_eq!(t.decode(&got, false).expect("decode"), *s);
    }
    // Where Tekken's pattern must cut, whatever the vocabulary (checked on our ids, so a
    // pattern pasted wrong into both sides above still fails here): digits one by one, a
    // contraction apart from its word, a capital after lowercase starts a word in any script.
    let cuts = |s: &str| -> Vec<usize> {
        let ids = t.encode(s, false).expect("encode");
        let mut at = 0;
        o200k
            ._decode_native_and_split(ids)
            .map(|b| {
                at += b.len();
                at
            })
            .collect()
    };
    for (s, want) in [("1234", &[1, 2, 3][..]), ("don't", &[3]), ("ПриветМир", &["Привет".len()]), ("fooBar", &[3])]
    {
        let got = cuts(s);
        assert!(want.iter().all(|w| got.contains(w)), "{s:?}: token ends {got:?} lack {want:?}");
    }
    // Tekken splits digits one by one and keeps no contractions: read as GPT-4o's it differs.
    let gpt4o = dir.path().join("tekken-as-gpt-4o.gguf");
    write_o200k(&gpt4o, &toks, "gpt-4o");
    let t = Tokenizer::load(&gpt4o).expect("loads");
    let differ = CASES.iter().filter(|s| t.encode(s, false).expect("encode") != bpe.encode_ordinary(s)).count();
    assert!(differ > 0, "no case tells the tekken pre-tokenizer from GPT-4o's");
}
