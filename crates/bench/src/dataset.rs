//! Prompt sets, built in full before a run starts.
//!
//! Semantics follow SGLang's `python/sglang/benchmark/datasets/` (`sharegpt.py`, `random.py`,
//! `generated_shared_prefix.py`, `custom.py`), with two corrections: prompt lengths are the
//! re-encoded length of the text actually sent (SGLang reports the target), and a target that
//! leaves no room for content after the tokenizer's special tokens is refused up front.

use std::path::Path;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Deserialize;
use sparrow_tokenizer::{ChatMessage, Tokenizer, TokenizerError};

/// One prompt to send (for a multi-turn conversation, its first round).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DatasetRow {
    /// The prompt text (for `openai` rows, the messages rendered with the chat template).
    pub prompt: String,
    /// Its length in tokens as the server will see it (special tokens included).
    pub prompt_len: u64,
    /// `max_tokens` to ask for (every round of a conversation asks for as many).
    pub output_len: u64,
    /// Chat messages sent as they are instead of `prompt` (`openai` dataset).
    pub messages: Option<Vec<serde_json::Value>>,
    /// The user turns of the later rounds of a multi-turn conversation; each is sent once
    /// the previous round's answer has arrived, with the whole history.
    pub turns: Vec<String>,
    /// Fields of this request's body, over `--extra-request-body` (`openai` dataset).
    pub extra_body: serde_json::Map<String, serde_json::Value>,
    /// `X-SMG-Routing-Key` header value (`--gsp-send-routing-key`).
    pub routing_key: Option<String>,
    /// When to send it, seconds after the start (trace replay); `None`: the arrival process.
    pub arrival_s: Option<f64>,
}

impl DatasetRow {
    /// A plain text prompt.
    pub fn text(prompt: String, prompt_len: u64, output_len: u64) -> Self {
        DatasetRow { prompt, prompt_len, output_len, ..Default::default() }
    }
}

/// Moves the first `offset` (mod len) items to the end (`--dataset-offset`).
pub fn rotate<T>(v: &mut [T], offset: usize) {
    if !v.is_empty() {
        v.rotate_left(offset % v.len());
    }
}

/// Errors while building a dataset.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// A flag value that cannot produce a valid prompt set.
    #[error("{flag}: {message}")]
    BadFlag {
        /// The flag, e.g. `--random-input-len`.
        flag: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The dataset file could not be read.
    #[error("cannot read dataset {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A record of the dataset file is malformed.
    #[error("dataset {path} line {line}: {message}")]
    Record {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// Fewer usable prompts than asked for.
    #[error("only {got} usable prompts in the dataset, {wanted} requested")]
    TooFew {
        /// Usable prompts.
        got: usize,
        /// `--num-prompts`.
        wanted: usize,
    },
    /// Tokenizing or decoding failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

/// A ShareGPT conversation; only the first two turns are used.
#[derive(Debug, Deserialize)]
struct ShareGptRecord {
    #[serde(default, alias = "conversation")]
    conversations: Vec<Turn>,
}

#[derive(Debug, Deserialize)]
struct Turn {
    #[serde(default)]
    value: String,
}

/// (prompt, reply) pairs of every complete ShareGPT record with at least two turns.
///
/// The file is a JSON array; it is read element by element so that a file cut short (as the
/// packaged copy is) yields every record before the cut instead of failing as a whole.
///
/// # Errors
/// [`DatasetError::Io`] if the file cannot be read; a malformed file is not an error, it
/// just yields the records before the damage.
pub fn load_sharegpt(path: &Path) -> Result<Vec<(String, String)>, DatasetError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| DatasetError::Io { path: path.display().to_string(), source })?;
    Ok(parse_sharegpt_lenient(&text))
}

/// The element-by-element parse behind [`load_sharegpt`].
pub fn parse_sharegpt_lenient(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut p = match text.find('[') {
        Some(i) => i + 1,
        None => return out,
    };
    loop {
        while p < bytes.len() && (bytes[p].is_ascii_whitespace() || bytes[p] == b',') {
            p += 1;
        }
        if p >= bytes.len() || bytes[p] == b']' {
            break;
        }
        let mut it = serde_json::Deserializer::from_str(&text[p..]).into_iter::<ShareGptRecord>();
        match it.next() {
            Some(Ok(rec)) => {
                p += it.byte_offset();
                if let [a, b, ..] = rec.conversations.as_slice() {
                    out.push((a.value.clone(), b.value.clone()));
                }
            }
            _ => break,
        }
    }
    out
}

