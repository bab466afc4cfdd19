//! `postprocess()`: the second half of a step. Advances each row's computed length, samples one
//! token for every sequence whose last token was computed, ends sequences on a stop token, the
//! length limit or the context, and gives finished requests' pages to the radix cache. A failed
//! forward fails exactly the batch's requests (nano-vllm's `postprocess`, SGLang's
//! `process_batch_result`).

use super::{usage, Req, Scheduled, Scheduler};
use crate::logprobs::row_logprobs;
use crate::request::{FinishReason, Output};
use crate::sampler::{sample_seq, History};
use crate::EngineError;

impl Scheduler {
    /// Applies the forward's result for `sched` (logits `[Σ num_logits × vocab]`, or the error
    /// that stopped it); outputs go to `out`. Prompt-logprob rows are reduced to
    /// [`TokenLogprob`](crate::request::TokenLogprob)s here and sent as one `PromptLogprobs`
    /// when the prompt's last chunk ran.
    pub fn postprocess(&mut self, sched: Scheduled, result: Result<Vec<f32>, EngineError>, out: &mut Vec<Output>) {
        let Scheduled { batch, rows } = sched;
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                // Fail this batch's requests; the engine keeps serving the rest.
                let ids: Vec<u64> = rows.iter().map(|&(i, _)| self.running[i].id).collect();
                for id in ids {
                    if let Some(i) = self.running.iter().position(|r| r.id == id) {
                        let mut r = self.running.swap_remove(i);
                        r.kv_len = 0; // its KV is not trustworthy: do not cache it
                        self.release(&mut r);
                        out.push(Output::Finished { id, reason: FinishReason::Error(e.to_string()), usage: usage(&r) });
                    }
                }
                self.last_batch = Some(batch);
                return;
            }
        };
        let vocab = if batch.logits_rows.is_empty() { 0 } else { logits.len() / batch.logits_rows.len() };
        let mut li = 0;
        let mut finished = Vec::new();
        // Requests whose prompt this forward completed (a hybrid model saves their state).
        let mut prompt_ends = Vec::new();
        for (k, &(i, n)) in rows.iter().enumerate() {
            let r = &mut self.running[i];
            let nl = batch.seqs[k].num_logits as usize;
            let base = li;
            let row_of = |j: usize| logits_row(&logits, vocab, base + j);
            // Rows before the chunk's last predict prompt tokens: reduce each to its logprobs
            // now, so a step never keeps more than its own rows.
            let first_pos = r.kv_len + n - nl;
            if r.prompt_lp_pending() {
                for j in 0..nl {
                    let pos = first_pos + j;
                    if pos + 1 < r.prompt_len {
                        let lp = &r.logprobs;
                        r.prompt_lp.push(row_logprobs(row_of(j), Some(r.tokens[pos + 1]), lp.top_n, &lp.token_ids));
                    }
                }
            }
            li += nl;
            // A verify row computed the last sampled token and the proposals after it.
            let drafts = std::mem::take(&mut r.draft);
            let decode = r.decoding();
            r.kv_len += n - drafts.len();
            if r.kv_len == r.prompt_len && n > 0 && r.prompt_state.is_none() && !r.embed {
                prompt_ends.push(i);
            }
            if r.kv_len < r.tokens.len() {
                self.stats.num_prefill_chunks += 1;
                continue; // a non-final prompt chunk
            }
            if r.prompt_lp_pending() {
                r.prompt_lp_done = true;
                let start = r.logprobs.prompt_start.unwrap_or(0).min(r.prompt_len);
                let mut entries = std::mem::take(&mut r.prompt_lp);
                if start == 0 {
                    entries.insert(0, row_logprobs(&[], None, 0, &[]));
                    entries[0].token = r.tokens[0];
                }
                out.push(Output::PromptLogprobs { id: r.id, start, entries });
            }
            if r.embed {
                out.push(Output::Embedding { id: r.id, values: row_of(nl - 1).to_vec() });
                // Nothing of an embedding request is kept: its pages go back at once.
                r.kv_len = 0;
                finished.push((r.id, FinishReason::Length));
                continue;
            }
            if r.output_len() >= r.max_new {
                // `max_tokens: 0` with prompt logprobs: the prompt was all that was asked.
                finished.push((r.id, FinishReason::Length));
                continue;
            }
            // Row `first + j` predicts the token after proposal `j - 1`: sample there as
            // without speculation, keep going while the sample equals the proposal (the
            // rejection rule for a point-mass proposal, see `crate::spec`).
            let first = nl - 1 - drafts.len();
            let mut accepted = 0;
            for j in 0..=drafts.len() {
                let (tok, reason) = match sample_next(r, row_of(first + j), self.cfg.context_length, out) {
                    Ok(s) => s,
                    Err(reason) => {
                        finished.push((r.id, reason));
                        break;
                    }
                };
                self.stats.generation_tokens_total += 1;
                let hit = drafts.get(j) == Some(&tok);
                if hit {
                    // Its KV was computed by this forward.
                    r.kv_len += 1;
                    accepted += 1;
                }
                if let Some(reason) = reason {
                    finished.push((r.id, reason));
                    break;
                }
                if !hit {
                    break;
                }
            }
            if let (true, Some(s)) = (decode, r.spec.as_mut()) {
                s.record(drafts.len(), accepted);
                self.stats.spec_verify_ct_total += 1;
                self.stats.spec_draft_tokens_total += drafts.len() as u64;
                self.stats.spec_accepted_tokens_total += accepted as u64;
            }
            // The draft model's KV holds the same tokens up to where the target accepted.
            r.draft_kv_len = r.draft_kv_len.min(r.kv_len);
            if decode {
                // Rejected positions' pages (and a draft model's unused ones) go back now;
                // slots of rejected positions in a kept page are rewritten before anything
                // reads them (reads stop at `kv_len`).
                let keep = r.kv_len.div_ceil(self.cfg.page_size).max(r.prefix_pages);
                for p in r.page_table.drain(keep.min(r.page_table.len())..) {
                    self.alloc.release(p);
                }
            }
        }
        if self.cfg.state_checkpoints > 0 && !self.cfg.disable_radix_cache {
            // The state where each prompt ended, saved before the next forward moves it on;
            // the radix cache gets it with the pages at release (an agent's next turn repeats
            // this prompt and diverges after it).
            for i in prompt_ends {
                let r = &self.running[i];
                let at = r.prompt_len;
                if !at.is_multiple_of(self.cfg.page_size) || self.radix.has_state(&r.tokens[..at]) {
                    continue;
                }
                if let Some(c) = self.radix.reserve_state() {
                    self.pending_states.push(crate::kv::StateCopy::Save { slot: r.pool_idx, ckpt: c });
                    self.running[i].prompt_state = Some((at, c));
                }
            }
        }
        for (id, reason) in finished {
            if let Some(i) = self.running.iter().position(|r| r.id == id) {
                let mut r = self.running.swap_remove(i);
                self.release(&mut r);
                out.push(Output::Finished { id, reason, usage: usage(&r) });
            }
        }
        self.last_batch = Some(batch);
    }
}

