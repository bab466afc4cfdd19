//! Unit tests of the scheduler's cycle with the shared fake model: chunked prefill, the radix
//! cache, retraction and page accounting, each checked against the recurrence computed directly.

use super::*;
use crate::testing::{FakeModel, Predict};

fn cfg(num_pages: usize, chunk: usize) -> SchedulerConfig {
    SchedulerConfig {
        num_pages,
        page_size: 1,
        max_running_requests: 8,
        chunked_prefill_size: chunk,
        max_prefill_tokens: 4096,
        context_length: 4096,
        disable_radix_cache: false,
        policy: SchedulePolicy::Fcfs,
    }
}

fn req(id: u64, prompt: Vec<u32>, max_new: usize) -> NewRequest {
    NewRequest {
        id,
        input_ids: prompt,
        max_new_tokens: max_new,
        sampling: SamplingParams { temperature: 0.0, ..Default::default() },
        stop_token_ids: vec![],
        ignore_eos: true,
        logprobs: Default::default(),
        constraint: None,
    }
}

/// Runs until idle; returns each request's tokens and finish reason, and the steps taken.
fn drain(s: &mut Scheduler, m: &mut FakeModel, kv: &mut KvStore) -> (Vec<(u64, Vec<u32>, FinishReason)>, usize) {
    let mut toks: std::collections::BTreeMap<u64, Vec<u32>> = Default::default();
    let mut done = Vec::new();
    let mut steps = 0;
    while !s.is_idle() {
        steps += 1;
        assert!(steps < 10_000, "no progress");
        for o in s.step(m, kv) {
            match o {
                Output::Token { id, token, .. } => toks.entry(id).or_default().push(token),
                Output::Finished { id, reason, .. } => done.push((id, toks.remove(&id).unwrap_or_default(), reason)),
                _ => {}
            }
        }
    }
    done.sort_by_key(|d| d.0);
    (done, steps)
}

#[test]
fn a_prompt_is_prefilled_in_chunks_of_the_budget_then_decoded() {
    let mut m = FakeModel::new(37, 4096, Predict::Recurrence);
    let mut kv = KvStore::new(m.attention_needs().kv_layout, 200);
    let mut s = Scheduler::new(cfg(200, 16), None);
    let prompt: Vec<u32> = (0..50).map(|i| i % 37).collect();
    s.submit(req(1, prompt.clone(), 5)).expect("admissible");
    let (done, steps) = drain(&mut s, &mut m, &mut kv);
    let (want, _) = m.reference(&prompt, 5, None, 4096);
    assert_eq!(done, vec![(1, want, FinishReason::Length)]);
    // 50 tokens in chunks of 16: 4 EXTEND steps (3 non-final chunks), then 4 DECODE steps.
    assert_eq!(steps, 8);
    assert_eq!(s.stats().num_prefill_chunks, 3);
    assert_eq!(s.stats().generation_tokens_total, 5);
    s.check_pages().expect("pages accounted for");
}

#[test]
fn a_repeated_prompt_is_served_from_the_radix_cache_with_the_same_output() {
    let mut m = FakeModel::new(37, 4096, Predict::Recurrence);
    let mut kv = KvStore::new(m.attention_needs().kv_layout, 200);
    let mut s = Scheduler::new(cfg(200, 512), None);
    let prompt: Vec<u32> = (0..30).map(|i| (i * 7) % 37).collect();
    s.submit(req(1, prompt.clone(), 4)).expect("admissible");
    let first = drain(&mut s, &mut m, &mut kv).0;
    s.submit(req(2, prompt.clone(), 4)).expect("admissible");
    let second = drain(&mut s, &mut m, &mut kv).0;
    assert_eq!(first[0].1, second[0].1);
    // The whole prompt but its last token comes from the cache (logits need one computed row).
    assert_eq!(s.stats().cached_tokens_total, 29);
    s.check_pages().expect("pages accounted for");
}

#[test]
fn a_pool_too_small_for_every_decode_row_retracts_and_still_gives_exact_outputs() {
    let mut m = FakeModel::new(37, 4096, Predict::Recurrence);
    let mut kv = KvStore::new(m.attention_needs().kv_layout, 64);
    let mut s = Scheduler::new(SchedulerConfig { disable_radix_cache: true, ..cfg(60, 512) }, None);
    let prompts: Vec<Vec<u32>> = (0..4).map(|r| (0..10).map(|i| (i + r * 3) % 37).collect()).collect();
    for (i, p) in prompts.iter().enumerate() {
        s.submit(req(i as u64, p.clone(), 12)).expect("admissible");
    }
    let (done, _) = drain(&mut s, &mut m, &mut kv);
    for (i, p) in prompts.iter().enumerate() {
        assert_eq!(done[i], (i as u64, m.reference(p, 12, None, 4096).0, FinishReason::Length));
    }
    assert!(s.stats().num_retractions > 0, "4 × 22 tokens cannot all fit in 60 pages");
    assert_eq!(s.free_pages(), 60, "every page is back once idle");
}

