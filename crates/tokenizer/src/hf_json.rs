//! A `tokenizer.json` read for the `tokenizers` crate, with the checks that crate lacks.
//!
//! `tokenizers` 0.22 trusts the file in three places (found by fuzzing, `fuzz/` target
//! `tokenizer_json`): a syntax error inside the `decoder` value panics
//! (`DecoderWrapper::deserialize`'s `.expect("Helper")`), a `Precompiled` normalizer that does
//! not parse panics (`.expect("Precompiled")`), and a parsed one is trusted: its trie size is
//! allocated before it is checked (`Vec::with_capacity` of up to 2³⁰ words), and the trie is
//! walked with unchecked indices into the units and the replacement text at every encode
//! (`spm_precompiled::DoubleArray::common_prefix_search`, `Precompiled::transform`). So the
//! text is parsed as JSON first, every `Precompiled` charsmap is checked ([`check_charsmap`])
//! and parsed by the same crate `tokenizers` uses, and only then does `tokenizers` read it,
//! with a panic of its own turned into an error naming the file. The tokenizer then encodes a
//! probe text, so that a part broken for every input (fuzzing: a post-processor template
//! naming an undefined special token panics at every encode) is a start-up error; what
//! depends on the input is caught per call (`Tokenizer::encode` and the others).

use std::path::Path;

use base64::Engine as _;

use crate::TokenizerError;

/// Reads the `tokenizer.json` at `path` into a `tokenizers` tokenizer, its truncation and
/// padding dropped.
///
/// # Errors
/// [`TokenizerError::Io`] when it cannot be read; [`TokenizerError::Hf`] naming the file when
/// it is not JSON, a `Precompiled` normalizer's charsmap is malformed ([`check_charsmap`]), or
/// `tokenizers` refuses (or fails on) it.
pub(crate) fn read(path: &Path) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io { path: path.to_owned(), source })?;
    let bad = |what: String| TokenizerError::Hf(format!("{}: {what}", path.display()));
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    check_precompiled(&value).map_err(bad)?;
    // `tokenizers` reads what was checked, not the text: the text may repeat a key (the
    // parsed value keeps the last, `tokenizers`' reader would deserialize each in turn).
    let checked = serde_json::to_string(&value).map_err(|e| bad(e.to_string()))?;
    drop((text, value));
    // The checks above cover what fuzzing found; a panic left in the library still names
    // the file instead of ending the process with a backtrace.
    let mut tok = std::panic::catch_unwind(|| checked.parse::<tokenizers::Tokenizer>())
        .map_err(|_| bad("the tokenizers library failed on it (a panic; see the message above)".into()))?
        .map_err(|e| bad(e.to_string()))?;
    // A `tokenizer.json` may carry the exporter's truncation and padding (all-MiniLM-L6-v2's
    // pads and cuts every input to 128 tokens): a server must see the whole prompt and decide
    // on length itself, so both are dropped (and a padding length read from the file is never
    // allocated).
    tok.with_truncation(None).map_err(|e| bad(e.to_string()))?;
    tok.with_padding(None);
    // Parts that are wrong for every input (a post-processor template naming a special token
    // it does not define, a pair piece in the single template) panic at the first encode:
    // found here, at start-up, not at every request. Errors are the input's, not the file's.
    let probe = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for special in [false, true] {
            let _ = tok.encode_fast(PROBE, special);
        }
        let _ = tok.encode_fast(tokenizers::EncodeInput::Dual(PROBE.into(), "b".into()), true);
        let _ = tok.decode(&[0, 1, 2, 3], false);
    }));
    probe.map_err(|_| {
        bad("the tokenizers library fails on a probe text (a panic; see the message above): a malformed \
             post-processor, normalizer, pre-tokenizer, model or decoder"
            .into())
    })?;
    Ok(tok)
}

/// Text the loaded tokenizer encodes once at start-up: letters, punctuation, digits, accents,
/// CJK, a symbol a charsmap maps, whitespace kinds.
const PROBE: &str = "Hello, wörld! 12345 ① 你好 ﬁne\n\t  x";