/// Samples the token after `r.tokens` from its raw logits row `raw` under the request's
/// grammar, penalties and sampling parameters, appends it and sends it (with its logprobs
/// when asked); returns it with the reason the request ends on it, if any. `Err` ends the
/// request without a token (a grammar that fails or allows nothing).
fn sample_next(
    r: &mut Req,
    raw: &[f32],
    context_length: usize,
    out: &mut Vec<Output>,
) -> Result<(u32, Option<FinishReason>), FinishReason> {
    let mut row = raw.to_vec();
    let mask = match (r.mask.take(), r.constraint.as_mut()) {
        (Some(m), _) => Some(m),
        (None, Some(c)) => Some(super::grammar_mask(c.as_mut(), row.len())),
        (None, None) => None,
    };
    if let Some(mask) = mask {
        // Structured output: tokens the grammar does not allow next cannot be drawn.
        let allowed = match mask {
            Ok(a) if a.len() == row.len() => a,
            Ok(a) => {
                let e = format!("grammar: a mask of {} tokens for a vocabulary of {}", a.len(), row.len());
                return Err(FinishReason::Error(e));
            }
            Err(e) => return Err(FinishReason::Error(format!("grammar: {e}"))),
        };
        if !allowed.contains(&true) {
            return Err(FinishReason::Error("grammar: no token is allowed next".into()));
        }
        for (l, &a) in row.iter_mut().zip(&allowed) {
            if !a {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    let h = History { prompt: &r.tokens[..r.prompt_len], output: &r.tokens[r.prompt_len..], stop_ids: &r.stop_ids };
    let tok = sample_seq(&mut row, &r.sampling, &h);
    let logprob =
        r.logprobs.output.then(|| Box::new(row_logprobs(raw, Some(tok), r.logprobs.top_n, &r.logprobs.token_ids)));
    r.tokens.push(tok);
    out.push(Output::Token { id: r.id, token: tok, logprob });
    let grammar = r.constraint.as_mut().map(|c| c.advance(tok));
    let reason = if r.stop_ids.contains(&tok) {
        Some(FinishReason::Stop(tok))
    } else if let Some(Err(e)) = grammar {
        Some(FinishReason::Error(format!("grammar: {e}")))
    } else if let Some(Ok(true)) = grammar {
        Some(FinishReason::GrammarEnd)
    } else if r.output_len() >= r.max_new || r.tokens.len() >= context_length {
        Some(FinishReason::Length)
    } else {
        None
    };
    Ok((tok, reason))
}

/// Row `k` of `[rows × vocab]` logits.
fn logits_row(logits: &[f32], vocab: usize, k: usize) -> &[f32] {
    &logits[k * vocab..(k + 1) * vocab]
}
