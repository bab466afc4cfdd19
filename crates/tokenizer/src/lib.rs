//! Tokenizer and chat template loading shared by `sparrow serve` and `sparrow bench`.
//!
//! A tokenizer comes from one of three places, picked by [`Tokenizer::load`]:
//! - a HF `tokenizer.json` file (loaded by the `tokenizers` crate after the checks of
//!   [`hf_json`]);
//! - a directory holding `tokenizer.json` (and optionally `tokenizer_config.json` with a
//!   `chat_template`), or holding exactly one `.gguf` file;
//! - a GGUF file, whose `tokenizer.ggml.*` metadata is turned into an equivalent HF tokenizer
//!   (see [`gguf`]); the chat template comes from `tokenizer.chat_template`.
//!
//! Chat templates are rendered with minijinja, the way HF `apply_chat_template` renders them
//! (`messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `raise_exception`): the
//! `template` module, whose items are re-exported here.

pub mod gguf;
pub mod hf_json;
pub mod pyjson;
mod template;

pub use template::{
    check_template, render_template, strftime, ChatMessage, TemplateTools, TEMPLATE_CHECK_BUDGET,
    TEMPLATE_CHECK_OUTPUT, TEMPLATE_FUEL, TEMPLATE_MAX_OUTPUT,
};

use std::path::{Path, PathBuf};

/// Errors from loading a tokenizer or using it.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The path does not exist or could not be read.
    #[error("cannot read tokenizer at {path}: {source}")]
    Io {
        /// The path we tried.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A directory held neither `tokenizer.json` nor a single GGUF file.
    #[error("{0} holds no tokenizer.json and no single .gguf file")]
    NotFound(PathBuf),
    /// The `tokenizers` crate rejected the file or an encode/decode call.
    #[error("tokenizer error: {0}")]
    Hf(String),
    /// The GGUF metadata is missing a key, has a wrong type, or names a tokenizer we do not build.
    #[error("GGUF tokenizer: {0}")]
    Gguf(String),
    /// The model has no chat template, or rendering it failed.
    #[error("chat template: {0}")]
    ChatTemplate(String),
}

impl From<tokenizers::Error> for TokenizerError {
    fn from(e: tokenizers::Error) -> Self {
        TokenizerError::Hf(e.to_string())
    }
}

/// Runs a call into the `tokenizers` crate with a panic of its turned into an error: the crate
/// has `expect`s and unchecked indices that a file's contents reach (a post-processor template
/// naming a special token it does not define panics at every encode; found by fuzzing, see
/// [`hf_json`]), and a request may fail where the server may not.
fn shield<T>(f: impl FnOnce() -> tokenizers::Result<T>) -> Result<T, TokenizerError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(TokenizerError::from),
        Err(_) => Err(TokenizerError::Hf("the tokenizers library failed on this input (it panicked)".into())),
    }
}

/// A loaded tokenizer with the special tokens and chat template the model declares.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos: Option<(u32, String)>,
    eos: Option<(u32, String)>,
    chat_template: Option<String>,
    source: PathBuf,
    pieces: Pieces,
    /// End-of-turn ids besides the EOS (see [`Tokenizer::eog_ids`]).
    eot: Vec<u32>,
}

/// How a vocabulary piece spells its bytes (for [`Tokenizer::token_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pieces {
    /// GPT-2 byte-level: each char stands for one byte (`bytes_to_unicode`).
    ByteLevel,
    /// SentencePiece: UTF-8 text with `▁` for a space; `<0xNN>` pieces are single bytes.
    SentencePiece,
    /// Anything else: incremental decoding is not offered.
    Other,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("source", &self.source)
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

