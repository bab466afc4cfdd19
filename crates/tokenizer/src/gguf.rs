//! Builds a HF `tokenizers` tokenizer from GGUF `tokenizer.ggml.*` metadata.
//!
//! Follows llama.cpp's reading of the same keys (`src/llama-vocab.cpp`): `tokenizer.ggml.model`
//! `gpt2` is byte-level BPE over `tokens` with `merges` given as `"left right"` strings;
//! `llama` is a SentencePiece vocabulary (see [`spm_model`]: scores instead of merges, `▁` for
//! spaces, `<0xNN>` byte fallback, `add_space_prefix`);
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
const TOKEN_TYPE_BYTE: i32 = 6;

/// Token texts llama.cpp puts in every vocabulary's end-of-generation set and marks as control
/// tokens (`src/llama-vocab.cpp`, `llama_vocab::impl::load`, llama.cpp 0c1e570).
const LLAMA_CPP_EOG: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "[e~[",
];

/// LLaMA-3 pre-tokenizer regex (`llama-bpe` in llama.cpp), also used by many newer BPE models.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's pre-tokenizer regex (`qwen2` in llama.cpp, also `deepseek-r1-qwen`): Llama 3's with
/// single digits (`\p{N}`, not `\p{N}{1,3}`).
const QWEN2_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen3.5's split (its `tokenizer.json`; llama.cpp's `LLAMA_VOCAB_PRE_TYPE_QWEN35`): Qwen2's
/// with combining marks (`\p{M}`) kept in words.
const QWEN35_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// DeepSeek's pre-tokenizers as llama.cpp's `llama_vocab` lists them (`src/llama-vocab.cpp`,
/// `LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM` / `DEEPSEEK3_LLM` / `DEEPSEEK_CODER`) and DeepSeek's
/// `tokenizer.json` states them: a sequence of regex splits, each match isolated, then byte-level
/// without a regex of its own. Generated from llama.cpp's source, non-ASCII as escapes.
const DEEPSEEK_LLM_SPLITS: &[&str] = &[
    "[\r\n]",
    "\\s?[A-Za-z\u{b5}\u{c0}-\u{d6}\u{d8}-\u{f6}\u{f8}-\u{1ba}\u{1bc}-\u{1bf}\u{1c4}-\u{293}\u{295}-\u{2af}\u{370}-\u{373}\u{376}\u{377}\u{37b}-\u{37d}\u{37f}\u{386}\u{388}-\u{38a}\u{38c}\u{38e}-\u{3a1}\u{3a3}-\u{3f5}\u{3f7}-\u{481}\u{48a}-\u{52f}\u{531}-\u{556}\u{10a0}-\u{10c5}\u{13a0}-\u{13f5}\u{13f8}-\u{13fd}\u{1c90}-\u{1cba}\u{1cbd}-\u{1cbf}\u{1d00}-\u{1d2b}\u{1d6b}-\u{1d77}\u{1d79}-\u{1d9a}\u{1e00}-\u{1f15}\u{1f18}-\u{1f1d}\u{1f20}-\u{1f45}\u{1f48}-\u{1f4d}\u{1f50}-\u{1f57}\u{1f59}\u{1f5b}\u{1f5d}\u{1f5f}-\u{1f7d}\u{1f80}-\u{1fb4}\u{1fb6}-\u{1fbc}\u{1fbe}\u{1fc2}-\u{1fc4}\u{1fc6}-\u{1fcc}\u{1fd0}-\u{1fd3}\u{1fd6}-\u{1fdb}\u{1fe0}-\u{1fec}\u{1ff2}-\u{1ff4}\u{1ff6}-\u{1ffc}\u{2102}\u{2107}\u{210a}-\u{2113}\u{2115}\u{2119}-\u{211d}\u{2124}\u{2126}\u{2128}\u{212a}-\u{212d}\u{212f}-\u{2134}\u{2139}\u{213c}-\u{213f}\u{2145}-\u{2149}\u{214e}\u{2183}\u{2184}\u{2c00}-\u{2c7b}\u{2c7e}-\u{2ce4}\u{2ceb}-\u{2cee}\u{2cf2}\u{2cf3}\u{a640}-\u{a66d}\u{a680}-\u{a69b}\u{a722}-\u{a76f}\u{a771}-\u{a787}\u{a78b}-\u{a78e}\u{ab70}-\u{abbf}\u{fb00}-\u{fb06}\u{fb13}-\u{fb17}\u{ff21}-\u{ff3a}\u{ff41}-\u{ff5a}\u{10400}-\u{1044f}\u{104b0}-\u{104d3}\u{104d8}-\u{104fb}\u{10c80}-\u{10cb2}\u{10cc0}-\u{10cf2}\u{118a0}-\u{118df}\u{1e900}-\u{1e943}]+",
    "\\s?[!-/:-~\u{ff01}-\u{ff0f}\u{ff1a}-\u{ff5e}\u{2018}-\u{201f}\u{3000}-\u{3002}]+",
    "\\s+$",
    "[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+",
    "\\p{N}+",
];

