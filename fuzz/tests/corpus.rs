//! Every target over its seeds and its committed regressions (`fuzz/regressions/<target>/`,
//! one file per input a fuzzer once crashed or hung on): none may panic. Run by CI in seconds;
//! the fuzzing itself is `scripts/fuzz/run.sh`.
//!
//! Also checks the complete seeds are accepted (the model files load, the vocabularies build,
//! the templates render, the grammars compile), so the fuzzer starts deep in each parser.

use std::path::Path;

#[test]
fn every_target_survives_its_seeds_and_regressions() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions");
    let mut ran = 0;
    for (target, f) in sparrow_fuzz::TARGETS {
        for (t, _, bytes) in sparrow_fuzz::seeds::all() {
            if t == *target {
                f(&bytes);
                ran += 1;
            }
        }
        let Ok(dir) = std::fs::read_dir(root.join(target)) else { continue };
        for entry in dir {
            let path = entry.expect("a regressions entry").path();
            let bytes = std::fs::read(&path).expect("a regression input");
            eprintln!("{target}: {}", path.display());
            f(&bytes);
            ran += 1;
        }
    }
    assert!(ran >= 20, "{ran} inputs");
}

#[test]
fn complete_seeds_are_accepted() {
    use sparrow_engine::engine::{load_model, EngineArgs};
    let dir = tempdir();
    for arch in ["llama", "qwen2"] {
        let p = dir.join(format!("{arch}.gguf"));
        std::fs::write(&p, sparrow_fuzz::seeds::tiny_gguf(arch)).expect("write");
        let (m, _, _) = load_model(&EngineArgs::new(p.clone())).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert_eq!(m.info().architecture, arch);
        let tok = sparrow_tokenizer::Tokenizer::load(&p).expect("tokenizer");
        let ids = tok.encode(" the hello", false).expect("encode");
        assert_eq!(tok.decode(&ids, false).expect("decode"), " the hello");
        assert!(ids.contains(&259), "the merged ' the' token: {ids:?}");
        let text = tok.apply_chat_template(&sparrow_fuzz::conversation()[..2], true).expect("template");
        assert!(text.ends_with("<|im_start|>assistant\n"), "{text}");
    }
    for kind in ["spm", "wpm"] {
        let p = dir.join(format!("{kind}.gguf"));
        std::fs::write(&p, sparrow_fuzz::seeds::vocab_gguf(kind)).expect("write");
        let tok = sparrow_tokenizer::Tokenizer::load(&p).unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert!(tok.encode("hello the world", false).expect("encode").len() >= 2, "{kind}");
    }
    for kind in ["bpe", "spm", "unigram", "wpm"] {
        let seed = sparrow_fuzz::seeds::tokenizer_json(kind);
        let (json, config) = sparrow_fuzz::split(&seed);
        let d = dir.join(format!("tok-{kind}"));
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(d.join("tokenizer.json"), json).expect("write");
        std::fs::write(d.join("tokenizer_config.json"), config).expect("write");
        let tok = sparrow_tokenizer::Tokenizer::load(&d).unwrap_or_else(|e| panic!("{kind}: {e}"));
        let ids = tok.encode("hello the world", false).expect("encode");
        // Fewer tokens than characters: the merges (or the vocabulary's words) apply.
        assert!(ids.len() < "hello the world".len(), "{kind}: {ids:?}");
        assert_eq!(tok.decode(&ids, false).expect("decode").trim_start(), "hello the world", "{kind}");
        if kind != "wpm" {
            let text = tok.apply_chat_template(&sparrow_fuzz::conversation()[..2], true).expect("template");
            assert!(text.contains("Weather in Paris?"), "{kind}: {text}");
        }
    }
    let hf = sparrow_fuzz::seeds::tiny_hf();
    let (config, weights) = sparrow_fuzz::split(&hf);
    let d = dir.join("hf");
    std::fs::create_dir_all(&d).expect("mkdir");
    std::fs::write(d.join("config.json"), config).expect("write");
    std::fs::write(d.join("model.safetensors"), weights).expect("write");
    let (m, _, _) = load_model(&EngineArgs::new(d)).unwrap_or_else(|e| panic!("hf: {e}"));
    assert_eq!(m.info().architecture, "llama");
    for (t, name, bytes) in sparrow_fuzz::seeds::all() {
        if t == "chat_template" {
            let src = std::str::from_utf8(&bytes).expect("utf-8");
            let out = sparrow_tokenizer::render_template(
                src,
                &sparrow_fuzz::conversation()[..2],
                None,
                &serde_json::Map::new(),
                true,
                ("<s>", "</s>"),
            )
            .unwrap_or_else(|e| panic!("template {name}: {e}"));
            assert!(out.contains("Weather in Paris?"), "{name}: {out}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    // Every grammar seed compiles and takes steps (the target returns early otherwise).
    for (t, name, bytes) in sparrow_fuzz::seeds::all() {
        if t == "grammar" {
            assert!(sparrow_fuzz::grammar_steps(&bytes) > 0, "grammar seed {name}");
        }
    }
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("sparrow-fuzz-seeds-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}
