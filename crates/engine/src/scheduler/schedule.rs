//! `schedule()`: the first half of a step. Retracts DECODE rows the pool cannot hold, gives each
//! running request its row (a DECODE token or the next prompt chunk within the prefill budget),
//! admits waiting requests in policy order after a radix-cache match, and builds the complete
//! [`ForwardBatch`] from the page tables (SGLang's `get_next_batch_to_run` /
//! `PrefillAdder`, nano-vllm's `schedule()`).

use std::cmp::Reverse;

use super::{Req, SchedulePolicy, Scheduler, MIN_NEW_TOKEN_RATIO, NEW_TOKEN_RATIO_DECAY};
use crate::batch::{ForwardBatch, ForwardMode};
use crate::request::{FinishReason, Output};

/// A scheduled batch: the [`ForwardBatch`] to run and, per row, which running request it
/// belongs to and how many tokens it computes. Hand it back to
/// [`Scheduler::postprocess`](super::Scheduler::postprocess) with the forward's result.
#[derive(Debug)]
pub struct Scheduled {
    /// The complete batch metadata.
    pub batch: ForwardBatch,
    /// `(index in running, new tokens)`, in batch order.
    pub(super) rows: Vec<(usize, usize)>,
}

impl Scheduler {
    /// Picks the next batch; `Started` outputs of newly admitted requests go to `out`. `None`
    /// when no row could be scheduled (after retracting the newest request when prompt chunks
    /// starved each other of pages).
    pub fn schedule(&mut self, out: &mut Vec<Output>) -> Option<Scheduled> {
        let ps = self.cfg.page_size;
        let budget_total = self.cfg.chunked_prefill_size.min(self.cfg.max_prefill_tokens).max(1);
        self.expire_queued(out);
        // 1. Every DECODE row needs one slot; retract the least urgent, newest requests until
        //    they all fit.
        loop {
            let need: usize =
                self.running.iter().filter(|r| r.tokens.len() - r.kv_len == 1).map(|r| self.pages_for(r, 1)).sum();
            if self.ensure_free(need) || self.running.len() <= 1 {
                break;
            }
            let victim = (0..self.running.len())
                .max_by_key(|&i| (Reverse(self.urgency(&self.running[i])), self.running[i].admitted_at))
                .unwrap_or(0);
            self.retract(victim);
            self.new_token_ratio = (self.new_token_ratio + 0.3).min(1.0);
        }
        if let Some(pc) = self.cfg.queue.priority.filter(|p| p.preemption) {
            self.preempt_for_waiting(budget_total, pc.preemption_threshold);
        }
        // 2. Rows of running requests: decode rows, then prompt chunks within the budget, the
        //    more urgent first. Under fair prefill, with requests waiting, long prompt chunks
        //    come last: after the admissions of step 3.
        let mut rows: Vec<(usize, usize)> = Vec::new(); // (index in running, new tokens)
        let mut budget = budget_total;
        let fair = self.cfg.queue.fair_prefill.filter(|_| !self.waiting.is_empty() && !self.cfg.whole_prompts);
        let long_t = fair.map(|f| match f.long_prefill_token_threshold {
            0 => budget_total,
            t => t,
        });
        let is_long = |r: &Req| long_t.is_some_and(|t| r.tokens.len() - r.kv_len > t);
        let mut order: Vec<usize> = (0..self.running.len()).collect();
        order.sort_by_key(|&i| {
            let r = &self.running[i];
            (r.tokens.len() - r.kv_len > 1, Reverse(self.urgency(r)), r.admitted_at)
        });
        let (later, now): (Vec<usize>, Vec<usize>) = order.into_iter().partition(|&i| is_long(&self.running[i]));
        let mut long_running = later.len();
        // Prompt-logprob rows this step may still return (see `PROMPT_LOGITS_BYTES`).
        let mut logit_rows_left = self.logit_row_budget;
        self.take_rows(&now, &mut budget, &mut logit_rows_left, &mut rows);
        // 3. Admit waiting requests.
        if self.cfg.policy == SchedulePolicy::Lpm && !self.cfg.disable_radix_cache && self.waiting.len() <= 128 {
            let mut w: Vec<Req> = self.waiting.drain(..).collect();
            let radix = &mut self.radix;
            let mut keyed: Vec<(usize, Req)> = w
                .drain(..)
                .map(|r| (radix.match_prefix(&r.tokens[..r.tokens.len() - 1], usize::MAX).pages.len(), r))
                .collect();
            keyed.sort_by_key(|(m, r)| (std::cmp::Reverse(*m), !r.started));
            self.waiting = keyed.into_iter().map(|(_, r)| r).collect();
        }
        if let Some(pc) = self.cfg.queue.priority {
            // Stable: within one priority the policy's order (and retracted requests first)
            // stands.
            self.waiting.make_contiguous().sort_by_key(|r| Reverse(pc.urgency(r.priority)));
        }
        // New admissions leave long prefills at least half the budget (see `FairPrefill`).
        let mut admit_budget = if later.is_empty() { budget } else { budget.min((budget_total / 2).max(1)) };
        let mut deferred = Vec::new();
        while admit_budget > 0 && self.running.len() < self.cfg.max_running_requests {
            let Some(mut r) = self.waiting.pop_front() else { break };
            if r.prompt_lp_pending() {
                // Gathered again from the start of whatever this admission computes.
                r.prompt_lp.clear();
            }
            // A cached prefix has no logits: prompt logprobs limit the match to the positions
            // before their first row, as SGLang limits it to `logprob_start_len`.
            let max_pages = (r.tokens.len() - 1).min(r.logits_from()) / ps;
            let m =
                if self.cfg.disable_radix_cache { None } else { Some(self.radix.match_prefix(&r.tokens, max_pages)) };
            let matched = m.as_ref().map_or(0, |m| m.pages.len());
            if let Some(m) = &m {
                self.radix.lock(m.node);
            }
            // The pages after the radix match that the file tier holds, read ahead since the
            // request was queued; it waits while they are still being read (unless nothing
            // else could run meanwhile).
            let mut tier_blocks: Vec<(u64, std::sync::Arc<Vec<u8>>)> = Vec::new();
            if let (Some(t), Some(mm)) = (self.tier.as_mut(), &m) {
                let hashes = t.continuation(self.radix.hash_of(mm.node), &r.tokens[matched * ps..max_pages * ps]);
                if !hashes.is_empty() {
                    let alone = self.running.is_empty() && rows.is_empty();
                    match t.take(&hashes, alone) {
                        Some(blocks) => tier_blocks = hashes.into_iter().zip(blocks).collect(),
                        None => {
                            self.radix.unlock(mm.node);
                            deferred.push(r);
                            continue;
                        }
                    }
                }
            }
            let loaded = tier_blocks.len();
            let prefix_tokens = (matched + loaded) * ps;
            let rem = r.tokens.len() - prefix_tokens;
            let long = long_t.is_some_and(|t| rem > t);
            if long && fair.is_some_and(|f| long_running >= f.max_long_partial_prefills.max(1)) {
                // Fair prefill: enough long prompts are prefilling; shorter ones behind it go
                // first.
                if let Some(m) = &m {
                    self.radix.unlock(m.node);
                }
                deferred.push(r);
                continue;
            }
            let n = r.cap_for_logits(prefix_tokens, rem.min(admit_budget), logit_rows_left);
            if self.cfg.whole_prompts && n < rem {
                // An encoder's prompt runs whole: it waits for a step with room for all of it.
                if let Some(m) = &m {
                    self.radix.unlock(m.node);
                }
                self.waiting.push_front(r);
                break;
            }
            if n == 0 {
                // This step's prompt-logprob rows are spent: this one waits for the next step,
                // the requests behind it that need none may still be admitted.
                if let Some(m) = &m {
                    self.radix.unlock(m.node);
                }
                deferred.push(r);
                continue;
            }
            let need_now = (prefix_tokens + n).div_ceil(ps) - matched - loaded;
            // Reserve room for the growth of everything running, as SGLang's admission does.
            let reserve = self.reserve_pages(&r, rem, n);
            let want = if self.running.is_empty() { need_now } else { need_now + reserve } + loaded;
            let fits = self.ensure_free(want) || (self.running.is_empty() && self.ensure_free(need_now + loaded));
            if !fits {
                if let Some(m) = &m {
                    self.radix.unlock(m.node);
                }
                self.waiting.push_front(r);
                break;
            }
            let Some(idx) = self.free_pool_idx.pop() else {
                if let Some(m) = &m {
                    self.radix.unlock(m.node);
                }
                self.waiting.push_front(r);
                break;
            };
            let m = match m {
                Some(mm) if loaded > 0 => Some(self.adopt_tier_pages(&r.tokens, mm, &tier_blocks)),
                m => m,
            };
            r.pool_idx = idx;
            if let Some(c) = m.as_ref().and_then(|m| m.state) {
                // A hybrid model's hit: the slot starts from the state saved there.
                self.pending_states.push(crate::kv::StateCopy::Restore { ckpt: c, slot: idx });
            }
            r.page_table = m.as_ref().map(|m| m.pages.clone()).unwrap_or_default();
            r.prefix_pages = matched + loaded;
            r.prefix_node = m.map(|m| m.node);
            r.kv_len = prefix_tokens;
            // A cached page holds the draft model's KV too (see `draft.rs`).
            r.draft_kv_len = prefix_tokens;
            self.clock += 1;
            r.admitted_at = self.clock;
            self.stats.radix_hit_tokens_total += prefix_tokens as u64;
            if r.cached_tokens.is_none() {
                r.cached_tokens = Some(prefix_tokens.min(r.prompt_len));
                r.storage_tokens = (loaded * ps).min(r.prompt_len);
                self.stats.prompt_tokens_total += r.prompt_len as u64;
                self.stats.cached_tokens_total += prefix_tokens.min(r.prompt_len) as u64;
            }
            let pages: Vec<u32> = (0..need_now).filter_map(|_| self.alloc.alloc()).collect();
            r.page_table.extend(pages);
            if !r.started {
                r.started = true;
                out.push(Output::Started {
                    id: r.id,
                    cached_tokens: r.cached_tokens.unwrap_or(0),
                    storage_cached_tokens: r.storage_tokens,
                });
            }
            budget -= n;
            admit_budget -= n;
            long_running += usize::from(long);
            if r.prompt_lp_pending() {
                logit_rows_left -= r.logits_rows(n);
            }
            self.running.push(r);
            rows.push((self.running.len() - 1, n));
        }
        // Deferred requests keep their place at the front of the queue.
        for r in deferred.into_iter().rev() {
            self.waiting.push_front(r);
        }
        // 4. Long prompt chunks take what is left.
        self.take_rows(&later, &mut budget, &mut logit_rows_left, &mut rows);
        if rows.is_empty() {
            if let Some(victim) = (0..self.running.len()).max_by_key(|&i| self.running[i].admitted_at) {
                // Prompt chunks starved each other of pages: retract the newest so the oldest
                // can finish (guaranteed to fit alone by the admission check).
                self.retract(victim);
            }
            return None;
        }
        rows.sort_by_key(|&(i, _)| i);
        let batch = self.build_batch(&rows);
        self.stats.steps += 1;
        match batch.mode() {
            ForwardMode::Extend => self.stats.extend_batches += 1,
            ForwardMode::Decode => self.stats.decode_batches += 1,
            ForwardMode::Mixed => self.stats.mixed_batches += 1,
        }
        self.new_token_ratio = (self.new_token_ratio - NEW_TOKEN_RATIO_DECAY).max(MIN_NEW_TOKEN_RATIO);
        Some(Scheduled { batch, rows })
    }

