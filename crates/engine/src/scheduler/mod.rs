//! The continuous-batching scheduler: admission, chunked prefill, mixed EXTEND/DECODE batches,
//! the paged KV cache with its radix prefix cache, and retraction.
//!
//! Semantics follow SGLang's `managers/scheduler.py` and `schedule_policy.py`, simplified to
//! one cycle ([`Scheduler::step`]: [`Scheduler::schedule`] -> validate -> forward ->
//! [`Scheduler::postprocess`], in `schedule.rs` and `postprocess.rs`):
//! 1. every running request contributes one row: a DECODE row (its last sampled token), or the
//!    next chunk of its prompt (chunked prefill) within the step's prefill budget
//!    (`min(chunked_prefill_size, max_prefill_tokens)` tokens);
//! 2. if the pool cannot give every DECODE row its next slot, the most recently admitted
//!    requests are retracted (pages released, recomputed later from prompt + output so far)
//!    until it can;
//! 3. waiting requests are admitted in policy order while the budget, `max_running_requests`
//!    and the pool allow, after matching their prompt against the radix cache (a full-prompt
//!    hit still computes the last prompt token, so logits always come from a forward pass);
//! 4. the [`ForwardBatch`] is built from the page tables, validated, and run; sequences whose
//!    last prompt token (or decode token) was computed sample one token each (none when
//!    `max_new_tokens` is 0, which only a prompt-logprobs request may ask for); prompt rows a
//!    request asked logprobs for are reduced to them as they are computed.
//!
//! A request's KV lives in its page table: pages `0 .. prefix_pages` are shared pages of the
//! radix cache (locked while the request runs), the rest are its own. Slot of position `p` is
//! `page_table[p / page_size] · page_size + p % page_size` — the `req_to_token` map.

use std::collections::VecDeque;

mod draft;
mod postprocess;
#[cfg(test)]
mod queue_tests;
mod schedule;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tier_tests;

pub use crate::config::{SchedulePolicy, SchedulerConfig};
pub use crate::request::{FinishReason, LogprobSpec, NewRequest, Output, TokenConstraint, TokenLogprob, TokenUsage};
pub use schedule::Scheduled;

use crate::batch::ForwardBatch;
use crate::kv::hicache::{DiskTier, WritePolicy};
use crate::kv::radix::RadixCache;
use crate::kv::{KvStore, PageAllocator};
use crate::model::Model;
use crate::sampler::SamplingParams;
use crate::spec::SpecState;
use crate::EngineError;

#[derive(Debug)]
struct Req {
    id: u64,
    tokens: Vec<u32>,
    prompt_len: usize,
    max_new: usize,
    sampling: SamplingParams,
    stop_ids: Vec<u32>,
    page_table: Vec<u32>,
    prefix_pages: usize,
    prefix_node: Option<usize>,
    kv_len: usize,
    pool_idx: u32,
    cached_tokens: Option<usize>,
    admitted_at: u64,
    started: bool,
    logprobs: LogprobSpec,
    /// Prompt logprobs gathered chunk by chunk until the prompt's end.
    prompt_lp: Vec<TokenLogprob>,
    /// The prompt logprobs went out: a recomputation after retraction does not repeat them.
    prompt_lp_done: bool,
    /// The grammar of its output; its state survives retraction (the output tokens it has
    /// consumed stay in `tokens`).
    constraint: Option<Box<dyn TokenConstraint>>,
    /// The grammar's mask for this step's sample, computed while the model ran (see
    /// [`Scheduler::step`]); `None` when postprocess computes it itself.
    mask: Option<Result<Vec<bool>, String>>,
    /// Speculative decoding state (none: this request does not speculate).
    spec: Option<SpecState>,
    /// Tokens proposed for positions `tokens.len() ..`, scored by this step's forward after
    /// the last sampled token; empty outside a step.
    draft: Vec<u32>,
    /// Positions whose KV the STANDALONE draft model has computed (in its own store, at the
    /// same slots as the target's).
    draft_kv_len: usize,
    /// An embedding request ([`NewRequest::embed`]).
    embed: bool,
    /// Its priority ([`NewRequest::priority`] or the configured default; 0 without priority
    /// scheduling).
    priority: i64,
    /// Arrival order (the scheduler's clock at `submit`).
    arrived: u64,
    /// Arrival time, for `--queue-timeout`.
    submitted: std::time::Instant,
    /// Of `cached_tokens`, the ones loaded from the file tier.
    storage_tokens: usize,
    /// A hybrid model's state saved where the prompt ended: `(position, checkpoint)`, given
    /// to the radix cache with the pages at release.
    prompt_state: Option<(usize, u32)>,
}

