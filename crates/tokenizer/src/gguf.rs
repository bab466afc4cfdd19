//! Builds a HF `tokenizers` tokenizer from GGUF `tokenizer.ggml.*` metadata.
//!
//! Follows llama.cpp's reading of the same keys (`src/llama-vocab.cpp`): `tokenizer.ggml.model`
//! `gpt2` is byte-level BPE over `tokens` with `merges` given as `"left right"` strings;
//! `tokenizer.ggml.pre` names the pre-tokenizer regex set; `token_type` 3 (control) marks
//! special tokens and 4 (user-defined) plain added tokens; `add_bos_token` asks for a BOS
//! token in front of every encoding. The pre-tokenizers below are the ones HF ships in each
//! model's `tokenizer.json` (for SmolLM2: individual digits, then byte-level without prefix
//! space).

use std::path::Path;

use ggus::{GGuf, GGufMetaMapExt};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::{Tokenizer, TokenizerError};

/// GGUF files start with these four bytes.
const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// `tokenizer.ggml.token_type` values (llama.cpp `llama_token_type`).
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// LLaMA-3 pre-tokenizer regex (`llama-bpe` in llama.cpp), also used by many newer BPE models.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// True when `path` starts with the GGUF magic.
///
/// # Errors
/// [`TokenizerError::Io`] when the file cannot be opened or read.
pub fn is_gguf(path: &Path) -> Result<bool, TokenizerError> {
    use std::io::Read;
    let io = |source| TokenizerError::Io { path: path.to_owned(), source };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut magic = [0u8; 4];
    match f.read_exact(&mut magic) {
        Ok(()) => Ok(&magic == GGUF_MAGIC),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(io(e)),
    }
}

/// Loads the tokenizer stored in a GGUF file's metadata.
///
/// # Errors
/// [`TokenizerError::Gguf`] for a missing key, an unknown `tokenizer.ggml.model` or
/// `tokenizer.ggml.pre`; [`TokenizerError::Io`] when the file cannot be mapped.
pub fn load(path: &Path) -> Result<Tokenizer, TokenizerError> {
    // Mapped only while the vocabulary is read out.
    let map = sparrow_cpu::Mapped::open(path).map_err(|source| TokenizerError::Io { path: path.to_owned(), source })?;
    let gguf = GGuf::new(&map).map_err(|e| TokenizerError::Gguf(format!("{}: {e}", path.display())))?;
    from_metadata(&gguf, path)
}

fn meta_err(key: &str, e: ggus::GGufMetaError) -> TokenizerError {
    TokenizerError::Gguf(format!("metadata key {key}: {e:?}"))
}

fn from_metadata(gguf: &GGuf<'_>, path: &Path) -> Result<Tokenizer, TokenizerError> {
    let model = gguf.tokenizer_ggml_model().map_err(|e| meta_err("tokenizer.ggml.model", e))?;
    if model != "gpt2" {
        return Err(TokenizerError::Gguf(format!(
            "tokenizer.ggml.model = {model:?} is not supported (only byte-level BPE, \"gpt2\")"
        )));
    }
    let tokens: Vec<&str> = gguf
        .tokenizer_ggml_tokens()
        .map_err(|e| meta_err("tokenizer.ggml.tokens", e))?
        .collect::<Result<_, _>>()
        .map_err(|e| TokenizerError::Gguf(format!("tokenizer.ggml.tokens: {e:?}")))?;
    let types: Vec<i32> = match gguf.tokenizer_ggml_token_type() {
        Ok(arr) => arr
            .collect::<Result<_, _>>()
            .map_err(|e| TokenizerError::Gguf(format!("tokenizer.ggml.token_type: {e:?}")))?,
        Err(_) => vec![1; tokens.len()],
    };
    let merges: Vec<(String, String)> = gguf
        .tokenizer_ggml_merges()
        .map_err(|e| meta_err("tokenizer.ggml.merges", e))?
        .map(|m| {
            let m = m.map_err(|e| TokenizerError::Gguf(format!("tokenizer.ggml.merges: {e:?}")))?;
            let (a, b) = m.split_once(' ').ok_or_else(|| TokenizerError::Gguf(format!("merge {m:?} has no space")))?;
            Ok((a.to_owned(), b.to_owned()))
        })
        .collect::<Result<_, TokenizerError>>()?;

    let vocab: tokenizers::models::bpe::Vocab =
        tokens.iter().enumerate().map(|(i, t)| ((*t).to_owned(), i as u32)).collect();
    let bpe = BPE::builder().vocab_and_merges(vocab, merges).ignore_merges(false).build()?;
    let mut inner = tokenizers::Tokenizer::new(bpe);

    let pre = gguf.get_str("tokenizer.ggml.pre").unwrap_or("default");
    inner.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
    inner.with_decoder(Some(ByteLevelDecoder::default()));

    let added_of_type = |ty: i32, special: bool| -> Vec<AddedToken> {
        tokens
            .iter()
            .zip(&types)
            .filter(|(_, t)| **t == ty)
            .map(|(s, _)| AddedToken::from((*s).to_owned(), special))
            .collect()
    };
    inner.add_special_tokens(&added_of_type(TOKEN_TYPE_CONTROL, true));
    inner.add_tokens(&added_of_type(TOKEN_TYPE_USER_DEFINED, false));

    let token_at = |key: &str| -> Option<(u32, String)> {
        let id = gguf.get_usize(key).ok()?;
        Some((id as u32, (*tokens.get(id)?).to_owned()))
    };
    let bos = token_at("tokenizer.ggml.bos_token_id");
    let eos = token_at("tokenizer.ggml.eos_token_id");
    if gguf.get_bool("tokenizer.ggml.add_bos_token").unwrap_or(false) {
        let (id, text) = bos
            .clone()
            .ok_or_else(|| TokenizerError::Gguf("add_bos_token is set but bos_token_id is missing".into()))?;
        let post = TemplateProcessing::builder()
            .try_single(format!("{text} $A"))
            .and_then(|b| b.try_pair(format!("{text} $A {text} $B")))
            .map_err(|e| TokenizerError::Gguf(e.to_string()))?
            .special_tokens(vec![(text.clone(), id)])
            .build()
            .map_err(|e| TokenizerError::Gguf(e.to_string()))?;
        inner.with_post_processor(Some(post));
    }
    let chat_template = gguf.tokenizer_chat_template().ok().map(str::to_owned);
    Ok(Tokenizer::from_parts(inner, bos, eos, chat_template, path.to_owned()))
}

/// The HF pre-tokenizer equivalent to llama.cpp's `tokenizer.ggml.pre` name.
fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper, TokenizerError> {
    let byte_level = |use_regex| PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, use_regex));
    Ok(match pre {
        "default" | "gpt2" | "gpt-2" => byte_level(true),
        "smollm" | "starcoder" => PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            byte_level(true),
        ])),
        "llama-bpe" | "llama3" | "smaug-bpe" => {
            let split =
                Split::new(SplitPattern::Regex(LLAMA3_REGEX.to_owned()), SplitDelimiterBehavior::Isolated, false)?;
            PreTokenizerWrapper::Sequence(Sequence::new(vec![PreTokenizerWrapper::Split(split), byte_level(false)]))
        }
        other => {
            return Err(TokenizerError::Gguf(format!(
                "tokenizer.ggml.pre = {other:?} is not supported (known: default, gpt2, smollm, starcoder, llama-bpe)"
            )))
        }
    })
}