#[test]
fn a_failed_forward_fails_only_that_batch() {
    let mut m = FakeModel::new(37, 4096, Predict::Recurrence);
    let mut kv = KvStore::new(m.attention_needs().kv_layout, 100);
    let mut s = Scheduler::new(cfg(100, 512), None);
    s.submit(req(1, vec![1, 2, 3], 2)).expect("admissible");
    let mut out = Vec::new();
    let sched = s.schedule(&mut out).expect("a batch");
    s.postprocess(sched, Err(EngineError::Internal("boom".into())), &mut out);
    assert!(
        matches!(&out[..], [Output::Started { id: 1, .. }, Output::Finished { id: 1, reason: FinishReason::Error(m), .. }] if m.contains("boom")),
        "{out:?}"
    );
    assert!(s.is_idle());
    s.submit(req(2, vec![1, 2, 3], 2)).expect("admissible");
    let (done, _) = drain(&mut s, &mut m, &mut kv);
    assert_eq!(done, vec![(2, m.reference(&[1, 2, 3], 2, None, 4096).0, FinishReason::Length)]);
    s.check_pages().expect("pages accounted for");
}

/// Every output of a run until idle, in order.
fn drain_all(s: &mut Scheduler, m: &mut FakeModel, kv: &mut KvStore) -> Vec<Output> {
    let mut all = Vec::new();
    for _ in 0..10_000 {
        if s.is_idle() {
            return all;
        }
        all.extend(s.step(m, kv));
    }
    panic!("no progress");
}

/// Prompt logprobs gathered over chunks of 16 with a budget of 3 logits rows per step, from a
/// radix-cached prompt, and with `max_new_tokens: 0`; the fake model's logits are one-hot at
/// the recurrence's prediction, so each value is `1 − lse` where the prompt follows the
/// prediction and `−lse` elsewhere, `lse = ln(e + V − 1)`.
#[test]
fn prompt_logprobs_survive_chunks_the_row_budget_and_the_radix_cache() {
    const V: usize = 37;
    let mut m = FakeModel::new(V, 4096, Predict::Recurrence);
    let mut kv = KvStore::new(m.attention_needs().kv_layout, 400);
    let mut s = Scheduler::new(cfg(400, 16), None);
    s.set_vocab_size(PROMPT_LOGITS_BYTES / 4 / 3);
    // 20 arbitrary tokens, then 30 the model predicts itself.
    let head: Vec<u32> = (0..20).map(|i| (i * 11 + 5) % V as u32).collect();
    let prompt = [head.clone(), m.reference(&head, 30, None, 4096).0].concat();
    let predicted: Vec<u32> =
        (1..=prompt.len()).map(|p| *m.reference(&prompt[..p], 1, None, 4096).0.first().unwrap_or(&0)).collect();
    let lse = (1f64.exp() + (V - 1) as f64).ln();
    let spec = LogprobSpec { output: true, prompt_start: Some(0), top_n: 2, token_ids: vec![3] };
    s.submit(NewRequest { logprobs: spec.clone(), ..req(1, prompt.clone(), 3) }).expect("admissible");
    let outs = drain_all(&mut s, &mut m, &mut kv);
    let Some(Output::PromptLogprobs { start: 0, entries, .. }) =
        outs.iter().find(|o| matches!(o, Output::PromptLogprobs { .. }))
    else {
        panic!("no prompt logprobs in {outs:?}")
    };
    assert_eq!(entries.len(), prompt.len());
    assert_eq!((entries[0].token, entries[0].logprob), (prompt[0], None));
    for p in 1..prompt.len() {
        let e = &entries[p];
        let hit = prompt[p] == predicted[p - 1];
        let want = if hit { 1.0 - lse } else { -lse };
        assert_eq!(e.token, prompt[p]);
        assert!((e.logprob.unwrap_or(0.0) as f64 - want).abs() < 1e-5, "position {p}");
        assert_eq!(e.rank, if hit { 1 } else { 2 }, "position {p}");
        assert_eq!(e.top[0], (predicted[p - 1], (1.0 - lse) as f32), "position {p}");
        assert_eq!(e.ids.len(), 1);
    }
    assert!(entries[20..].iter().all(|e| e.rank == 1) && entries[1..20].iter().any(|e| e.rank == 2));
    let toks: Vec<&Output> = outs.iter().filter(|o| matches!(o, Output::Token { .. })).collect();
    assert_eq!(toks.len(), 3);
    for o in toks {
        let Output::Token { logprob: Some(lp), .. } = o else { panic!("no output logprob: {o:?}") };
        assert_eq!(lp.rank, 1);
        assert!((lp.logprob.unwrap_or(0.0) as f64 - (1.0 - lse)).abs() < 1e-5);
    }
    // The 4 steps of 16-token chunks became at least 50 / 3 steps under the row budget.
    assert!(s.stats().steps >= 17, "{}", s.stats().steps);

    // Again from the radix cache, from position 30, generating nothing.
    let spec30 = LogprobSpec { prompt_start: Some(30), output: false, ..spec };
    s.submit(NewRequest { logprobs: spec30, ..req(2, prompt.clone(), 0) }).expect("admissible");
    let again = drain_all(&mut s, &mut m, &mut kv);
    let Some(Output::PromptLogprobs { start: 30, entries: e30, .. }) =
        again.iter().find(|o| matches!(o, Output::PromptLogprobs { .. }))
    else {
        panic!("no prompt logprobs in {again:?}")
    };
    assert_eq!(e30[..], entries[30..]);
    assert!(!again.iter().any(|o| matches!(o, Output::Token { .. })));
    let Some(Output::Finished { reason: FinishReason::Length, usage, .. }) = again.last() else { panic!("{again:?}") };
    assert_eq!((usage.completion_tokens, usage.cached_tokens), (0, 29), "the match stops before row 29");
    assert!(matches!(again.first(), Some(Output::Started { .. })));
    s.check_pages().expect("pages accounted for");
}