const DEEPSEEK3_SPLITS: &[&str] = &[
    "\\p{N}{1,3}",
    "[\u{4e00}-\u{9fa5}\u{3040}-\u{309f}\u{30a0}-\u{30ff}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
];

const DEEPSEEK_CODER_SPLITS: &[&str] =
    &["[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+", "\\p{N}"];

/// GPT-4o's (o200k) pre-tokenizer regex, as its `tokenizer.json` states it (llama.cpp's
/// `gpt-4o` pre-type, used by Phi-4-mini and Llama 4): cased words keep their capitals together
/// with the lowercase run after them, contractions attach, digits go in threes.
const GPT4O_REGEX: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Mistral's Tekken pre-tokenizer regex (`tekken` in llama.cpp: Mistral Nemo, Ministral 8B,
/// Mistral Small 3), as `tekken.json` / `tokenizer.json` state it (and llama.cpp quotes it in
/// `llama-vocab.cpp`): GPT-4o's without the contractions, digits one by one. llama.cpp runs an
/// ASCII-case approximation (`[^a-z]` / `[^A-Z]` over letters) because its matcher folds every
/// non-ASCII letter into one class: on ASCII text the ids are the same, but a capital after
/// lowercase in another script (`ПриветМир`) starts a new piece here, as in Mistral's own
/// tokenizer, and not in llama.cpp.
const TEKKEN_REGEX: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

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
    // The index, not `GGuf::new`, which cannot read a tensor of a type newer than `ggus` (MXFP4).
    let ix =
        sparrow_cpu::format::gguf::index(&map).map_err(|e| TokenizerError::Gguf(format!("{}: {e}", path.display())))?;
    from_metadata(&ix.file, path)
}

fn meta_err(key: &str, e: ggus::GGufMetaError) -> TokenizerError {
    TokenizerError::Gguf(format!("metadata key {key}: {e:?}"))
}