    /// Puts pages read from the file tier into the radix cache after the match `mm` (locked):
    /// fresh pages (made free by the caller) take the blocks, to be filled before the forward
    /// ([`Scheduler::sync_tier`]); returns the longer match, locked instead of `mm`.
    fn adopt_tier_pages(
        &mut self,
        tokens: &[u32],
        mm: crate::kv::radix::PrefixMatch,
        blocks: &[(u64, std::sync::Arc<Vec<u8>>)],
    ) -> crate::kv::radix::PrefixMatch {
        let ps = self.cfg.page_size;
        let fresh: Vec<u32> = blocks.iter().filter_map(|_| self.alloc.alloc()).collect();
        let mut pages = mm.pages.clone();
        pages.extend(&fresh);
        let n = pages.len();
        // The match stopped before these pages: they are new nodes, nothing comes back.
        for p in self.radix.insert(&tokens[..n * ps], &pages) {
            self.alloc.release(p);
        }
        let m2 = self.radix.match_prefix(tokens, n);
        self.radix.lock(m2.node);
        self.radix.unlock(mm.node);
        for (&page, (_, block)) in fresh.iter().zip(blocks) {
            self.pending_loads.push((page, block.clone()));
        }
        let hashes: Vec<u64> = blocks.iter().map(|b| b.0).collect();
        if let Some(t) = self.tier.as_mut() {
            t.consumed(&hashes);
        }
        self.stats.storage_hit_tokens_total += (fresh.len() * ps) as u64;
        m2
    }