/// Every object of `value` typed `Precompiled` (a normalizer, also inside a `Sequence`; the
/// type as a string or, as serde also reads an enum, as a one-key map) or carrying a
/// `precompiled_charsmap`: the charsmap checked by [`check_charsmap`], then parsed by
/// `spm_precompiled` as `tokenizers` parses it, which would otherwise panic on a failure.
fn check_precompiled(value: &serde_json::Value) -> Result<(), String> {
    match value {
        serde_json::Value::Object(o) => {
            let typed = match o.get("type") {
                Some(serde_json::Value::String(t)) => t == "Precompiled",
                Some(serde_json::Value::Object(t)) => t.contains_key("Precompiled"),
                _ => false,
            };
            if typed || o.contains_key("precompiled_charsmap") {
                let b64 = o
                    .get("precompiled_charsmap")
                    .and_then(|c| c.as_str())
                    .ok_or("a Precompiled normalizer without a precompiled_charsmap string")?;
                let blob = base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .map_err(|e| format!("precompiled_charsmap is not base64: {e}"))?;
                check_charsmap(&blob).map_err(|e| format!("precompiled_charsmap: {e}"))?;
                // As `tokenizers` parses it: the type put back as a string, from text (the
                // base64 is read as a borrowed str).
                let mut normalizer = o.clone();
                normalizer.insert("type".into(), "Precompiled".into());
                let text = serde_json::to_string(&normalizer).map_err(|e| e.to_string())?;
                serde_json::from_str::<spm_precompiled::Precompiled>(&text)
                    .map_err(|e| format!("precompiled_charsmap: {e}"))?;
            }
            o.values().try_for_each(check_precompiled)
        }
        serde_json::Value::Array(a) => a.iter().try_for_each(check_precompiled),
        _ => Ok(()),
    }
}

/// Checks a SentencePiece `precompiled_charsmap` before `spm_precompiled` uses it.
///
/// The layout (SentencePiece `normalizer.cc`, `Normalizer::DecodePrecompiledCharsMap`): a
/// little-endian u32 trie size in bytes, the trie (darts-clone double-array units, u32 each),
/// then the replacement strings, UTF-8, each ended by a NUL. A lookup starts at unit 0 and,
/// for each input byte `c` (1–255), steps to `node ^ c`; a unit whose label is `c` moves on to
/// `that ^ offset`, and one with a leaf names a byte offset into the strings.
///
/// Checked: the size fits in the blob; the strings are UTF-8; and from every node a lookup
/// can reach, every step for every byte stays inside the units and every leaf points at a
/// character boundary of the strings: what `common_prefix_search` and `transform` index
/// without checking. A real charsmap passes (its units come in whole blocks of 256, so
/// `node ^ c` stays in its block); the walk visits each node once, `O(256 × units)`.
///
/// # Errors
/// What is out of bounds, in words.
pub fn check_charsmap(blob: &[u8]) -> Result<(), String> {
    let head: [u8; 4] = blob
        .get(..4)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| format!("{} bytes, shorter than its 4-byte trie size", blob.len()))?;
    let trie_bytes = u32::from_le_bytes(head) as usize;
    let rest = &blob[4..];
    if trie_bytes > rest.len() {
        return Err(format!("a trie of {trie_bytes} bytes in the {} bytes that follow its size", rest.len()));
    }
    // spm_precompiled reads `trie_bytes / 4` whole units; the strings start right after.
    let (trie, strings) = rest.split_at(trie_bytes / 4 * 4);
    let units: Vec<usize> =
        trie.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize).collect();
    let strings = std::str::from_utf8(strings).map_err(|e| format!("replacement strings are not UTF-8: {e}"))?;
    // darts-clone's unit fields, as spm_precompiled decodes them.
    let offset = |u: usize| (u >> 10) << ((u & (1 << 9)) >> 6);
    let label = |u: usize| u & ((1 << 31) | 0xFF);
    let has_leaf = |u: usize| (u >> 8) & 1 == 1;
    let value = |u: usize| u & ((1 << 31) - 1);
    let n = units.len();
    let root = *units.first().ok_or("an empty trie")?;
    let mut seen = vec![false; n];
    let mut todo = vec![offset(root)];
    while let Some(node) = todo.pop() {
        for c in 1..=255usize {
            let at = node ^ c;
            let unit = *units.get(at).ok_or_else(|| format!("byte {c} steps from node {node} to unit {at} of {n}"))?;
            if label(unit) != c {
                continue;
            }
            let next = at ^ offset(unit);
            if has_leaf(unit) {
                let leaf = *units.get(next).ok_or_else(|| format!("a leaf at unit {next} of {n}"))?;
                let start = value(leaf);
                if !strings.is_char_boundary(start) {
                    return Err(format!(
                        "a replacement at byte {start} of {} bytes of strings, not a character's start",
                        strings.len()
                    ));
                }
            }
            // A node past the units: the next byte's step would read past them (a real trie's
            // nodes all sit in allocated blocks).
            match seen.get_mut(next) {
                Some(s) if !*s => {
                    *s = true;
                    todo.push(next);
                }
                Some(_) => {}
                None => return Err(format!("byte {c} leads to node {next}, past the {n} units")),
            }
        }
    }
    Ok(())
}