fn from_metadata(gguf: &GGuf<'_>, path: &Path) -> Result<Tokenizer, TokenizerError> {
    let model = gguf.tokenizer_ggml_model().map_err(|e| meta_err("tokenizer.ggml.model", e))?;
    if model != "gpt2" && model != "llama" && model != "bert" {
        return Err(TokenizerError::Gguf(format!(
            "tokenizer.ggml.model = {model:?} is not supported (byte-level BPE \"gpt2\", SentencePiece \"llama\" \
             and WordPiece \"bert\" are)"
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
    if model == "bert" {
        return wordpiece(gguf, &tokens, &types, path);
    }
    let (mut inner, pieces) = if model == "llama" {
        let scores: Vec<f32> = gguf
            .tokenizer_ggml_scores()
            .map_err(|e| meta_err("tokenizer.ggml.scores", e))?
            .collect::<Result<_, _>>()
            .map_err(|e| TokenizerError::Gguf(format!("tokenizer.ggml.scores: {e:?}")))?;
        if scores.len() != tokens.len() {
            return Err(TokenizerError::Gguf(format!("{} scores for {} tokens", scores.len(), tokens.len())));
        }
        let prefix = gguf.get_bool("tokenizer.ggml.add_space_prefix").unwrap_or(true);
        let unk = gguf.get_usize("tokenizer.ggml.unknown_token_id").ok().and_then(|i| tokens.get(i).copied());
        (spm_model(&tokens, &scores, &types, prefix, unk)?, crate::Pieces::SentencePiece)
    } else {
        let merges: Vec<(String, String)> = gguf
            .tokenizer_ggml_merges()
            .map_err(|e| meta_err("tokenizer.ggml.merges", e))?
            .map(|m| {
                let m = m.map_err(|e| TokenizerError::Gguf(format!("tokenizer.ggml.merges: {e:?}")))?;
                let (a, b) =
                    m.split_once(' ').ok_or_else(|| TokenizerError::Gguf(format!("merge {m:?} has no space")))?;
                Ok((a.to_owned(), b.to_owned()))
            })
            .collect::<Result<_, TokenizerError>>()?;
        let vocab: tokenizers::models::bpe::Vocab =
            tokens.iter().enumerate().map(|(i, t)| ((*t).to_owned(), i as u32)).collect();
        let pre = gguf.get_str("tokenizer.ggml.pre").unwrap_or("default");
        // Llama 3's `tokenizer.json` sets `ignore_merges`: a pre-token that is itself in the
        // vocabulary is one token, whatever the merges would build (llama.cpp: `ignore_merges`
        // for its LLAMA3 pre-tokenizer group; " Việt" is one token only this way). llama.cpp
        // sets it for `tekken` too, as tiktoken (Tekken's own encoder) looks a whole pre-token up
        // first; with merges derived from the ranks, as the converter writes them, the ids are
        // the same either way.
        let ignore_merges = matches!(pre, "llama3" | "llama-v3" | "llama-bpe" | "tekken");
        let bpe = BPE::builder().vocab_and_merges(vocab, merges).ignore_merges(ignore_merges).build()?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        (inner, crate::Pieces::ByteLevel)
    };

    // llama.cpp makes every end-of-generation token a control token, whatever the file says
    // (`</s>` is user-defined in Gemma 3's vocabulary).
    let types: Vec<i32> = tokens
        .iter()
        .zip(&types)
        .map(|(t, &ty)| if LLAMA_CPP_EOG.contains(t) { TOKEN_TYPE_CONTROL } else { ty })
        .collect();
    let added_of_type = |ty: i32, special: bool| -> Vec<AddedToken> {
        tokens
            .iter()
            .zip(&types)
            .filter(|(_, t)| **t == ty)
            // Matched in the raw text, before SentencePiece's `▁` normalizer: llama.cpp splits
            // user-defined tokens (Gemma's runs of spaces) out of the text as it is.
            .map(|(s, _)| AddedToken::from((*s).to_owned(), special).normalized(false))
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
    let mut eot: Vec<u32> = ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"]
        .iter()
        .filter_map(|k| gguf.get_usize(k).ok().map(|i| i as u32))
        .collect();
    eot.extend(tokens.iter().enumerate().filter(|(_, t)| LLAMA_CPP_EOG.contains(t)).map(|(i, _)| i as u32));
    eot.sort_unstable();
    eot.dedup();
    Ok(Tokenizer::from_parts(inner, bos, eos, chat_template, path.to_owned(), pieces, eot))
}

/// A BERT vocabulary (`tokenizer.ggml.model = bert`, llama.cpp's WPM tokenizer) as the HF
/// WordPiece tokenizer it was converted from. llama.cpp's converter marks a word's first piece
/// with `▁` and writes a continuation without HF's `##` (`convert_hf_to_gguf.py`,
/// `BertModel.set_vocab`); control tokens (`[CLS]`, `[PAD]`) keep their text. Reversed here:
/// `▁x` is `x`, a bare `x` is `##x`. The rest is `BertTokenizerFast`'s: the BERT normalizer
/// (lowercase and accent stripping per `tokenizer.ggml.normalizer.lowercase`, as llama.cpp's WPM
/// does both), the BERT pre-tokenizer, `[CLS] $A [SEP]` / `[CLS] $A [SEP] $B [SEP]` with the
/// file's `cls` (or `bos`) and `seperator` ids, segment B typed 1.
fn wordpiece(gguf: &GGuf<'_>, tokens: &[&str], types: &[i32], path: &Path) -> Result<Tokenizer, TokenizerError> {
    use tokenizers::models::wordpiece::WordPiece;
    let mut vocab: tokenizers::models::bpe::Vocab = Default::default();
    let mut pieces = Vec::with_capacity(tokens.len());
    for (i, (t, &ty)) in tokens.iter().zip(types).enumerate() {
        let piece = match t.strip_prefix('\u{2581}') {
            _ if ty == TOKEN_TYPE_CONTROL => (*t).to_owned(),
            Some(word) => word.to_owned(),
            None => format!("##{t}"),
        };
        vocab.entry(piece.clone()).or_insert(i as u32);
        pieces.push(piece);
    }
    let id = |key: &str| gguf.get_usize(key).ok().filter(|&i| i < tokens.len());
    let unk = id("tokenizer.ggml.unknown_token_id").map_or_else(|| "[UNK]".to_owned(), |i| pieces[i].clone());
    let wp = WordPiece::builder()
        .vocab(vocab)
        .unk_token(unk)
        .continuing_subword_prefix("##".into())
        .max_input_chars_per_word(100)
        .build()?;
    let mut inner = tokenizers::Tokenizer::new(wp);
    let lower = gguf.get_bool("tokenizer.ggml.normalizer.lowercase").unwrap_or(true);
    inner.with_normalizer(Some(tokenizers::normalizers::BertNormalizer::new(true, true, None, lower)));
    inner.with_pre_tokenizer(Some(tokenizers::pre_tokenizers::bert::BertPreTokenizer));
    inner.with_decoder(Some(tokenizers::decoders::wordpiece::WordPiece::default()));
    let specials: Vec<AddedToken> = pieces
        .iter()
        .zip(types)
        .filter(|(_, &ty)| ty == TOKEN_TYPE_CONTROL)
        .map(|(p, _)| AddedToken::from(p.clone(), true))
        .collect();
    inner.add_special_tokens(&specials);
    // Older files name the CLS token `cls_token_id`, newer ones `bos_token_id`.
    let cls = id("tokenizer.ggml.cls_token_id").or_else(|| id("tokenizer.ggml.bos_token_id"));
    let (cls, sep) = match (cls, id("tokenizer.ggml.seperator_token_id")) {
        (Some(c), Some(s)) => (c, s),
        _ => return Err(TokenizerError::Gguf("a BERT vocabulary needs cls (or bos) and seperator token ids".into())),
    };
    let (c, s) = (pieces[cls].clone(), pieces[sep].clone());
    let post = TemplateProcessing::builder()
        .try_single(format!("{c}:0 $A:0 {s}:0"))
        .and_then(|b| b.try_pair(format!("{c}:0 $A:0 {s}:0 $B:1 {s}:1")))
        .map_err(|e| TokenizerError::Gguf(e.to_string()))?
        .special_tokens(vec![(c.clone(), cls as u32), (s.clone(), sep as u32)])
        .build()
        .map_err(|e| TokenizerError::Gguf(e.to_string()))?;
    inner.with_post_processor(Some(post));
    let eos = Some((sep as u32, s));
    Ok(Tokenizer::from_parts(
        inner,
        Some((cls as u32, c)),
        eos,
        None,
        path.to_owned(),
        crate::Pieces::Other,
        Vec::new(),
    ))
}

/// The SentencePiece vocabulary of a GGUF file (`tokenizer.ggml.model = llama`) as a HF BPE
/// model, the structure HF's own converters give SentencePiece-BPE models (Gemma's
/// `tokenizer.json`): spaces normalized to `▁` (and one prepended when `add_space_prefix`),
/// no pre-tokenizer, byte fallback to the `<0xNN>` tokens, and a decoder that maps `▁` back to
/// spaces, fuses the fallback bytes and, with the prefix, strips the one leading space.
///
/// GGUF stores scores, not merges. llama.cpp's `llm_tokenizer_spm` starts from the text's
/// characters and repeatedly joins the adjacent pair whose concatenation is the vocabulary
/// token of highest score (leftmost on ties). That is BPE with a merge `(a, b)` for every
/// split of a token `t = a + b` into two vocabulary tokens, ranked by `t`'s score (highest
/// first, then by id), which is how HF's `SentencePieceExtractor` derives them too.
///
/// # Errors
/// [`TokenizerError::Hf`] when `tokenizers` rejects the vocabulary.
fn spm_model(
    tokens: &[&str],
    scores: &[f32],
    types: &[i32],
    add_space_prefix: bool,
    unk: Option<&str>,
) -> Result<tokenizers::Tokenizer, TokenizerError> {
    use std::collections::HashMap;
    use tokenizers::decoders::byte_fallback::ByteFallback;
    use tokenizers::decoders::fuse::Fuse;
    use tokenizers::decoders::sequence::Sequence as DecoderSequence;
    use tokenizers::decoders::strip::Strip;
    use tokenizers::normalizers::{prepend::Prepend, replace::Replace, Sequence as NormSequence};
    use tokenizers::{DecoderWrapper, NormalizerWrapper};

    // The last of duplicate texts wins, as in llama.cpp's `token_to_id` map (the earlier ids
    // of such a text are then not reachable by encoding, nor decodable by this model).
    let mut ids: HashMap<&str, u32> = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        ids.insert(*t, i as u32);
    }
    let mut ranked: Vec<(f32, u32, u32, u32)> = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        // Byte tokens stand for bytes, not their `<0xNN>` text.
        if types.get(i) == Some(&TOKEN_TYPE_BYTE) || ids.get(t) != Some(&(i as u32)) {
            continue;
        }
        for (k, _) in t.char_indices().skip(1) {
            if let (Some(&a), Some(&b)) = (ids.get(&t[..k]), ids.get(&t[k..])) {
                ranked.push((scores[i], i as u32, a, b));
            }
        }
    }
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
    let merges: Vec<(String, String)> =
        ranked.iter().map(|&(_, _, a, b)| (tokens[a as usize].to_owned(), tokens[b as usize].to_owned())).collect();
    let vocab: tokenizers::models::bpe::Vocab = ids.iter().map(|(t, &i)| ((*t).to_owned(), i)).collect();
    let mut bpe = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true).ignore_merges(false);
    if let Some(unk) = unk {
        bpe = bpe.unk_token(unk.to_owned());
    }
    let mut inner = tokenizers::Tokenizer::new(bpe.build()?);
    let replace = Replace::new(" ", "\u{2581}")?;
    let norm: NormalizerWrapper = if add_space_prefix {
        NormSequence::new(vec![Prepend::new("\u{2581}".into()).into(), replace.into()]).into()
    } else {
        replace.into()
    };
    inner.with_normalizer(Some(norm));
    let mut dec: Vec<DecoderWrapper> =
        vec![Replace::new("\u{2581}", " ")?.into(), ByteFallback::new().into(), Fuse::new().into()];
    if add_space_prefix {
        dec.push(Strip::new(' ', 1, 0).into());
    }
    inner.with_decoder(Some(DecoderSequence::new(dec)));
    Ok(inner)
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
        "llama-bpe" | "llama3" | "llama-v3" | "smaug-bpe" | "qwen2" | "qwen35" | "deepseek-r1-qwen" | "gpt-4o"
        | "llama4" | "tekken" => {
            let re = match pre {
                "gpt-4o" | "llama4" => GPT4O_REGEX,
                "tekken" => TEKKEN_REGEX,
                "qwen2" | "deepseek-r1-qwen" => QWEN2_REGEX,
                "qwen35" => QWEN35_REGEX,
                _ => LLAMA3_REGEX,
            };
            let split = Split::new(SplitPattern::Regex(re.to_owned()), SplitDelimiterBehavior::Isolated, false)?;
            PreTokenizerWrapper::Sequence(Sequence::new(vec![PreTokenizerWrapper::Split(split), byte_level(false)]))
        }
        "deepseek-llm" | "deepseek-v3" | "deepseek-coder" => {
            let res = match pre {
                "deepseek-llm" => DEEPSEEK_LLM_SPLITS,
                "deepseek-v3" => DEEPSEEK3_SPLITS,
                _ => DEEPSEEK_CODER_SPLITS,
            };
            let mut seq = Vec::with_capacity(res.len() + 1);
            for re in res {
                let split = Split::new(SplitPattern::Regex((*re).to_owned()), SplitDelimiterBehavior::Isolated, false)?;
                seq.push(PreTokenizerWrapper::Split(split));
            }
            seq.push(byte_level(false));
            PreTokenizerWrapper::Sequence(Sequence::new(seq))
        }
        other => {
            return Err(TokenizerError::Gguf(format!(
                "tokenizer.ggml.pre = {other:?} is not supported (known: default, gpt2, gpt-2, smollm, starcoder, \
                 llama-bpe, llama3, llama-v3, smaug-bpe, qwen2, deepseek-r1-qwen, deepseek-llm, deepseek-v3, \
                 deepseek-coder, gpt-4o, llama4, tekken)"
            )))
        }
    })
}