/// Draws `n` lengths uniformly from `[max(floor(len·ratio), 1), len]` (SGLang's
/// `--random-range-ratio`; ratio 1 gives exactly `len`).
pub fn draw_lengths(rng: &mut StdRng, len: u64, ratio: f64, n: usize) -> Vec<u64> {
    let lo = ((len as f64 * ratio).floor() as u64).max(1).min(len.max(1));
    let hi = len.max(1);
    (0..n).map(|_| rng.random_range(lo..=hi)).collect()
}

/// Token ids never used as content: the tokenizer's special tokens.
fn special_ids(tok: &Tokenizer) -> std::collections::HashSet<u32> {
    tok.hf().get_added_tokens_decoder().into_iter().filter(|(_, t)| t.special).map(|(id, _)| id).collect()
}

/// Text whose encoding (special tokens included) is as close to `target` tokens as we can
/// get, built from `source` ids repeated or cut; returns the text and its real length.
///
/// Decoding then re-encoding is not exact at the cut points (BPE may merge across them), so
/// the content length is corrected from the measured length a few times.
fn fit_to_length(tok: &Tokenizer, source: &[u32], target: u64) -> Result<(String, u64), DatasetError> {
    let special = tok.num_special_tokens_to_add() as u64;
    let mut content = target.saturating_sub(special).max(1);
    let mut best: Option<(String, u64)> = None;
    for _ in 0..8 {
        let ids: Vec<u32> = source.iter().copied().cycle().take(content as usize).collect();
        let text = tok.decode(&ids, false)?;
        let got = tok.encode(&text, true)?.len() as u64;
        let better = best.as_ref().is_none_or(|(_, b)| got.abs_diff(target) < b.abs_diff(target));
        if better {
            best = Some((text, got));
        }
        if got == target {
            break;
        }
        let next = (content as i64 + target as i64 - got as i64).max(1) as u64;
        if next == content {
            break;
        }
        content = next;
    }
    Ok(best.unwrap_or_default())
}

/// Checks that a prompt of `--random-input-len` tokens leaves room for content after the
/// tokenizer's special tokens (case B03: input length 1 with a BOS-adding tokenizer).
///
/// # Errors
/// [`DatasetError::BadFlag`] naming `--random-input-len`.
pub fn check_room(tok: &Tokenizer, len: u64) -> Result<(), DatasetError> {
    let special = tok.num_special_tokens_to_add() as u64;
    if len <= special {
        return Err(DatasetError::BadFlag {
            flag: "--random-input-len",
            message: format!(
                "{len} leaves no room for content: the tokenizer adds {special} special token(s) to every prompt; \
                 use --random-input-len of at least {}",
                special + 1
            ),
        });
    }
    Ok(())
}

/// Parameters of the `random` and `random-ids` datasets.
#[derive(Debug, Clone, Copy)]
pub struct RandomSpec {
    /// `--num-prompts`.
    pub num_prompts: usize,
    /// `--random-input-len`.
    pub input_len: u64,
    /// `--random-output-len`.
    pub output_len: u64,
    /// `--random-range-ratio`.
    pub range_ratio: f64,
}

/// Input and output lengths of every prompt of a `random`/`random-ids` run, after checking
/// that the shortest input leaves room for content.
fn draw_random_lengths(
    tok: &Tokenizer,
    spec: RandomSpec,
    rng: &mut StdRng,
) -> Result<(Vec<u64>, Vec<u64>), DatasetError> {
    check_room(tok, spec.input_len)?;
    // Inputs are drawn from U[max(floor(L·r), 1 + special tokens), L], so every prompt has at
    // least one content token.
    let special = tok.num_special_tokens_to_add() as u64;
    let ratio = spec.range_ratio.max((special + 1) as f64 / spec.input_len as f64);
    let input_lens = draw_lengths(rng, spec.input_len, ratio, spec.num_prompts);
    let output_lens = draw_lengths(rng, spec.output_len, spec.range_ratio, spec.num_prompts);
    Ok((input_lens, output_lens))
}