    /// Adds the rows of running requests `order` (indices into `running`): a DECODE row each
    /// (with its proposals where pages allow), or the next prompt chunk within `budget` and
    /// the prompt-logprob rows `logit_rows_left`; a chunk without pages waits.
    fn take_rows(
        &mut self,
        order: &[usize],
        budget: &mut usize,
        logit_rows_left: &mut usize,
        rows: &mut Vec<(usize, usize)>,
    ) {
        for &i in order {
            let rem = self.running[i].tokens.len() - self.running[i].kv_len;
            let mut n = if rem == 1 {
                // A DECODE row: its last token and this step's proposals (a verify row).
                1 + self.running[i].propose(self.cfg.context_length)
            } else {
                self.running[i].cap_for_logits(self.running[i].kv_len, rem.min(*budget), *logit_rows_left)
            };
            if n == 0 {
                continue;
            }
            let mut need = self.pages_for(&self.running[i], n);
            if n > rem && !self.ensure_free(need) {
                // Proposals never retract anyone: without room they are dropped.
                self.running[i].draft.clear();
                n = 1;
                need = self.pages_for(&self.running[i], n);
            }
            if !self.ensure_free(need) {
                // Only a prompt chunk can end up here (decode rows were made to fit); it waits.
                continue;
            }
            if rem > 1 {
                *budget -= n;
                if self.running[i].prompt_lp_pending() {
                    *logit_rows_left -= self.running[i].logits_rows(n);
                }
            }
            rows.push((i, n));
            let pages: Vec<u32> = (0..need).filter_map(|_| self.alloc.alloc()).collect();
            self.running[i].page_table.extend(pages);
        }
    }

