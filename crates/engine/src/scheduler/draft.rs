//! STANDALONE proposals: a smaller draft model of the same vocabulary guesses the next tokens
//! of every speculating DECODE row before the step (SGLang's `STANDALONE` worker, one chain:
//! `--speculative-eagle-topk 1`).
//!
//! The draft keeps its own KV store with the target's slot numbering: position `p` of a
//! request lives in the same slot in both stores, so one page allocation, one page table and
//! one radix cache serve both models (the pool is sized for both: `derive_config` is given
//! the two layouts' bytes per token). A request's draft KV is computed lazily: the first
//! forward of a step catches the draft up from `draft_kv_len` to the last sampled token
//! (a prompt it never saw, or the tokens the last verify accepted; at most the prefill budget
//! of tokens a step, so a long prompt is caught up in chunks) and gives the first proposal;
//! each further forward feeds the previous proposal and gives the next. Proposals are the
//! draft's argmax, a point mass, so the verify rule in `postprocess` keeps the target's
//! distribution whatever the draft says. A draft KV that is stale (a radix page whose tokens
//! the draft never ran) makes worse guesses, never a wrong output.

use super::Scheduler;
use crate::batch::ForwardBatch;
use crate::kv::KvStore;
use crate::model::Model;

/// One row of a draft forward.
struct Row {
    /// Index in `running`.
    i: usize,
    /// Proposals wanted this step (0: a catch-up chunk only).
    k: usize,
    /// Tokens the first forward catches up (all that are behind when `k > 0`).
    catch_up: usize,
}

impl Scheduler {
    /// Fills `draft` of the speculating DECODE rows with the draft model's proposals. A
    /// failed draft forward only costs this step's proposals.
    pub(super) fn run_draft(&mut self, model: &mut dyn Model, kv: &mut KvStore) {
        let ps = self.cfg.page_size;
        let mut budget = self.cfg.chunked_prefill_size.min(self.cfg.max_prefill_tokens).max(1);
        let ctx = self.cfg.context_length;
        // DECODE rows whose own next token has no page yet: proposals never take their pages.
        let needs_page = |r: &super::Req| r.decoding() && (r.kv_len + 1).div_ceil(ps) > r.page_table.len();
        let mut unserved = self.running.iter().filter(|r| needs_page(r)).count();
        let mut rows: Vec<Row> = Vec::new();
        for i in 0..self.running.len() {
            let r = &mut self.running[i];
            r.draft.clear();
            if !r.decoding() || r.spec.is_none() {
                continue;
            }
            let k = r.draft_room(ctx);
            let behind = r.tokens.len() - r.draft_kv_len.min(r.tokens.len());
            if k == 0 || budget == 0 {
                continue;
            }
            // A catch-up longer than the budget runs in chunks, proposing nothing meanwhile.
            let (k, upto) = if behind <= budget { (k, r.kv_len + k + 1) } else { (0, r.draft_kv_len + budget) };
            let need = upto.div_ceil(ps).saturating_sub(r.page_table.len());
            let others = unserved - needs_page(r) as usize;
            let covers_own = upto > r.kv_len;
            if need > 0 && !self.ensure_free(need + others) {
                continue;
            }
            if covers_own {
                // These pages cover the row's own next token too.
                unserved = others;
            }
            let r = &mut self.running[i];
            r.draft_kv_len = r.draft_kv_len.min(r.tokens.len());
            let catch_up = behind.min(budget);
            budget -= catch_up;
            let pages: Vec<u32> = (0..need).filter_map(|_| self.alloc.alloc()).collect();
            r.page_table.extend(pages);
            rows.push(Row { i, k, catch_up });
        }
        if rows.is_empty() {
            return;
        }
        let vocab = model.info().vocab_size;
        // Forward 1: catch up to the last sampled token; the rows that propose get logits.
        let first = self.draft_batch(&rows, ps, true);
        let Some(logits) = self.draft_forward(model, kv, &first) else { return };
        let mut li = 0;
        for (row, s) in rows.iter().zip(&first.seqs) {
            let r = &mut self.running[row.i];
            r.draft_kv_len += s.extend_len as usize;
            if s.num_logits == 1 {
                r.draft.push(argmax(&logits, vocab, li));
                li += 1;
            }
        }
        // Forwards 2..: feed the last proposal, take the next.
        loop {
            rows.retain(|row| {
                let r = &self.running[row.i];
                !r.draft.is_empty() && r.draft.len() < row.k
            });
            if rows.is_empty() {
                return;
            }
            let b = self.draft_batch(&rows, ps, false);
            let Some(logits) = self.draft_forward(model, kv, &b) else {
                // Keep what the earlier forwards proposed.
                return;
            };
            for (j, row) in rows.iter().enumerate() {
                let r = &mut self.running[row.i];
                r.draft_kv_len += 1;
                r.draft.push(argmax(&logits, vocab, j));
            }
        }
    }

    /// The draft forward of `rows`: with `catch_up`, each row's `catch_up` tokens from
    /// `draft_kv_len` (up to its last sampled token when it proposes); otherwise each row's
    /// last proposal. Logits for the rows that propose.
    fn draft_batch(&self, rows: &[Row], ps: usize, catch_up: bool) -> ForwardBatch {
        let mut b = ForwardBatch { kv_indptr: vec![0], ..Default::default() };
        for row in rows {
            let r = &self.running[row.i];
            let slot = |p: usize| r.page_table[p / ps] * ps as u32 + (p % ps) as u32;
            let (n, logits) = if catch_up { (row.catch_up, usize::from(row.k > 0)) } else { (1, 1) };
            b.push_seq(r.pool_idx, r.draft_kv_len, n, logits, slot, |p| r.token_at(p));
        }
        b
    }

    /// Runs the draft model on `b` after validating it; `None` (proposals dropped) on error.
    fn draft_forward(&mut self, model: &mut dyn Model, kv: &mut KvStore, b: &ForwardBatch) -> Option<Vec<f32>> {
        let ok = b.validate(kv.num_slots()).ok().and_then(|()| model.forward(b, kv).ok());
        if ok.is_none() {
            self.stats.spec_draft_failures += 1;
            for r in &mut self.running {
                r.draft.clear();
            }
        }
        ok
    }
}

/// Index of the largest value in row `row` of `[rows × vocab]` logits (the first on ties;
/// NaN never wins).
fn argmax(logits: &[f32], vocab: usize, row: usize) -> u32 {
    let r = &logits[row * vocab..(row + 1) * vocab];
    let mut best = 0;
    for (i, &v) in r.iter().enumerate() {
        if v > r[best] {
            best = i;
        }
    }
    best as u32
}