/// `random`: ShareGPT prompts, tokenized, repeated or cut to each drawn length, decoded.
///
/// # Errors
/// [`DatasetError::BadFlag`] when the shortest drawable prompt has no room for content;
/// [`DatasetError::TooFew`] when ShareGPT has too few non-empty prompts.
pub fn random(
    tok: &Tokenizer,
    sharegpt: &[(String, String)],
    spec: RandomSpec,
    rng: &mut StdRng,
) -> Result<Vec<DatasetRow>, DatasetError> {
    let (input_lens, output_lens) = draw_random_lengths(tok, spec, rng)?;
    let mut order: Vec<usize> = (0..sharegpt.len()).collect();
    order.shuffle(rng);
    let mut rows = Vec::with_capacity(spec.num_prompts);
    for i in order {
        if rows.len() == spec.num_prompts {
            break;
        }
        let ids = tok.encode(&sharegpt[i].0, false)?;
        if ids.is_empty() {
            continue;
        }
        let k = rows.len();
        let (prompt, prompt_len) = fit_to_length(tok, &ids, input_lens[k])?;
        rows.push(DatasetRow::text(prompt, prompt_len, output_lens[k]));
    }
    if rows.len() < spec.num_prompts {
        return Err(DatasetError::TooFew { got: rows.len(), wanted: spec.num_prompts });
    }
    Ok(rows)
}

/// `random-ids`: consecutive vocabulary ids from a random offset (SGLang's
/// `(offset + i + j) % vocab_size`), skipping special tokens, decoded.
///
/// # Errors
/// As [`random`].
pub fn random_ids(tok: &Tokenizer, spec: RandomSpec, rng: &mut StdRng) -> Result<Vec<DatasetRow>, DatasetError> {
    let (input_lens, output_lens) = draw_random_lengths(tok, spec, rng)?;
    let special = special_ids(tok);
    let vocab = tok.vocab_size() as u32;
    let mut rows = Vec::with_capacity(spec.num_prompts);
    for i in 0..spec.num_prompts {
        let offset = rng.random_range(0..vocab);
        let ids: Vec<u32> = (0..input_lens[i] as u32 + 8)
            .map(|j| (offset + i as u32 + j) % vocab)
            .filter(|id| !special.contains(id))
            .collect();
        let (prompt, prompt_len) = fit_to_length(tok, &ids, input_lens[i])?;
        rows.push(DatasetRow::text(prompt, prompt_len, output_lens[i]));
    }
    Ok(rows)
}

/// Parameters of the `sharegpt` dataset.
#[derive(Debug, Clone, Copy)]
pub struct ShareGptSpec {
    /// `--num-prompts`.
    pub num_prompts: usize,
    /// `--sharegpt-output-len`: fixed output length instead of the reply's.
    pub output_len: Option<u64>,
    /// `--sharegpt-context-len`: drop pairs longer than this.
    pub context_len: Option<u64>,
    /// `--apply-chat-template`.
    pub apply_chat_template: bool,
}

/// Wraps `prompt` in the model's chat template as one user turn, without the BOS text the
/// server's tokenizer will add again.
pub fn chat_wrap(tok: &Tokenizer, prompt: &str) -> Result<String, DatasetError> {
    let messages = [ChatMessage::new("user", prompt)];
    Ok(templated(tok, &messages)?)
}

/// `messages` through the chat template with the generation prompt, without the BOS text the
/// server's tokenizer adds again.
fn templated(tok: &Tokenizer, messages: &[ChatMessage]) -> Result<String, TokenizerError> {
    let text = tok.apply_chat_template(messages, true)?;
    Ok(match tok.bos() {
        Some((_, bos)) if tok.num_special_tokens_to_add() > 0 && !bos.is_empty() => text.replacen(bos, "", 1),
        _ => text,
    })
}

