//! `postprocess()`: the second half of a step. Advances each row's computed length, samples one
//! token for every sequence whose last token was computed, ends sequences on a stop token, the
//! length limit or the context, and gives finished requests' pages to the radix cache. A failed
//! forward fails exactly the batch's requests (nano-vllm's `postprocess`, SGLang's
//! `process_batch_result`).

use super::{usage, Scheduled, Scheduler};
use crate::request::{FinishReason, Output};
use crate::sampler::{sample_seq, History};
use crate::EngineError;

impl Scheduler {
    /// Applies the forward's result for `sched` (logits `[rows wanting logits × vocab]`, or the
    /// error that stopped it); outputs go to `out`.
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
        for &(i, n) in &rows {
            let r = &mut self.running[i];
            r.kv_len += n;
            if r.kv_len < r.tokens.len() {
                self.stats.num_prefill_chunks += 1;
                continue; // a non-final prompt chunk
            }
            let row = &mut logits[li * vocab..(li + 1) * vocab].to_vec();
            li += 1;
            let h = History { prompt: &r.tokens[..r.prompt_len], output: &r.tokens[r.prompt_len..], stop_ids: &r.stop_ids };
            let tok = sample_seq(row, &r.sampling, &h);
            r.tokens.push(tok);
            self.stats.generation_tokens_total += 1;
            out.push(Output::Token { id: r.id, token: tok });
            let reason = if r.stop_ids.contains(&tok) {
                Some(FinishReason::Stop(tok))
            } else if r.output_len() >= r.max_new || r.tokens.len() >= self.cfg.context_length {
                Some(FinishReason::Length)
            } else {
                None
            };
            if let Some(reason) = reason {
                finished.push((r.id, reason));
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
