//! Fuzz targets for everything sparrow reads from someone else: GGUF files (index, model
//! loaders, tokenizer builders), Hugging Face checkpoint directories (`config.json`,
//! safetensors headers, `tokenizer.json`), chat templates, request grammars (JSON schema, regex, Lark, GBNF) and
//! the bench's SSE stream reader.
//!
//! Each target is a plain function of the input bytes that must return, whatever the bytes:
//! no panic, no abort, no allocation beyond the input's size times a small factor, no input
//! taking more than a second. libFuzzer runs them through `fuzz_targets/*.rs`
//! (`scripts/fuzz/run.sh`); `tests/corpus.rs` replays [`seeds`] and the committed
//! `regressions/<target>/` inputs on every CI run, so a crash once found stays fixed.
//!
//! Inputs that carry two things (a directory's two files, a grammar's kind and text, a
//! stream's read boundaries) are split by [`split`]: a fuzzer mutating one half keeps the
//! other whole.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

pub mod crafted;
pub mod seeds;

/// A target: its name and its function of the input bytes.
pub type Target = (&'static str, fn(&[u8]));

/// Every target by name, as `cargo fuzz` and `regressions/` name them.
pub const TARGETS: &[Target] = &[
    ("gguf_index", gguf_index),
    ("gguf_load", gguf_load),
    ("hf_checkpoint", hf_checkpoint),
    ("tokenizer_gguf", tokenizer_gguf),
    ("tokenizer_json", tokenizer_json),
    ("chat_template", chat_template),
    ("grammar", grammar),
    ("sse_stream", sse_stream),
];

/// Splits `data` at the first `0xFF 0x00 0xFF` marker (never inside UTF-8 text or a small
/// integer) into the part before and after; no marker: all of it and nothing.
pub fn split(data: &[u8]) -> (&[u8], &[u8]) {
    match data.windows(3).position(|w| w == SEP) {
        Some(i) => (&data[..i], &data[i + 3..]),
        None => (data, &[]),
    }
}

/// [`split`]'s marker.
pub const SEP: &[u8] = &[0xFF, 0x00, 0xFF];

/// A fresh path for a file the loaders open by name: in `/dev/shm` when it exists (no disk
/// writes per execution), unique per process and call.
fn scratch(ext: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = Path::new("/dev/shm");
    let dir = if dir.is_dir() { dir.to_owned() } else { std::env::temp_dir() };
    dir.join(format!("sparrow-fuzz-{}-{}.{ext}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)))
}

/// A fresh [`scratch`] directory holding `files` (name, contents), removed when the returned
/// guard drops; `None` when it cannot be written.
fn scratch_dir(files: &[(&str, &[u8])]) -> Option<Scratch> {
    let dir = Scratch(scratch("d"));
    std::fs::create_dir(&dir.0).ok()?;
    for (name, bytes) in files {
        std::fs::write(dir.0.join(name), bytes).ok()?;
    }
    Some(dir)
}

/// Removes the file or directory when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The GGUF index (`sparrow_cpu::format::gguf::index`): header, metadata of every type, tensor
/// table; then every metadata value read through the typed accessors the loaders use and
/// every tensor's size and data slice.
pub fn gguf_index(data: &[u8]) {
    let Ok(ix) = sparrow_cpu::format::gguf::index(data) else { return };
    for (key, kv) in &ix.file.meta_kvs {
        let mut r = kv.value_reader();
        let _ = (key.len(), kv.ty());
        let _ = r.read_str();
    }
    for t in ix.tensors.values() {
        if let Some(end) = t.bytes().and_then(|b| t.offset.checked_add(b)) {
            let _ = ix.file.data.get(t.offset..end);
        }
    }
}

/// The whole GGUF start-up path of `sparrow serve` on one file: the model loader
/// (`load_model`, every architecture it dispatches to), then the tokenizer and its chat
/// template on a short conversation.
pub fn gguf_load(data: &[u8]) {
    let path = scratch("gguf");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let _guard = Scratch(path.clone());
    let _ = sparrow_engine::engine::load_model(&sparrow_engine::engine::EngineArgs::new(path.clone()));
    tokenize_and_render(&path);
}

/// The tokenizer builders alone on a GGUF file (vocabulary, merges, SentencePiece scores,
/// WordPiece, special tokens, pre-tokenizer names), then encode, decode and the chat template.
pub fn tokenizer_gguf(data: &[u8]) {
    let path = scratch("gguf");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let _guard = Scratch(path.clone());
    tokenize_and_render(&path);
}

/// A Hugging Face tokenizer directory: [`split`] gives `tokenizer.json` (the `tokenizers`
/// crate's reader: normalizers, pre-tokenizers and their regexes, BPE/WordPiece/Unigram
/// models, added tokens, post-processors, decoders) and `tokenizer_config.json` (special
/// tokens, chat template; left out when empty); then encode, decode and the template.
pub fn tokenizer_json(data: &[u8]) {
    let (json, config) = split(data);
    let files: &[(&str, &[u8])] = if config.is_empty() {
        &[("tokenizer.json", json)]
    } else {
        &[("tokenizer.json", json), ("tokenizer_config.json", config)]
    };
    let Some(dir) = scratch_dir(files) else { return };
    tokenize_and_render(&dir.0);
}

fn tokenize_and_render(path: &Path) {
    let Ok(tok) = sparrow_tokenizer::Tokenizer::load(path) else { return };
    if let Ok(ids) = tok.encode("Hello, wörld! 12345 <|im_end|>\n\tfoo", true) {
        let _ = tok.decode(&ids, false);
    }
    let _ = tok.decode(&[0, 1, 2, u32::MAX], true);
    let _ = tok.token_bytes(false);
    let _ = tok.apply_chat_template(&conversation(), true);
}

/// A Hugging Face checkpoint directory: [`split`] gives `config.json` and
/// `model.safetensors`; the directory goes through `load_model` as `--model-path`.
pub fn hf_checkpoint(data: &[u8]) {
    let (config, weights) = split(data);
    let Some(dir) = scratch_dir(&[("config.json", config), ("model.safetensors", weights)]) else { return };
    let _ = sparrow_engine::engine::load_model(&sparrow_engine::engine::EngineArgs::new(dir.0.clone()));
}

/// The conversation templates are rendered on: system, user, assistant with a tool call, tool,
/// user.
pub fn conversation() -> Vec<sparrow_tokenizer::ChatMessage> {
    use sparrow_tokenizer::ChatMessage;
    let call = serde_json::json!([{"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]);
    vec![
        ChatMessage::new("system", "You are terse."),
        ChatMessage::new("user", "Weather in Paris?"),
        ChatMessage { tool_calls: Some(call), ..ChatMessage::new("assistant", "") },
        ChatMessage {
            tool_call_id: Some("c1".into()),
            name: Some("get_weather".into()),
            ..ChatMessage::new("tool", "18C")
        },
        ChatMessage::new("user", "Thanks"),
    ]
}

/// A chat template (the input as its source text) rendered as a request renders it, with
/// tools and extra kwargs, under the renderer's fuel and output limits.
pub fn chat_template(data: &[u8]) {
    let Ok(src) = std::str::from_utf8(data) else { return };
    let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let mut kwargs = serde_json::Map::new();
    kwargs.insert("enable_thinking".into(), false.into());
    let _ = sparrow_tokenizer::render_template(src, &conversation(), Some(&tools), &kwargs, true, ("<s>", "</s>"));
}

/// The grammar compiler over a 300-token vocabulary (the 256 bytes, some words, 2 specials):
/// the first byte picks the request field (JSON schema, regex, Lark/GBNF grammar, choice),
/// the rest is its text. A grammar that compiles is then stepped: up to 16 masks and tokens.
pub fn grammar(data: &[u8]) {
    grammar_steps(data);
}

/// [`grammar`], returning how many tokens the walk took (0 when the input did not compile).
pub fn grammar_steps(data: &[u8]) -> usize {
    use sparrow_server::grammar::{Constraint, Grammars};
    static G: OnceLock<Option<Grammars>> = OnceLock::new();
    let Some(g) = G.get_or_init(|| {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        for w in ["{\"", "\":", "true", "false", "null", "\"}", "abc", " the", "123", "\\u00"] {
            words.push(w.as_bytes().to_vec());
        }
        while words.len() < 298 {
            words.push(format!("w{}", words.len()).into_bytes());
        }
        words.push(b"<eos>".to_vec());
        words.push(b"<pad>".to_vec());
        let special: Vec<bool> = (0..words.len()).map(|i| i >= 298).collect();
        Grammars::new(&words, &special, 298).ok()
    }) else {
        return 0;
    };
    let Some((&kind, rest)) = data.split_first() else { return 0 };
    let Ok(text) = std::str::from_utf8(rest) else { return 0 };
    let c = match kind % 4 {
        0 => match serde_json::from_str(text) {
            Ok(v) => Constraint::Json(v),
            Err(_) => return 0,
        },
        1 => Constraint::Regex(text.to_owned()),
        2 => match Constraint::grammar(text) {
            Ok(c) => c,
            Err(_) => return 0,
        },
        _ => Constraint::choice(&text.split('\n').map(str::to_owned).collect::<Vec<_>>()),
    };
    let Ok(mut m) = g.constraint(&c) else { return 0 };
    let mut allowed = vec![false; 300];
    for step in 0..16 {
        allowed.iter_mut().for_each(|a| *a = false);
        if m.allowed(&mut allowed).is_err() {
            return step;
        }
        // A deterministic walk: the allowed token at a position drawn from the step.
        let n = allowed.iter().filter(|&&a| a).count();
        let Some(t) = (n > 0).then(|| allowed.iter().enumerate().filter(|p| *p.1).nth((step * 7919) % n)).flatten()
        else {
            return step;
        };
        if !matches!(m.advance(t.0 as u32), Ok(false)) {
            return step + 1;
        }
    }
    16
}

/// The bench's streamed-answer reader (SSE framing under its bound, then each event's JSON
/// frame as the client reads it): the first byte picks the API dialect, the rest is the body,
/// cut into reads at every [`SEP`] marker.
pub fn sse_stream(data: &[u8]) {
    use sparrow_bench::client::Api;
    let Some((&kind, body)) = data.split_first() else { return };
    let api = match kind % 4 {
        0 => Api::Generate,
        1 => Api::Completions,
        2 => Api::Chat,
        _ => Api::Trt,
    };
    let mut reads = Vec::new();
    let mut rest = body;
    loop {
        let (a, b) = split(rest);
        reads.push(a);
        if b.is_empty() {
            break;
        }
        rest = b;
    }
    let _ = sparrow_bench::client::read_stream(api, &reads);
}