    /// Answers the requests that waited past `--queue-timeout` for their first admission.
    fn expire_queued(&mut self, out: &mut Vec<Output>) {
        let Some(limit) = self.cfg.queue.queue_timeout else { return };
        let now = std::time::Instant::now();
        let mut i = 0;
        while i < self.waiting.len() {
            let waited = now.duration_since(self.waiting[i].submitted);
            if self.waiting[i].started || waited <= limit {
                i += 1;
                continue;
            }
            let Some(r) = self.waiting.remove(i) else { break };
            self.stats.num_queue_timeouts += 1;
            let reason = FinishReason::Overloaded(format!(
                "the request waited {:.1} s in the queue, longer than the server's --queue-timeout of {} s; retry later",
                waited.as_secs_f64(),
                limit.as_secs_f64()
            ));
            out.push(Output::Finished { id: r.id, reason, usage: super::usage(&r) });
        }
    }

    /// Priority preemption (SGLang's `preempt_to_schedule`): while the most urgent waiting
    /// request could not be admitted (`max_running_requests` reached, or too few pages for its
    /// first chunk and the reservation admission makes), retract the least urgent running
    /// request whose urgency is lower by more than `threshold`.
    fn preempt_for_waiting(&mut self, budget_total: usize, threshold: i64) {
        let ps = self.cfg.page_size;
        for _ in 0..self.running.len() {
            let Some(best) = self.waiting.iter().max_by_key(|r| (self.urgency(r), Reverse(r.arrived))) else {
                return;
            };
            let u = self.urgency(best);
            let n = best.tokens.len().min(budget_total);
            let want = n.div_ceil(ps) + self.reserve_pages(best, best.tokens.len(), n);
            let blocked = self.running.len() >= self.cfg.max_running_requests
                || self.alloc.free_pages() + self.radix.evictable_pages() < want;
            if !blocked {
                return;
            }
            let victim = (0..self.running.len())
                .filter(|&i| u.saturating_sub(self.urgency(&self.running[i])) > threshold)
                .max_by_key(|&i| (Reverse(self.urgency(&self.running[i])), self.running[i].admitted_at));
            let Some(v) = victim else { return };
            // At the front: within its priority it keeps its place before later arrivals.
            self.retract(v);
            self.stats.num_preemptions += 1;
        }
    }

    /// Retracts running request `i`: its pages are released (full pages into the radix
    /// cache) and it goes back to the front of the queue, to be recomputed from its prompt and
    /// the output so far.
    fn retract(&mut self, i: usize) {
        let mut r = self.running.swap_remove(i);
        self.release(&mut r);
        self.stats.num_retractions += 1;
        self.waiting.push_front(r);
    }

    /// KV pages to reserve when admitting `r` with `n` of its `rem` uncomputed prompt tokens
    /// now: the future growth of everything running and of `r` itself, at the current
    /// `new_token_ratio` (SGLang's admission reservation).
    fn reserve_pages(&self, r: &Req, rem: usize, n: usize) -> usize {
        let future: f64 = self.running.iter().map(|q| (q.max_new - q.output_len()) as f64).sum::<f64>()
            + (rem - n + r.max_new - r.output_len()) as f64;
        (future * self.new_token_ratio / self.cfg.page_size as f64).ceil() as usize
    }

    /// The batch of `rows` (`(index in running, new tokens)`): ids, positions, `out_cache_loc`
    /// and every sequence's KV slot list from its page table (`req_to_token`).
    fn build_batch(&self, rows: &[(usize, usize)]) -> ForwardBatch {
        let ps = self.cfg.page_size;
        let mut b = ForwardBatch::default();
        b.kv_indptr.push(0);
        for &(i, n) in rows {
            let r = &self.running[i];
            let slot = |p: usize| r.page_table[p / ps] * ps as u32 + (p % ps) as u32;
            b.push_seq(r.pool_idx, r.kv_len, n, r.logits_rows(n), slot, |p| r.token_at(p));
        }
        b
    }
}
