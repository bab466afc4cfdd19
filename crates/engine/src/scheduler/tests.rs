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
                Output::Token { id, token } => toks.entry(id).or_default().push(token),
                Output::Finished { id, reason, .. } => done.push((id, toks.remove(&id).unwrap_or_default(), reason)),
                Output::Started { .. } => {}
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
    assert!(matches!(&out[..], [Output::Started { id: 1, .. }, Output::Finished { id: 1, reason: FinishReason::Error(m), .. }] if m.contains("boom")), "{out:?}");
    assert!(s.is_idle());
    s.submit(req(2, vec![1, 2, 3], 2)).expect("admissible");
    let (done, _) = drain(&mut s, &mut m, &mut kv);
    assert_eq!(done, vec![(2, m.reference(&[1, 2, 3], 2, None, 4096).0, FinishReason::Length)]);
    s.check_pages().expect("pages accounted for");
}