/// The grammar masks of rows that sample this step: `(index in running, constraint)` in,
/// the constraint back with its mask out.
type MaskJobs = Vec<(usize, Box<dyn TokenConstraint>)>;

impl Req {
    fn output_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// True while prompt logprobs are wanted and not yet sent.
    fn prompt_lp_pending(&self) -> bool {
        self.logprobs.prompt_start.is_some() && !self.prompt_lp_done
    }

    /// The first position whose logits row is wanted: the row predicting the first reported
    /// prompt token while prompt logprobs are pending, else the last token's (the one that
    /// samples).
    fn logits_from(&self) -> usize {
        match self.logprobs.prompt_start {
            Some(s) if !self.prompt_lp_done => s.clamp(1, self.prompt_len) - 1,
            _ => self.tokens.len() - 1,
        }
    }

    /// Logits rows of a chunk of `n` new tokens from `kv_len`.
    fn logits_rows(&self, n: usize) -> usize {
        (self.kv_len + n).saturating_sub(self.logits_from().max(self.kv_len))
    }

    /// Fills `draft` with this step's proposals for its DECODE row (NGRAM: from the request's
    /// n-gram index, extended with the tokens it gained; otherwise the proposals already in
    /// `draft`): at most the adaptive draft length,
    /// what the request may still emit after the step's own token, and what the context
    /// holds, so a verify row never writes past the context. Returns how many.
    fn propose(&mut self, context_length: usize) -> usize {
        let k = self.draft_room(context_length);
        let Some(s) = self.spec.as_mut() else {
            self.draft.clear();
            return 0;
        };
        match s.index.as_mut() {
            Some(idx) if k > 0 => {
                idx.extend(&self.tokens);
                self.draft = idx.propose(&self.tokens, k);
            }
            // Proposals made before the step (a draft model's), cut to what fits.
            _ => self.draft.truncate(k),
        }
        self.draft.len()
    }

    /// Proposals this step's DECODE row may carry: the adaptive draft length, cut to what the
    /// request may still emit after the step's own token and what the context holds.
    fn draft_room(&self, context_length: usize) -> usize {
        let room =
            self.max_new.saturating_sub(self.output_len() + 1).min(context_length.saturating_sub(self.tokens.len()));
        self.spec.as_ref().map_or(0, |s| s.wanted().min(room))
    }

    /// True while the request is decoding (its only uncomputed token is the last sampled one).
    fn decoding(&self) -> bool {
        self.kv_len > 0 && self.tokens.len() - self.kv_len == 1
    }

    /// The token at position `p` of this step's row: a sampled one, or a proposal after them.
    fn token_at(&self, p: usize) -> u32 {
        self.tokens.get(p).copied().unwrap_or_else(|| self.draft[p - self.tokens.len()])
    }

    /// The longest chunk of at most `n` tokens from `kv_len` whose prompt-logprob rows fit
    /// `left` (rows of the step's budget still free); requests without pending prompt logprobs
    /// are not limited. `kv_len` is a parameter so admission can ask before it commits.
    fn cap_for_logits(&self, kv_len: usize, n: usize, left: usize) -> usize {
        if !self.prompt_lp_pending() {
            return n;
        }
        let before = self.logits_from().saturating_sub(kv_len);
        n.min(before + left)
    }
}

/// Bytes of logits one step may hold for prompt logprobs: a step's rows are reduced to
/// logprobs as soon as the forward returns, so this bounds the engine's peak, not the prompt.
pub const PROMPT_LOGITS_BYTES: usize = 64 << 20;