/// `sharegpt`: first human turn as prompt, its reply's length as output length.
///
/// # Errors
/// [`DatasetError::BadFlag`] for `--sharegpt-output-len` below 4 (SGLang's floor);
/// [`DatasetError::TooFew`] when filtering leaves too few pairs.
pub fn sharegpt(
    tok: &Tokenizer,
    pairs: &[(String, String)],
    spec: ShareGptSpec,
    rng: &mut StdRng,
) -> Result<Vec<DatasetRow>, DatasetError> {
    if let Some(n) = spec.output_len.filter(|n| *n < 4) {
        return Err(DatasetError::BadFlag {
            flag: "--sharegpt-output-len",
            message: format!("{n} is too small (minimum 4)"),
        });
    }
    let mut order: Vec<usize> = (0..pairs.len()).collect();
    order.shuffle(rng);
    let mut rows = Vec::with_capacity(spec.num_prompts);
    for i in order {
        if rows.len() == spec.num_prompts {
            break;
        }
        let (prompt, reply) = &pairs[i];
        let prompt = if spec.apply_chat_template { chat_wrap(tok, prompt)? } else { prompt.clone() };
        let prompt_len = tok.encode(&prompt, true)?.len() as u64;
        let output_len = match spec.output_len {
            Some(n) => n,
            None => tok.encode(reply, false)?.len() as u64,
        };
        if prompt_len < 2 || output_len < 2 {
            continue;
        }
        if spec.context_len.is_some_and(|c| prompt_len + output_len > c) {
            continue;
        }
        rows.push(DatasetRow::text(prompt, prompt_len, output_len));
    }
    if rows.len() < spec.num_prompts {
        return Err(DatasetError::TooFew { got: rows.len(), wanted: spec.num_prompts });
    }
    Ok(rows)
}

/// Parameters of `generated-shared-prefix` (the `--gsp-*` flags).
#[derive(Debug, Clone)]
pub struct GspSpec {
    /// `--gsp-num-groups`.
    pub num_groups: usize,
    /// `--gsp-prompts-per-group`.
    pub prompts_per_group: usize,
    /// `--gsp-system-prompt-len`.
    pub system_prompt_len: usize,
    /// `--gsp-question-len`.
    pub question_len: usize,
    /// `--gsp-output-len`.
    pub output_len: u64,
    /// `--gsp-range-ratio`.
    pub range_ratio: f64,
    /// `--gsp-num-turns`.
    pub num_turns: usize,
    /// `--gsp-ordered`.
    pub ordered: bool,
    /// `--gsp-zipf-alpha` when `--gsp-group-distribution zipf`.
    pub zipf_alpha: Option<f64>,
    /// `--gsp-fast-prepare`.
    pub fast_prepare: bool,
    /// `--gsp-send-routing-key`: the run's key prefix (`<random>_<UTC yyyymmddHHMMSS>`).
    pub routing_key_prefix: Option<String>,
    /// `--seed`, for the Zipf group draw's own generator.
    pub seed: u64,
}

/// Rank-Zipf group probabilities, p(rank) = rank^-alpha / Σ k^-alpha, rank from 1 (group 0
/// is the hottest), as SGLang's `_zipf_group_probs`.
pub fn zipf_group_probs(num_groups: usize, alpha: f64) -> Vec<f64> {
    let w: Vec<f64> = (1..=num_groups).map(|r| (r as f64).powf(-alpha)).collect();
    let sum: f64 = w.iter().sum();
    w.into_iter().map(|x| x / sum).collect()
}