impl Tokenizer {
    /// Loads a tokenizer from a `tokenizer.json`, a directory holding one (or one `.gguf`), or a
    /// GGUF file.
    ///
    /// # Errors
    /// [`TokenizerError`] when the path cannot be read or its contents are not understood.
    pub fn load(path: &Path) -> Result<Self, TokenizerError> {
        let meta = std::fs::metadata(path).map_err(|source| TokenizerError::Io { path: path.to_owned(), source })?;
        if meta.is_dir() {
            let json = path.join("tokenizer.json");
            if json.is_file() {
                return Self::from_json_file(&json, Some(&path.join("tokenizer_config.json")));
            }
            let ggufs: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|source| TokenizerError::Io { path: path.to_owned(), source })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
                .collect();
            return match ggufs.as_slice() {
                [one] => gguf::load(one),
                _ => Err(TokenizerError::NotFound(path.to_owned())),
            };
        }
        if gguf::is_gguf(path)? {
            gguf::load(path)
        } else {
            let config = path.with_file_name("tokenizer_config.json");
            Self::from_json_file(path, Some(&config))
        }
    }

    fn from_json_file(path: &Path, config: Option<&Path>) -> Result<Self, TokenizerError> {
        let inner = hf_json::read(path)?;
        let cfg: Option<serde_json::Value> =
            config.and_then(|c| std::fs::read_to_string(c).ok()).and_then(|s| serde_json::from_str(&s).ok());
        let special = |key: &str| -> Option<(u32, String)> {
            let v = cfg.as_ref()?.get(key)?;
            // tokenizer_config.json spells a special token either as a string or as an
            // AddedToken object with a `content` field.
            let text = v.as_str().or_else(|| v.get("content")?.as_str())?;
            Some((inner.token_to_id(text)?, text.to_owned()))
        };
        let chat_template =
            cfg.as_ref().and_then(|c| c.get("chat_template")).and_then(|t| t.as_str()).map(str::to_owned);
        let pieces = match inner.get_decoder() {
            Some(tokenizers::DecoderWrapper::ByteLevel(_)) => Pieces::ByteLevel,
            Some(tokenizers::DecoderWrapper::Sequence(_))
                if serde_json::to_string(&inner.get_decoder()).is_ok_and(|d| d.contains("ByteFallback")) =>
            {
                Pieces::SentencePiece
            }
            _ => Pieces::Other,
        };
        Ok(Tokenizer {
            bos: special("bos_token"),
            eos: special("eos_token"),
            chat_template,
            inner,
            source: path.to_owned(),
            pieces,
            eot: Vec::new(),
        })
    }

    pub(crate) fn from_parts(
        inner: tokenizers::Tokenizer,
        bos: Option<(u32, String)>,
        eos: Option<(u32, String)>,
        chat_template: Option<String>,
        source: PathBuf,
        pieces: Pieces,
        eot: Vec<u32>,
    ) -> Self {
        Tokenizer { inner, bos, eos, chat_template, source, pieces, eot }
    }

    /// Token ids of `text`. With `add_special_tokens` the model's post-processor runs (a BOS
    /// token is prepended when the model asks for one), as HF `encode` does by default.
    ///
    /// # Errors
    /// [`TokenizerError::Hf`] if the tokenizer fails on the input.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        shield(|| Ok(self.inner.encode_fast(text, add_special_tokens)?.get_ids().to_vec()))
    }

    /// Token ids of the pair `(a, b)` through the post-processor's pair template, with special
    /// tokens (BERT: `[CLS] a [SEP] b [SEP]`), as HF `tokenizer(a, b)` gives them to a
    /// cross-encoder.
    ///
    /// # Errors
    /// [`TokenizerError::Hf`] if the tokenizer fails on the input.
    pub fn encode_pair(&self, a: &str, b: &str) -> Result<Vec<u32>, TokenizerError> {
        let input = tokenizers::EncodeInput::Dual(a.into(), b.into());
        shield(|| Ok(self.inner.encode_fast(input, true)?.get_ids().to_vec()))
    }

    /// Token ids of `a` (or of the pair `a`, `b`) with special tokens, the text's tokens cut from
    /// the left until the whole fits `max_len` (a pair: from the longer side first): HF's
    /// `truncation_side="left"`, what vLLM's `truncate_prompt_tokens` does to a text. The
    /// special tokens count towards `max_len` and are never cut (`[CLS]` stays first).
    ///
    /// # Errors
    /// [`TokenizerError::Hf`] if the tokenizer fails on the input.
    pub fn encode_truncated(&self, a: &str, b: Option<&str>, max_len: usize) -> Result<Vec<u32>, TokenizerError> {
        use tokenizers::utils::truncation::{truncate_encodings, TruncationDirection, TruncationStrategy};
        shield(|| {
            let ea = self.inner.encode_fast(a, false)?;
            let eb = b.map(|b| self.inner.encode_fast(b, false)).transpose()?;
            let added =
                self.inner.get_post_processor().map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, eb.is_some()));
            let params = tokenizers::TruncationParams {
                max_length: max_len.saturating_sub(added),
                strategy: TruncationStrategy::LongestFirst,
                direction: TruncationDirection::Left,
                stride: 0,
            };
            let (ea, eb) = truncate_encodings(ea, eb, &params)?;
            Ok(self.inner.post_process(ea, eb, true)?.get_ids().to_vec())
        })
    }

    /// Text of `ids`; special tokens are dropped when `skip_special_tokens` is set.
    ///
    /// # Errors
    /// [`TokenizerError::Hf`] for ids outside the vocabulary.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        shield(|| self.inner.decode(ids, skip_special_tokens))
    }

    /// The raw bytes each token id stands for, `[vocab_size]`, for incremental decoding.
    ///
    /// Byte-level BPE tokens map back through GPT-2's byte↔unicode table (the inverse of
    /// `bytes_to_unicode` in OpenAI's `gpt-2/src/encoder.py`); SentencePiece pieces are their
    /// text with `▁` as a space, and `<0xNN>` byte-fallback pieces the one byte `NN` (llama.cpp's
    /// `token_to_piece`). Added tokens are their content, and special tokens are empty when
    /// `skip_special_tokens` is set. Concatenating the bytes of a sequence and decoding them as
    /// UTF-8 gives what [`Tokenizer::decode`] gives (with SentencePiece's `add_space_prefix`,
    /// but for the one leading space its decoder strips).
    ///
    /// # Errors
    /// [`TokenizerError::Hf`] when the tokenizer is neither byte-level BPE nor SentencePiece.
    pub fn token_bytes(&self, skip_special_tokens: bool) -> Result<Vec<Vec<u8>>, TokenizerError> {
        if self.pieces == Pieces::Other {
            return Err(TokenizerError::Hf(
                "incremental decoding needs a byte-level BPE or SentencePiece tokenizer".into(),
            ));
        }
        let inverse = byte_level_inverse();
        let added = self.inner.get_added_tokens_decoder();
        let n = self.vocab_size();
        let mut out = Vec::with_capacity(n);
        for id in 0..n as u32 {
            if let Some(t) = added.get(&id) {
                out.push(if t.special && skip_special_tokens { Vec::new() } else { t.content.as_bytes().to_vec() });
                continue;
            }
            let piece = self.inner.id_to_token(id).unwrap_or_default();
            let bytes = match self.pieces {
                Pieces::SentencePiece => spm_piece_bytes(&piece),
                _ => piece
                    .chars()
                    .map(|c| inverse.get(&c).copied())
                    .collect::<Option<Vec<u8>>>()
                    .unwrap_or_else(|| piece.as_bytes().to_vec()),
            };
            out.push(bytes);
        }
        Ok(out)
    }

    /// Number of ids the tokenizer knows, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// How many tokens `encode(text, true)` adds around the text (0 or 1 for BOS-adding
    /// tokenizers; more for pair templates).
    pub fn num_special_tokens_to_add(&self) -> usize {
        self.inner.get_post_processor().map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, false))
    }

    /// BOS token id and text, if the model declares one.
    pub fn bos(&self) -> Option<(u32, &str)> {
        self.bos.as_ref().map(|(i, s)| (*i, s.as_str()))
    }

    /// Every id that ends generation: the EOS and, as llama.cpp's end-of-generation set, the
    /// end-of-turn tokens a GGUF vocabulary states (`tokenizer.ggml.eot_token_id`,
    /// `eom_token_id`) or spells with one of llama.cpp's end-of-generation texts
    /// (`<end_of_turn>` and `</s>` for Gemma, `<|endoftext|>` for SmolLM2, `<|eot_id|>` for
    /// Llama 3).
    pub fn eog_ids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.eos.iter().map(|e| e.0).collect();
        for &id in &self.eot {
            if !v.contains(&id) {
                v.push(id);
            }
        }
        v
    }

    /// EOS token id and text, if the model declares one.
    pub fn eos(&self) -> Option<(u32, &str)> {
        self.eos.as_ref().map(|(i, s)| (*i, s.as_str()))
    }

    /// The raw Jinja chat template, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The file this tokenizer was loaded from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The wrapped `tokenizers` tokenizer, for callers that need offsets or the vocabulary.
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// A SentencePiece piece's bytes: `<0xNN>` is the byte `NN`, else the text with `▁` a space.
fn spm_piece_bytes(piece: &str) -> Vec<u8> {
    if let Some(hex) = piece.strip_prefix("<0x").and_then(|p| p.strip_suffix('>')) {
        if hex.len() == 2 {
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                return vec![b];
            }
        }
    }
    piece.replace('\u{2581}', " ").into_bytes()
}

/// GPT-2's byte-level alphabet, inverted: the printable character each byte was mapped to,
/// back to the byte.
fn byte_level_inverse() -> std::collections::HashMap<char, u8> {
    let mut printable: Vec<u32> = (u32::from(b'!')..=u32::from(b'~')).collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let mut map = std::collections::HashMap::with_capacity(256);
    let mut extra = 0u32;
    for b in 0u32..256 {
        let c = if printable.contains(&b) {
            b
        } else {
            extra += 1;
            255 + extra
        };
        if let Some(ch) = char::from_u32(c) {
            map.insert(ch, b as u8);
        }
    }
    map
}