/// Counters for `/metrics` and `/get_server_info`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SchedulerStats {
    /// Requests prefilling or decoding.
    pub num_running_reqs: usize,
    /// Requests waiting for admission.
    pub num_queue_reqs: usize,
    /// KV pages in use by requests or the cache.
    pub used_pages: usize,
    /// Usable KV pages.
    pub total_pages: usize,
    /// Free KV pages.
    pub free_pages: usize,
    /// Pages held by the radix cache and not locked.
    pub evictable_pages: usize,
    /// Retractions so far (preemptions included).
    pub num_retractions: u64,
    /// Of those, running requests retracted for a better-priority arrival.
    pub num_preemptions: u64,
    /// Requests answered `Overloaded` after waiting past `--queue-timeout`.
    pub num_queue_timeouts: u64,
    /// Requests answered `Overloaded` in the engine for a full queue under priority
    /// scheduling: waiting ones displaced by a more urgent arrival, and arrivals no more urgent
    /// than any waiting one.
    pub num_queue_full_aborts: u64,
    /// Hierarchical cache: prompt tokens loaded from the file tier at admissions
    /// (re-admissions after retraction included, as `radix_hit_tokens_total`).
    pub storage_hit_tokens_total: u64,
    /// Hierarchical cache: pages written to the file tier.
    pub storage_write_pages_total: u64,
    /// Hierarchical cache: pages loaded back from the file tier.
    pub storage_load_pages_total: u64,
    /// Hierarchical cache: blocks skipped (corrupt, truncated, another model or layout,
    /// unreadable) or not written (a full disk).
    pub storage_bad_blocks_total: u64,
    /// Hierarchical cache: bytes the file tier holds.
    pub storage_bytes: u64,
    /// Prompt tokens admitted so far.
    pub prompt_tokens_total: u64,
    /// Of those, served from the radix cache.
    pub cached_tokens_total: u64,
    /// Tokens generated so far.
    pub generation_tokens_total: u64,
    /// Steps run so far.
    pub steps: u64,
    /// Prompt chunks run that did not reach the end of their prompt (chunked prefill).
    pub num_prefill_chunks: u64,
    /// Tokens matched in the radix cache at every admission, re-admissions after retraction
    /// included (`cached_tokens_total` counts first admissions only, as usage reports do).
    pub radix_hit_tokens_total: u64,
    /// Speculative decoding: decode forwards of speculating requests (each a verify step).
    pub spec_verify_ct_total: u64,
    /// Speculative decoding: tokens proposed.
    pub spec_draft_tokens_total: u64,
    /// Speculative decoding: proposed tokens accepted.
    pub spec_accepted_tokens_total: u64,
    /// Speculative decoding: draft-model forwards that failed (their step ran without
    /// proposals).
    pub spec_draft_failures: u64,
    /// Speculative decoding: tokens a verify step emits on average,
    /// `1 + spec_accepted_tokens_total / spec_verify_ct_total` (SGLang's
    /// `avg_spec_accept_length`, which `bench_serving` prints as "Accept length"); 0 before any.
    pub avg_spec_accept_length: f64,
    /// Batches run by kind: only EXTEND rows, only DECODE rows, both.
    pub extend_batches: u64,
    /// See `extend_batches`.
    pub decode_batches: u64,
    /// See `extend_batches`.
    pub mixed_batches: u64,
}

/// The scheduler. Owns requests, the page allocator and the radix cache; the KV storage and
/// the model are passed to [`Scheduler::step`].
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    eos: Vec<u32>,
    alloc: PageAllocator,
    radix: RadixCache,
    waiting: VecDeque<Req>,
    running: Vec<Req>,
    free_pool_idx: Vec<u32>,
    clock: u64,
    new_token_ratio: f64,
    stats: SchedulerStats,
    last_batch: Option<ForwardBatch>,
    logit_row_budget: usize,
    /// The model's vocabulary (0 until [`Scheduler::set_vocab_size`]; grammar masks are then
    /// computed after the forward instead of beside it).
    vocab: usize,
    /// The hierarchical cache's file tier (`--enable-hierarchical-cache`).
    tier: Option<DiskTier>,
    /// Pages admitted from the file tier this step, to be filled before the forward.
    pending_loads: Vec<(u32, std::sync::Arc<Vec<u8>>)>,
    /// A hybrid model's state copies (saves for the radix cache, restores of prefix hits), in
    /// the order queued, done before the next forward ([`crate::kv::state`]).
    pending_states: Vec<crate::kv::StateCopy>,
}