/// `generated-shared-prefix` (SGLang's `sample_generated_shared_prefix_requests`): groups of
/// prompts sharing a random system prompt, each followed by `"\n\n"` and a random question;
/// with `num_turns` > 1 each prompt is a conversation whose later rounds are further random
/// questions. Groups × prompts per group prompts (`--num-prompts` does not apply); slot
/// (g, p) takes question (g, p) and, with Zipf, a drawn group's system prompt. Shuffled
/// unless `ordered`.
///
/// # Errors
/// [`DatasetError::Tokenizer`] if decoding fails.
pub fn generated_shared_prefix(
    tok: &Tokenizer,
    spec: GspSpec,
    rng: &mut StdRng,
) -> Result<Vec<DatasetRow>, DatasetError> {
    let special = special_ids(tok);
    let pool: Vec<u32> = (0..tok.vocab_size() as u32).filter(|i| !special.contains(i)).collect();
    let (g_n, p_n, t_n) = (spec.num_groups, spec.prompts_per_group, spec.num_turns.max(1));
    let lens = |rng: &mut StdRng, len: u64, n: usize| {
        if len == 0 {
            vec![0; n]
        } else {
            draw_lengths(rng, len, spec.range_ratio, n)
        }
    };
    let system_lens = lens(rng, spec.system_prompt_len as u64, g_n);
    let question_lens = lens(rng, spec.question_len as u64, g_n * p_n * t_n);
    let output_lens = lens(rng, spec.output_len, g_n * p_n);
    let mut gen = |n: u64| -> Result<String, DatasetError> {
        let ids: Vec<u32> = (0..n).map(|_| pool[rng.random_range(0..pool.len())]).collect();
        Ok(tok.decode(&ids, false)?)
    };
    let systems = system_lens.iter().map(|&n| gen(n)).collect::<Result<Vec<_>, _>>()?;
    let questions = question_lens.iter().map(|&n| gen(n)).collect::<Result<Vec<_>, _>>()?;
    let assignment: Vec<usize> = match spec.zipf_alpha {
        None => (0..g_n * p_n).map(|slot| slot / p_n.max(1)).collect(),
        Some(alpha) => {
            // Its own generator, so the prompt pool is the same as with uniform groups.
            let mut zrng = StdRng::seed_from_u64(spec.seed ^ 0x21bf_a11a);
            let mut cdf = zipf_group_probs(g_n, alpha);
            for i in 1..cdf.len() {
                cdf[i] += cdf[i - 1];
            }
            (0..g_n * p_n)
                .map(|_| {
                    let u: f64 = zrng.random();
                    cdf.iter().position(|&c| u < c).unwrap_or(g_n - 1)
                })
                .collect()
        }
    };
    let mut rows = Vec::with_capacity(g_n * p_n);
    for (slot, &g) in assignment.iter().enumerate() {
        let q = &questions[slot * t_n..(slot + 1) * t_n];
        let prompt = format!("{}\n\n{}", systems[g], q[0]);
        let prompt_len = if spec.fast_prepare {
            system_lens[g] + question_lens[slot * t_n]
        } else {
            tok.encode(&prompt, true)?.len() as u64
        };
        rows.push(DatasetRow {
            prompt,
            prompt_len,
            output_len: output_lens[slot],
            turns: q[1..].to_vec(),
            routing_key: spec.routing_key_prefix.as_ref().map(|p| format!("{p}_{g}")),
            ..Default::default()
        });
    }
    if !spec.ordered {
        rows.shuffle(rng);
    }
    Ok(rows)
}

/// `custom`: a JSONL file, one request per line, in file order.
///
/// Each line is an object with the prompt in `prompt` or `text`, or as the first turn of
/// `conversations` (ShareGPT shape) or the first `user` entry of `messages`. The output length
/// is `output_len`, `output_tokens` or `max_tokens` when present, else `--sharegpt-output-len`,
/// else the token length of the reply (`conversations[1]`); a line with none of these is an
/// error naming the line.
///
/// # Errors
/// [`DatasetError::Record`] for a line that is not such an object; [`DatasetError::TooFew`].
pub fn custom(
    tok: &Tokenizer,
    path: &Path,
    num_prompts: usize,
    fixed_output_len: Option<u64>,
    apply_chat_template: bool,
    offset: usize,
) -> Result<Vec<DatasetRow>, DatasetError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| DatasetError::Io { path: path.display().to_string(), source })?;
    let mut rows = Vec::new();
    let mut lines: Vec<(usize, &str)> = text.lines().enumerate().collect();
    rotate(&mut lines, offset);
    for (n, line) in lines {
        if rows.len() == num_prompts {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        let err = |message: String| DatasetError::Record { path: path.display().to_string(), line: n + 1, message };
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| err(e.to_string()))?;
        let turns = v.get("conversations").or_else(|| v.get("conversation")).and_then(|c| c.as_array());
        let turn = |i: usize| turns.and_then(|t| t.get(i)).and_then(|t| t.get("value")).and_then(|x| x.as_str());
        let prompt = v
            .get("prompt")
            .or_else(|| v.get("text"))
            .and_then(|p| p.as_str())
            .or_else(|| turn(0))
            .or_else(|| {
                v.get("messages")?
                    .as_array()?
                    .iter()
                    .find(|m| m.get("role").and_then(|r| r.as_str()) == Some("user"))?
                    .get("content")?
                    .as_str()
            })
            .ok_or_else(|| err("no prompt (expected prompt, text, conversations or messages)".into()))?;
        let explicit =
            ["output_len", "output_tokens", "max_tokens"].iter().find_map(|k| v.get(*k).and_then(|x| x.as_u64()));
        let output_len = match explicit.or(fixed_output_len) {
            Some(n) => n,
            None => match turn(1) {
                Some(reply) => tok.encode(reply, false)?.len() as u64,
                None => return Err(err("no output length (output_len, --sharegpt-output-len or a reply turn)".into())),
            },
        };
        let prompt = if apply_chat_template { chat_wrap(tok, prompt)? } else { prompt.to_owned() };
        let prompt_len = tok.encode(&prompt, true)?.len() as u64;
        rows.push(DatasetRow::text(prompt, prompt_len, output_len));
    }
    if rows.len() < num_prompts {
        return Err(DatasetError::TooFew { got: rows.len(), wanted: num_prompts });
    }
    Ok(rows)
}