/// A prompt-logprobs request that finds the step's logits rows spent waits, and the requests
/// behind it that need none are admitted in the same step.
#[test]
fn a_request_waiting_for_logits_rows_does_not_block_admission() {
    let mut m = FakeModel::new(37, 4096, Predict::Recurrence);
    let mut kv = KvStore::new(m.attention_needs().kv_layout, 400);
    let mut s = Scheduler::new(cfg(400, 64), None);
    s.set_vocab_size(PROMPT_LOGITS_BYTES / 4 / 3);
    let spec = LogprobSpec { prompt_start: Some(0), ..Default::default() };
    let prompt: Vec<u32> = (0..20).collect();
    s.submit(NewRequest { logprobs: spec.clone(), ..req(1, prompt.clone(), 2) }).expect("admissible");
    s.submit(NewRequest { logprobs: spec, ..req(2, prompt.clone(), 2) }).expect("admissible");
    s.submit(req(3, prompt.clone(), 2)).expect("admissible");
    let first = s.step(&mut m, &mut kv);
    let started: Vec<u64> =
        first.iter().filter_map(|o| if let Output::Started { id, .. } = o { Some(*id) } else { None }).collect();
    assert_eq!(started, vec![1, 3]);
    let rest = drain_all(&mut s, &mut m, &mut kv);
    let prompts = rest.iter().filter(|o| matches!(o, Output::PromptLogprobs { .. })).count();
    assert_eq!(prompts, 2);
    s.check_pages().expect("pages accounted for");
}

/// A grammar that spells a fixed token sequence and is then complete.
#[derive(Debug)]
struct Spell(Vec<u32>, usize);

impl TokenConstraint for Spell {
    fn allowed(&mut self, allowed: &mut [bool]) -> Result<(), String> {
        let t = *self.0.get(self.1).ok_or("past the end")?;
        allowed[t as usize] = true;
        Ok(())
    }
    fn advance(&mut self, token: u32) -> Result<bool, String> {
        if self.0.get(self.1) != Some(&token) {
            return Err(format!("token {token} not allowed"));
        }
        self.1 += 1;
        Ok(self.1 == self.0.len())
    }
}

/// The mask decides over the model's own choice, greedy and sampled; a complete grammar ends
/// the request; rows without a grammar in the same batch are untouched. Both ways of computing
/// the masks: beside the forward (the vocabulary is known) and after it.
#[test]
fn a_constraint_masks_sampling_and_ends_the_request() {
    for beside in [true, false] {
        constrained_run(beside);
    }
}

fn constrained_run(beside: bool) {
    let mut m = FakeModel::new(37, 4096, Predict::Recurrence);
    let mut kv = KvStore::new(m.attention_needs().kv_layout, 400);
    let mut s = Scheduler::new(cfg(400, 64), None);
    if beside {
        s.set_vocab_size(37);
    }
    let prompt: Vec<u32> = (0..12).collect();
    let spelled = vec![5, 30, 5, 2];
    s.submit(NewRequest { constraint: Some(Box::new(Spell(spelled.clone(), 0))), ..req(1, prompt.clone(), 10) })
        .expect("admissible");
    let sampled = SamplingParams { temperature: 1.0, seed: 3, ..Default::default() };
    s.submit(NewRequest {
        constraint: Some(Box::new(Spell(spelled.clone(), 0))),
        sampling: sampled,
        ..req(2, prompt.clone(), 10)
    })
    .expect("admissible");
    s.submit(req(3, prompt.clone(), 6)).expect("admissible");
    let (done, _) = drain(&mut s, &mut m, &mut kv);
    assert_eq!(done[0], (1, spelled.clone(), FinishReason::GrammarEnd));
    assert_eq!(done[1], (2, spelled, FinishReason::GrammarEnd));
    assert_eq!(done[2], (3, m.reference(&prompt, 6, None, 4096).0, FinishReason::Length));
    s.check_pages().expect("pages accounted for");
}