/// Reservation ratio of future decode tokens at admission (SGLang's `new_token_ratio`):
/// starts high, decays each step, and jumps back after a retraction.
const INIT_NEW_TOKEN_RATIO: f64 = 0.7;
const MIN_NEW_TOKEN_RATIO: f64 = 0.1;
const NEW_TOKEN_RATIO_DECAY: f64 = 0.001;

impl Scheduler {
    /// A scheduler over `cfg.num_pages` pages; `eos` ends sequences unless `ignore_eos`.
    pub fn new(cfg: SchedulerConfig, eos: Option<u32>) -> Self {
        Self::with_eos_ids(cfg, eos.into_iter().collect())
    }

    /// [`Scheduler::new`] with several end-of-sequence ids (a model may have more than one:
    /// GLM-5 ends turns on three).
    pub fn with_eos_ids(cfg: SchedulerConfig, eos: Vec<u32>) -> Self {
        let alloc = PageAllocator::new(cfg.num_pages, cfg.page_size);
        let max_idx = cfg.max_running_requests as u32;
        Scheduler {
            radix: match cfg.state_checkpoints {
                0 => RadixCache::new(cfg.page_size),
                n => RadixCache::with_states(cfg.page_size, n),
            },
            alloc,
            eos,
            waiting: VecDeque::new(),
            running: Vec::new(),
            free_pool_idx: (0..max_idx).rev().collect(),
            clock: 0,
            new_token_ratio: INIT_NEW_TOKEN_RATIO,
            stats: SchedulerStats::default(),
            cfg,
            last_batch: None,
            logit_row_budget: 512,
            vocab: 0,
            tier: None,
            pending_loads: Vec::new(),
            pending_states: Vec::new(),
        }
    }

    /// Attaches the hierarchical cache's file tier: radix pages are written to it (as they
    /// are cached, or as they are evicted, by its policy) and a prompt's pages past its radix
    /// match are loaded from it at admission. Call before any request.
    pub fn attach_tier(&mut self, tier: DiskTier) {
        self.radix.attach_tier(tier.seed(), tier.policy() == WritePolicy::WriteThrough);
        self.tier = Some(tier);
    }

    /// Takes the file tier out (the engine thread keeps it across a scheduler rebuilt after a
    /// panic).
    pub fn take_tier(&mut self) -> Option<DiskTier> {
        self.pending_loads.clear();
        self.tier.take()
    }

    /// Writes every radix page the file tier does not hold, waits for the tier's queued writes
    /// and closes it (shutdown). Returns the pages written now.
    pub fn close_tier(&mut self, kv: &mut KvStore) -> usize {
        self.sync_tier(kv);
        let Some(mut t) = self.tier.take() else { return 0 };
        // Dropping the tier joins its I/O thread after the queued writes.
        write_spills(&mut t, kv, self.cfg.page_size, self.radix.all_spills())
    }

    /// Moves KV between the pool and the file tier: writes the pages the radix cache recorded
    /// (their KV is intact until the next forward), then fills the pages admitted from the tier.
    /// [`Scheduler::step`] calls it before each forward; the engine thread calls it before it
    /// goes idle, so a finished request's pages reach the tier without waiting for traffic.
    pub fn sync_tier(&mut self, kv: &mut KvStore) {
        let Some(t) = self.tier.as_mut() else { return };
        t.poll(false);
        let ps = self.cfg.page_size;
        write_spills(t, kv, ps, self.radix.take_spills());
        for (page, block) in self.pending_loads.drain(..) {
            // The length was checked when the block was read; a mismatch cannot happen, and
            // would leave the page's old KV, which the check below reports.
            if let Err(e) = kv.write_slots(page as usize * ps, ps, &block) {
                debug_assert!(false, "{e}");
            }
        }
    }