/// The text parts of a message's `content` (a string, or OpenAI content parts).
fn content_text(content: Option<&serde_json::Value>) -> String {
    match content {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Array(parts)) => {
            parts.iter().filter_map(|p| p.get("text").and_then(|t| t.as_str())).collect::<Vec<_>>().join("")
        }
        _ => String::new(),
    }
}

/// `messages` rendered with the chat template (generation prompt added, the BOS text the
/// server adds again removed); without a usable template, `role: content` lines.
fn render_chat(tok: &Tokenizer, messages: &[ChatMessage]) -> String {
    templated(tok, messages).unwrap_or_else(|_| {
        messages.iter().map(|m| format!("{}: {}", m.role, m.content)).collect::<Vec<_>>().join("\n")
    })
}

/// `openai` (SGLang's `sample_openai_requests`): a JSONL file of chat requests, in file
/// order. Each line needs `messages`; its `max_tokens` is the output length unless
/// `--sharegpt-output-len` is given (256 when neither is); every other field except
/// `max_completion_tokens` and `model` is sent with that request (tools, sampling
/// parameters). The input length is the templated messages' token count plus that of the
/// tools' JSON (the server's own count replaces it when it reports one). Lines that are
/// not JSON, or have no messages, are skipped, as SGLang does.
///
/// # Errors
/// [`DatasetError::Io`]; [`DatasetError::TooFew`] when fewer usable lines than requested.
pub fn openai(
    tok: &Tokenizer,
    path: &Path,
    num_prompts: usize,
    fixed_output_len: Option<u64>,
    offset: usize,
) -> Result<Vec<DatasetRow>, DatasetError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| DatasetError::Io { path: path.display().to_string(), source })?;
    let mut lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    rotate(&mut lines, offset);
    let mut rows = Vec::new();
    for line in lines {
        if rows.len() == num_prompts {
            break;
        }
        let Ok(serde_json::Value::Object(mut obj)) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let Some(serde_json::Value::Array(messages)) = obj.remove("messages") else {
            continue;
        };
        if messages.is_empty() {
            continue;
        }
        let max_tokens = obj.remove("max_tokens").and_then(|v| v.as_u64());
        obj.remove("max_completion_tokens");
        obj.remove("model");
        let chat: Vec<ChatMessage> = messages
            .iter()
            .map(|m| {
                ChatMessage::new(
                    m.get("role").and_then(|r| r.as_str()).unwrap_or("user"),
                    content_text(m.get("content")),
                )
            })
            .collect();
        let prompt = render_chat(tok, &chat);
        let mut prompt_len = tok.encode(&prompt, true)?.len() as u64;
        if let Some(tools) = obj.get("tools") {
            prompt_len += tok.encode(&tools.to_string(), false)?.len() as u64;
        }
        rows.push(DatasetRow {
            prompt,
            prompt_len,
            output_len: fixed_output_len.or(max_tokens).unwrap_or(256),
            messages: Some(messages),
            extra_body: obj,
            ..Default::default()
        });
    }
    if rows.len() < num_prompts {
        return Err(DatasetError::TooFew { got: rows.len(), wanted: num_prompts });
    }
    Ok(rows)
}

