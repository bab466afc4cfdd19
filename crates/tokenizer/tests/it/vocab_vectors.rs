//! Real vocabularies against their reference tokenizations: llama.cpp's `models/ggml-vocab-*.gguf`
//! (as vendored in the llama-cpp-python 0.3.36 source distribution, fetched with pip on first
//! use) with the `.inp`/`.out` vectors beside each, which llama.cpp's `convert_hf_to_gguf_update.py`
//! writes from HF `tokenizers` and its `test-tokenizer-0` checks llama.cpp against (no special
//! tokens added, special-token text not parsed). Every case must give exactly those ids.

use std::path::Path;

use sparrow_tokenizer::Tokenizer;

/// The vocabularies of the dense families we load, by `tokenizer.ggml.pre`: Llama 3.x and
/// SmolLM3 (`llama-bpe`), Qwen2/2.5/3 (`qwen2`), Qwen3.5 (`qwen35`), Phi-3 and Llama 2 (SentencePiece vocabularies,
/// `phi-3` and `llama-spm`: the path Mistral 7B's files take too, with their own vocabulary),
/// GPT-2 and StarCoder (the SmolLM2 pre-tokenizer's regex family), DeepSeek-V2 (`deepseek-llm`)
/// and DeepSeek-Coder.
const VOCABS: &[&str] = &[
    "llama-bpe",
    "qwen2",
    "qwen35",
    "phi-3",
    "llama-spm",
    "gpt-2",
    "starcoder",
    "deepseek-llm",
    "deepseek-coder",
    "bert-bge",
];

/// `(text, ids)` cases of `{vocab}.inp` / `.out` (cases separated by
/// `"\n__ggml_vocab_test__\n"`, one line of space-separated ids each).
fn cases(dir: &Path, vocab: &str) -> Vec<(String, Vec<u32>)> {
    let read = |ext: &str| {
        let p = dir.join(format!("ggml-vocab-{vocab}.gguf.{ext}"));
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let (inp, out) = (read("inp"), read("out"));
    let mut texts: Vec<String> = inp.split("\n__ggml_vocab_test__\n").map(str::to_owned).collect();
    // The file ends with the separator: llama.cpp's reader keeps no empty case after it.
    if texts.last().is_some_and(String::is_empty) {
        texts.pop();
    }
    let ids: Vec<Vec<u32>> =
        out.lines().map(|l| l.split_whitespace().map(|t| t.parse().expect("token id")).collect()).collect();
    assert_eq!(texts.len(), ids.len(), "{vocab}: .inp and .out case counts");
    texts.into_iter().zip(ids).collect()
}

#[test]
fn vendored_vocabularies_match_their_reference_ids() {
    let dir =
        sparrow_assets::ensure_sdist_dir(sparrow_assets::LLAMA_CPP_MODELS).expect("llama.cpp models (pip download)");
    for vocab in VOCABS {
        let t =
            Tokenizer::load(&dir.join(format!("ggml-vocab-{vocab}.gguf"))).unwrap_or_else(|e| panic!("{vocab}: {e}"));
        let cases = cases(&dir, vocab);
        assert!(cases.len() >= 30, "{vocab}: {} cases", cases.len());
        let mut bad = Vec::new();
        for (text, want) in &cases {
            let got = t.encode(text, false).unwrap_or_else(|e| panic!("{vocab} {text:?}: {e}"));
            if &got != want {
                bad.push(format!("{text:?}: ours {got:?}, reference {want:?}"));
            }
        }
        assert!(bad.is_empty(), "{vocab}: {} of {} cases differ:\n{}", bad.len(), cases.len(), bad.join("\n"));
        eprintln!("{vocab}: {} cases equal", cases.len());
    }
}