    /// Sizes the per-step budget of prompt-logprob rows for a vocabulary of `vocab` tokens
    /// ([`PROMPT_LOGITS_BYTES`] of f32 logits, at least one row).
    pub fn set_vocab_size(&mut self, vocab: usize) {
        self.logit_row_budget = (PROMPT_LOGITS_BYTES / 4 / vocab.max(1)).max(1);
        self.vocab = vocab;
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// Slots the KV storage must have.
    pub fn num_slots(&self) -> usize {
        self.alloc.num_slots()
    }

    /// True when nothing is running or waiting.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Free pages now.
    pub fn free_pages(&self) -> usize {
        self.alloc.free_pages()
    }

    /// Request slots not held by a running request: a hybrid model's state pool has one state
    /// per slot, so all `max_running_requests` of them free means the pool is empty.
    pub fn free_request_slots(&self) -> usize {
        self.free_pool_idx.len()
    }

    /// A hybrid model's saved states in use (held by the radix cache or reserved by a running
    /// request); 0 after a flush with nothing running.
    pub fn saved_states(&self) -> usize {
        self.cfg.state_checkpoints - self.radix.states_free()
    }

    /// Pages held by the radix cache.
    pub fn cached_pages(&self) -> usize {
        self.radix.total_pages()
    }

    /// The last batch run (for tests).
    pub fn last_batch(&self) -> Option<&ForwardBatch> {
        self.last_batch.as_ref()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SchedulerStats {
        let mut s = self.stats.clone();
        s.num_running_reqs = self.running.len();
        s.num_queue_reqs = self.waiting.len();
        s.total_pages = self.alloc.num_pages();
        s.free_pages = self.alloc.free_pages();
        s.used_pages = s.total_pages - s.free_pages;
        s.evictable_pages = self.radix.evictable_pages();
        if let Some(t) = &self.tier {
            s.storage_write_pages_total = t.stats.writes;
            s.storage_load_pages_total = t.stats.loads;
            s.storage_bad_blocks_total = t.stats.bad;
            s.storage_bytes = t.stats.bytes;
        }
        if s.spec_verify_ct_total > 0 {
            s.avg_spec_accept_length = 1.0 + s.spec_accepted_tokens_total as f64 / s.spec_verify_ct_total as f64;
        }
        s
    }

    /// Checks a request against limits that no amount of waiting can change.
    ///
    /// # Errors
    /// [`EngineError::InvalidRequest`] naming the limit.
    pub fn admission_check(&self, prompt_len: usize, max_new_tokens: usize) -> Result<(), EngineError> {
        self.cfg.admission_check(prompt_len, max_new_tokens)
    }

    /// Queues a request.
    ///
    /// # Errors
    /// As [`Scheduler::admission_check`], or a duplicate id.
    pub fn submit(&mut self, r: NewRequest) -> Result<(), EngineError> {
        if r.embed {
            self.cfg.embed_check(r.input_ids.len())?;
        } else {
            // A prompt-logprobs request may generate nothing (`echo` with `max_tokens: 0`).
            let checked = if r.logprobs.prompt_start.is_some() { r.max_new_tokens.max(1) } else { r.max_new_tokens };
            self.admission_check(r.input_ids.len(), checked)?;
        }
        if self.waiting.iter().chain(&self.running).any(|q| q.id == r.id) {
            return Err(EngineError::InvalidRequest(format!("duplicate request id {}", r.id)));
        }
        let mut stop_ids = r.stop_token_ids;
        if !r.ignore_eos {
            for &e in &self.eos {
                if !stop_ids.contains(&e) {
                    stop_ids.push(e);
                }
            }
        }
        self.clock += 1;
        if let Some(t) = self.tier.as_mut() {
            // Start reading the prompt's pages past its radix match now, so they are in
            // memory by the step that admits it.
            let ps = self.cfg.page_size;
            let last = r.input_ids.len().saturating_sub(1);
            let m = self.radix.match_prefix(&r.input_ids[..last], usize::MAX);
            let from = (m.pages.len() * ps).min(last);
            let hashes = t.continuation(self.radix.hash_of(m.node), &r.input_ids[from..last]);
            t.prefetch(&hashes);
        }
        // A grammar decides each next token from the one before: its rows do not speculate.
        let spec = self.cfg.spec.as_ref().filter(|_| r.constraint.is_none() && !r.embed).map(SpecState::new);
        self.waiting.push_back(Req {
            id: r.id,
            prompt_len: r.input_ids.len(),
            tokens: r.input_ids,
            max_new: if r.embed { 0 } else { r.max_new_tokens },
            sampling: r.sampling,
            stop_ids,
            page_table: Vec::new(),
            prefix_pages: 0,
            prefix_node: None,
            kv_len: 0,
            pool_idx: 0,
            cached_tokens: None,
            admitted_at: 0,
            started: false,
            logprobs: r.logprobs,
            prompt_lp: Vec::new(),
            prompt_lp_done: false,
            constraint: r.constraint,
            mask: None,
            spec,
            draft: Vec::new(),
            draft_kv_len: 0,
            embed: r.embed,
            priority: self.cfg.queue.priority.map_or(0, |p| r.priority.unwrap_or(p.default_priority)),
            arrived: self.clock,
            submitted: std::time::Instant::now(),
            storage_tokens: 0,
            prompt_state: None,
        });
        Ok(())
    }

    /// Queues a request that arrived past a full queue under priority scheduling: the least
    /// urgent waiting request not yet admitted (the newest among equals) is answered
    /// [`FinishReason::Overloaded`] when it is less urgent than `r`, and `r` is queued; the
    /// displaced request's `Finished` output is returned.
    ///
    /// # Errors
    /// [`EngineError::QueueFull`] when no waiting request is less urgent (or priority
    /// scheduling is off); else as [`Scheduler::submit`].
    pub fn submit_over_limit(&mut self, r: NewRequest) -> Result<Output, EngineError> {
        let waiting = self.waiting.iter().filter(|q| !q.started).count();
        let full = EngineError::QueueFull { waiting, max: self.cfg.queue.max_queued_requests.unwrap_or(waiting) };
        self.stats.num_queue_full_aborts += 1;
        let Some(pc) = self.cfg.queue.priority else { return Err(full) };
        let urgency = pc.urgency(r.priority.unwrap_or(pc.default_priority));
        let victim = (0..self.waiting.len())
            .filter(|&i| !self.waiting[i].started)
            .min_by_key(|&i| (self.urgency(&self.waiting[i]), std::cmp::Reverse(self.waiting[i].arrived)))
            .filter(|&i| self.urgency(&self.waiting[i]) < urgency);
        let Some(i) = victim else { return Err(full) };
        self.submit(r)?;
        let Some(q) = self.waiting.remove(i) else { return Err(full) };
        let reason = FinishReason::Overloaded(
            "the request queue is full and a more urgent request took this one's place; retry later".into(),
        );
        Ok(Output::Finished { id: q.id, reason, usage: usage(&q) })
    }

    /// Ends a request wherever it is; its pages go back at once. Unknown ids are ignored (the
    /// request may have finished already). Returns the `Finished` output if it was live.
    pub fn abort(&mut self, id: u64) -> Option<Output> {
        if let Some(i) = self.waiting.iter().position(|r| r.id == id) {
            let r = self.waiting.remove(i)?;
            return Some(Output::Finished { id, reason: FinishReason::Abort, usage: usage(&r) });
        }
        let i = self.running.iter().position(|r| r.id == id)?;
        let mut r = self.running.swap_remove(i);
        self.release(&mut r);
        Some(Output::Finished { id, reason: FinishReason::Abort, usage: usage(&r) })
    }

    /// Drops every unlocked page of the radix cache (`/flush_cache`). Returns pages freed.
    pub fn flush_cache(&mut self) -> usize {
        self.radix.flush(&mut self.alloc)
    }

    /// Checks page accounting: every page is free, in the cache, or owned by exactly one
    /// running request.
    ///
    /// # Errors
    /// A description of the mismatch.
    pub fn check_pages(&self) -> Result<(), String> {
        self.radix.check()?;
        let owned: usize = self.running.iter().map(|r| r.page_table.len() - r.prefix_pages).sum();
        let total = self.alloc.free_pages() + self.radix.total_pages() + owned;
        if total != self.alloc.num_pages() {
            return Err(format!(
                "{} free + {} cached + {owned} owned != {} pages",
                self.alloc.free_pages(),
                self.radix.total_pages(),
                self.alloc.num_pages()
            ));
        }
        Ok(())
    }

    /// Gives the pages of `r` back: full pages of computed tokens go to the radix cache (when
    /// on), the rest to the allocator; the prefix lock is released.
    fn release(&mut self, r: &mut Req) {
        let ps = self.cfg.page_size;
        let mut to_free: Vec<u32> = Vec::new();
        // Pages 0..prefix_pages belong to the radix cache: they are never freed here.
        let own_from = if self.cfg.disable_radix_cache {
            r.prefix_pages
        } else {
            let full = r.kv_len / ps;
            to_free.extend(self.radix.insert(&r.tokens[..full * ps], &r.page_table[..full]));
            self.save_states(r);
            full.max(r.prefix_pages)
        };
        if let Some((_, c)) = r.prompt_state.take() {
            self.radix.release_state(c);
        }
        to_free.extend(r.page_table.drain(own_from.min(r.page_table.len())..));
        r.page_table.clear();
        if let Some(node) = r.prefix_node.take() {
            self.radix.unlock(node);
        }
        for p in to_free {
            self.alloc.release(p);
        }
        r.prefix_pages = 0;
        r.kv_len = 0;
        r.draft_kv_len = 0;
        r.draft.clear();
        self.free_pool_idx.push(r.pool_idx);
    }

    /// A hybrid model's states of `r` at release, after its pages went to the radix cache: the
    /// one saved where its prompt ended, and its state now when it ends on a page boundary,
    /// each attached to the node ending there (its save queued before the next forward, while
    /// the slot still holds it).
    fn save_states(&mut self, r: &mut Req) {
        if self.cfg.state_checkpoints == 0 {
            return;
        }
        if let Some((pos, c)) = r.prompt_state.take() {
            if pos > r.kv_len || !self.radix.attach_state(&r.tokens[..pos], c) {
                self.radix.release_state(c);
            }
        }
        let end = r.kv_len;
        if end == 0 || !end.is_multiple_of(self.cfg.page_size) || self.radix.has_state(&r.tokens[..end]) {
            return;
        }
        if let Some(c) = self.radix.reserve_state() {
            if self.radix.attach_state(&r.tokens[..end], c) {
                self.pending_states.push(crate::kv::StateCopy::Save { slot: r.pool_idx, ckpt: c });
            } else {
                self.radix.release_state(c);
            }
        }
    }

    /// How urgent `r` is under priority scheduling (higher first; all equal when it is off).
    fn urgency(&self, r: &Req) -> i64 {
        self.cfg.queue.priority.map_or(0, |p| p.urgency(r.priority))
    }

    /// Makes `need` pages free, evicting from the radix cache if needed.
    fn ensure_free(&mut self, need: usize) -> bool {
        if self.alloc.free_pages() < need {
            self.radix.evict(need, &mut self.alloc);
        }
        self.alloc.free_pages() >= need
    }

    /// Pages `r` still needs for `new_tokens` more positions (a draft model's pages may
    /// already cover them).
    fn pages_for(&self, r: &Req, new_tokens: usize) -> usize {
        (r.kv_len + new_tokens).div_ceil(self.cfg.page_size).saturating_sub(r.page_table.len())
    }

    /// One engine cycle: [`schedule`](Scheduler::schedule) the next batch, validate it, run the
    /// model, [`postprocess`](Scheduler::postprocess) the logits. Returns the outputs; empty
    /// when there was nothing to do.
    ///
    /// Never fails for a request's sake: a batch that fails validation or a model error fails
    /// the batch's requests (reported as `Finished { Error }`), and the scheduler stays usable.
    pub fn step(&mut self, model: &mut dyn Model, kv: &mut KvStore) -> Vec<Output> {
        self.step_with_draft(model, kv, None)
    }

    /// [`Scheduler::step`] with a STANDALONE draft model and its KV store (the same slots as
    /// `kv`): the draft proposes tokens for the DECODE rows first (`draft.rs`), the step
    /// verifies them.
    pub fn step_with_draft(
        &mut self,
        model: &mut dyn Model,
        kv: &mut KvStore,
        draft: Option<(&mut dyn Model, &mut KvStore)>,
    ) -> Vec<Output> {
        let mut out = Vec::new();
        if let Some((dm, dkv)) = draft {
            self.run_draft(dm, dkv);
        }
        let Some(sched) = self.schedule(&mut out) else { return out };
        self.sync_tier(kv);
        let copies = std::mem::take(&mut self.pending_states);
        let forward = |model: &mut dyn Model, kv: &mut KvStore| {
            kv.states_mut()
                .map_or(Ok(()), |st| st.apply(&copies))
                .map_err(|e| crate::batch::BatchError(format!("state pool: {e}")))
                .and_then(|()| sched.batch.validate(kv.num_slots()))
                .and_then(|()| kv.states().map_or(Ok(()), |st| sched.batch.validate_states(st.slots())))
                .map_err(|e| EngineError::Internal(e.to_string()))
                .and_then(|()| model.forward(&sched.batch, kv))
        };
        let jobs = self.mask_jobs(&sched);
        let logits = if jobs.is_empty() {
            forward(model, kv)
        } else {
            // Structured output: the grammar masks of the rows that sample this step are
            // computed on a helper thread while the model runs; rows without a grammar never
            // wait for them, and the mask cost hides behind the forward.
            let vocab = self.vocab;
            let rows: Vec<usize> = jobs.iter().map(|j| j.0).collect();
            let (logits, done) = std::thread::scope(|sc| {
                let h = sc.spawn(move || {
                    jobs.into_iter()
                        .map(|(i, mut c)| {
                            let m = grammar_mask(c.as_mut(), vocab);
                            (i, c, m)
                        })
                        .collect::<Vec<_>>()
                });
                let logits = forward(model, kv);
                (logits, h.join())
            });
            match done {
                Ok(done) => {
                    for (i, c, m) in done {
                        self.running[i].constraint = Some(c);
                        self.running[i].mask = Some(m);
                    }
                }
                Err(_) => {
                    // A grammar panicked: its requests fail (their constraints are gone), no
                    // row goes on unconstrained.
                    for i in rows {
                        self.running[i].mask = Some(Err("the grammar panicked".into()));
                    }
                }
            }
            logits
        };
        self.postprocess(sched, logits, &mut out);
        out
    }

    /// Takes out the grammars of the rows that sample after this forward (a final prompt chunk
    /// or a decode, with tokens left to generate).
    fn mask_jobs(&mut self, sched: &Scheduled) -> MaskJobs {
        if self.vocab == 0 {
            return Vec::new();
        }
        let mut jobs = Vec::new();
        for &(i, n) in &sched.rows {
            let r = &mut self.running[i];
            if r.kv_len + n >= r.tokens.len() && r.output_len() < r.max_new {
                if let Some(c) = r.constraint.take() {
                    jobs.push((i, c));
                }
            }
        }
        jobs
    }
}

/// Queues the write of each spilled page the tier does not hold yet (its KV copied out of
/// `kv` now, before a forward can overwrite the page). Returns how many.
fn write_spills(t: &mut DiskTier, kv: &KvStore, ps: usize, spills: Vec<crate::kv::radix::Spill>) -> usize {
    let mut n = 0;
    for s in spills {
        if t.contains(s.hash) {
            continue;
        }
        let mut block = Vec::with_capacity(ps * kv.layout().bytes_per_token());
        kv.read_slots(s.page as usize * ps, ps, &mut block);
        t.write(s.hash, s.parent, &s.tokens, block);
        n += 1;
    }
    n
}

/// The tokens `c` allows next, over a vocabulary of `vocab`.
fn grammar_mask(c: &mut dyn TokenConstraint, vocab: usize) -> Result<Vec<bool>, String> {
    let mut allowed = vec![false; vocab];
    c.allowed(&mut allowed).map(|()| allowed)
}

/// Token counts of `r` so far.
fn usage(r: &Req) -> TokenUsage {
    TokenUsage {
        prompt_tokens: r.prompt_len,
        completion_tokens: r.output_len(),
        cached_tokens: r.cached_tokens.unwrap_or(0),
        storage_cached_tokens: r.storage_tokens,
        spec: r.spec.as_ref().map(|s| s.counts).unwrap_or_default(),
    }
}