/// Parameters of the `mooncake` dataset.
#[derive(Debug, Clone, Copy)]
pub struct MooncakeSpec {
    /// `--num-prompts`: sessions taken from the start of the trace.
    pub num_sessions: usize,
    /// `--mooncake-num-rounds`.
    pub num_rounds: usize,
    /// `--mooncake-slowdown-factor`.
    pub slowdown: f64,
    /// `--dataset-offset`.
    pub offset: usize,
}

/// `mooncake` (SGLang's `MooncakeDataset` and `get_mooncake_request_over_time`): a trace of
/// sessions, one JSON object per line with `timestamp` (ms), `hash_ids` and
/// `output_length`. Each session's prompt is built from its hash ids (`"<id>"` followed by
/// 128 `hi` words each, then `Tell me a story based on this context.`); its rounds are
/// all due at the session's (slowed-down) time, round i's prompt holding the earlier rounds
/// with placeholder answers of `output_length` `story` words, rendered with the chat
/// template. Rows come sorted by arrival.
///
/// # Errors
/// [`DatasetError::Io`]; [`DatasetError::Record`] for a line that is not such an object.
pub fn mooncake(tok: &Tokenizer, path: &Path, spec: MooncakeSpec) -> Result<Vec<DatasetRow>, DatasetError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| DatasetError::Io { path: path.display().to_string(), source })?;
    let mut records: Vec<(usize, serde_json::Value)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| DatasetError::Record {
            path: path.display().to_string(),
            line: n + 1,
            message: e.to_string(),
        })?;
        if v.get("timestamp").and_then(|t| t.as_f64()).is_none() {
            return Err(DatasetError::Record {
                path: path.display().to_string(),
                line: n + 1,
                message: "no numeric timestamp".into(),
            });
        }
        records.push((n, v));
    }
    rotate(&mut records, spec.offset);
    records.truncate(spec.num_sessions);
    let ts = |v: &serde_json::Value| v.get("timestamp").and_then(|t| t.as_f64()).unwrap_or(0.0);
    records.sort_by(|a, b| ts(&a.1).total_cmp(&ts(&b.1)));
    let t0 = records.first().map_or(0.0, |r| ts(&r.1));
    let hi128 = vec!["hi"; 128].join(" ");
    let mut rows = Vec::new();
    for (_, rec) in &records {
        let arrival = (ts(rec) - t0) / 1000.0 * spec.slowdown;
        let mut base = String::new();
        for h in rec.get("hash_ids").and_then(|h| h.as_array()).into_iter().flatten() {
            base.push_str(&h.to_string());
            base.push_str(&hi128);
        }
        base.push_str("Tell me a story based on this context.");
        let output_len = rec.get("output_length").and_then(|o| o.as_u64()).unwrap_or(256);
        let placeholder = vec!["story"; output_len as usize].join(" ");
        let mut history: Vec<ChatMessage> = Vec::new();
        for round in 0..spec.num_rounds {
            history.push(ChatMessage::new("user", format!("Round {}: {base}", round + 1)));
            let prompt = render_chat(tok, &history);
            let prompt_len = tok.encode(&prompt, true)?.len() as u64;
            rows.push(DatasetRow { prompt, prompt_len, output_len, arrival_s: Some(arrival), ..Default::default() });
            history.push(ChatMessage::new("assistant", placeholder.clone()));
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_sharegpt_keeps_complete_records() {
        let text = r#"[
  {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
  {"id": "b", "conversations": [{"from": "human", "value": "only one turn"}]},
  {"id": "c", "conversation": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "r"}, {"from": "human", "value": "x"}]},
  {"id": "d", "conversations": [{"from": "human", "value": "cut he"#;
        let pairs = parse_sharegpt_lenient(text);
        assert_eq!(pairs, vec![("hi".into(), "hello".into()), ("q".into(), "r".into())]);
    }

    #[test]
    fn lengths_follow_sglang_range_ratio() {
        let mut rng = StdRng::seed_from_u64(1);
        let l = draw_lengths(&mut rng, 10, 0.5, 2000);
        assert_eq!(l.iter().min(), Some(&5));
        assert_eq!(l.iter().max(), Some(&10));
        let l = draw_lengths(&mut rng, 10, 0.0, 2000);
        assert_eq!(l.iter().min(), Some(&1));
        assert!(draw_lengths(&mut rng, 7, 1.0, 50).iter().all(|&x| x == 7));
    }
}
