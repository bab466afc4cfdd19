//! Unit tests of the scheduler's cycle with the shared fake model: chunked prefill, the radix
//! cache, retraction and page accounting, each checked against the recurrence computed directly.

use super::*;
use crate::testing::{FakeModel, Predict};

pub(super) fn cfg(num_pages: usize, chunk: usize) -> SchedulerConfig {
    SchedulerConfig {
        num_pages,
        page_size: 1,
        max_running_requests: 8,
        chunked_prefill_size: chunk,
        max_prefill_tokens: 4096,
        context_length: 4096,
        disable_radix_cache: false,
        policy: SchedulePolicy::Fcfs,
        spec: None,
        whole_prompts: false,
        state_checkpoints: 0,
        queue: Default::default(),
    }
}

pub(super) fn req(id: u64, prompt: Vec<u32>, max_new: usize) -> NewRequest {
    NewRequest {
        id,
        input_ids: prompt,
        max_new_tokens: max_new,
        sampling: SamplingParams { temperature: 0.0, ..Default::default() },
        stop_token_ids: vec![],
        ignore_eos: true,
        logprobs: Default::default(),
        constraint: None,
        embed: false,
        priority: None,
    }
}

/// Runs until idle; returns each request's tokens and finish reason, and the steps taken.
pub(super) fn drain(
    s: &mut Scheduler,
    m: &mut FakeModel,
    kv: &mut KvStore,
) -> (Vec<(u64, Vec<u32>, FinishReason)>, usize) {
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

/// Speculation with proposals set from outside (as a draft model sets them): `max_drafts`
/// proposals a step at most.
fn external_spec(max_drafts: usize) -> crate::spec::SpecConfig {
    crate::spec::SpecConfig {
        algorithm: crate::spec::SpecAlgorithm::Standalone,
        num_draft_tokens: max_drafts + 1,
        ngram_min_window: 1,
        ngram_max_window: 1,
        draft_model_path: None,
        num_steps: max_drafts,
    }
}

/// A small deterministic generator for the tests' own draws (proposals, lengths).
struct Lcg(u64);
impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Verify rows with right, partly right and wrong proposals, in a pool small enough to retract
/// and with the radix cache shared between requests: every output equals the recurrence
/// computed directly, pages stay accounted for after every step (rejected positions' pages
/// returned), and the proposals were really accepted and rejected.
#[test]
fn verify_rows_keep_greedy_outputs_exact_through_retraction_and_the_radix_cache() {
    for page_size in [1usize, 4, 16] {
        let m0 = FakeModel::new(37, 4096, Predict::Recurrence);
        let num_pages = 130usize.div_ceil(page_size) + 1;
        let cfg = SchedulerConfig {
            page_size,
            num_pages,
            spec: Some(external_spec(6)),
            max_running_requests: 6,
            ..cfg(num_pages, 24)
        };
        let mut s = Scheduler::new(cfg, None);
        let mut m = m0.clone();
        let mut kv = KvStore::new(m.attention_needs().kv_layout, s.num_slots());
        let base: Vec<u32> = (0..40).map(|i| (i * 11 + 3) % 37).collect();
        let prompts: Vec<Vec<u32>> = (0..10u32).map(|i| [&base[..20 + i as usize], &[i][..]].concat()).collect();
        for (i, p) in prompts.iter().enumerate() {
            s.submit(req(i as u64, p.clone(), 70)).expect("fits alone");
        }
        let mut rng = Lcg(page_size as u64);
        let mut got = vec![Vec::new(); prompts.len()];
        let mut steps = 0;
        while !s.is_idle() {
            steps += 1;
            assert!(steps < 5000, "no progress");
            // Proposals: the true continuation, cut short and sometimes corrupted.
            for r in s.running.iter_mut().filter(|r| r.kv_len > 0 && r.tokens.len() - r.kv_len == 1) {
                let k = rng.below(7) as usize;
                let (mut d, _) = m0.reference(&r.tokens, k.max(1), None, 4096);
                d.truncate(k);
                if !d.is_empty() && rng.below(3) == 0 {
                    let at = rng.below(d.len() as u64) as usize;
                    d[at] = (d[at] + 1) % 37;
                }
                r.draft = d;
            }
            for o in s.step(&mut m, &mut kv) {
                match o {
                    Output::Token { id, token, .. } => got[id as usize].push(token),
                    Output::Finished { reason, .. } => assert!(!matches!(reason, FinishReason::Error(_)), "{reason:?}"),
                    _ => {}
                }
            }
            if let Some(b) = s.last_batch() {
                b.validate(s.num_slots()).expect("complete batch");
            }
            s.check_pages().expect("pages accounted for");
        }
        for (i, p) in prompts.iter().enumerate() {
            assert_eq!(got[i], m0.reference(p, 70, None, 4096).0, "page size {page_size}, request {i}");
        }
        let st = s.stats();
        assert!(st.spec_accepted_tokens_total > 100, "{st:?}");
        assert!(st.spec_accepted_tokens_total < st.spec_draft_tokens_total, "{st:?}");
        assert!(st.num_retractions > 0, "page size {page_size}: {st:?}");
        assert!(st.cached_tokens_total > 0, "{st:?}");
        // Fewer decode forwards than tokens: the accepted proposals were free.
        assert!(st.spec_verify_ct_total + 100 < st.generation_tokens_total, "{st:?}");
        s.flush_cache();
        assert_eq!(s.free_pages(), num_pages, "pages leaked");
    }
}

/// Sampling keeps the target's distribution: with a model whose next-token distribution is a
/// known `p`, 10^5 tokens drawn at temperature 1 with proposals from several draft
/// distributions (the mode, uniform, `p` itself, and one that is always wrong: a token `p`
/// gives probability 0) pass a chi-square test against `p` at p > 0.01, and are the very
/// tokens drawn without speculation (the same draw at each output index).
#[test]
fn sampled_outputs_keep_the_target_distribution_under_any_proposals() {
    // p = softmax(logits); token 5 has probability 0.
    let logits = vec![2.0f32, 1.0, 0.5, 0.0, -1.0, f32::NEG_INFINITY];
    let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
    let p: Vec<f64> = logits.iter().map(|&l| (l as f64).exp() / z).collect();
    let (per_req, reqs) = (1000usize, 100u64);
    let run = |draft: Option<&dyn Fn(&mut Lcg) -> u32>| -> (Vec<u32>, crate::scheduler::SchedulerStats) {
        let mut m = FakeModel::new(6, 4096, Predict::NextToken).with_fixed_logits(logits.clone());
        let spec = draft.is_some().then(|| external_spec(4));
        let cfg = SchedulerConfig { spec, max_running_requests: 16, ..cfg(40_000, 512) };
        let mut s = Scheduler::new(cfg, None);
        let mut kv = KvStore::new(m.attention_needs().kv_layout, s.num_slots());
        for id in 0..reqs {
            let mut r = req(id, vec![1, 2, 3], per_req);
            r.sampling = SamplingParams { temperature: 1.0, seed: 1000 + id, ..Default::default() };
            s.submit(r).expect("fits");
        }
        let mut rng = Lcg(7);
        let mut got: Vec<Vec<u32>> = vec![Vec::new(); reqs as usize];
        while !s.is_idle() {
            if let Some(d) = draft {
                for r in s.running.iter_mut().filter(|r| r.kv_len > 0 && r.tokens.len() - r.kv_len == 1) {
                    r.draft = (0..4).map(|_| d(&mut rng)).collect();
                }
            }
            for o in s.step(&mut m, &mut kv) {
                if let Output::Token { id, token, .. } = o {
                    got[id as usize].push(token);
                }
            }
        }
        (got.concat(), s.stats())
    };
    let (plain, _) = run(None);
    let mode = |_: &mut Lcg| 0u32;
    let uniform = |g: &mut Lcg| g.below(6) as u32;
    let cum: Vec<f64> = p
        .iter()
        .scan(0.0, |a, &x| {
            *a += x;
            Some(*a)
        })
        .collect();
    let from_p = |g: &mut Lcg| {
        let u = g.below(1 << 30) as f64 / (1u64 << 30) as f64;
        cum.iter().position(|&c| u < c).unwrap_or(0) as u32
    };
    let wrong = |_: &mut Lcg| 5u32;
    type Draw<'a> = &'a dyn Fn(&mut Lcg) -> u32;
    let drafts: [(&str, Draw); 4] = [("mode", &mode), ("uniform", &uniform), ("p", &from_p), ("always wrong", &wrong)];
    for (name, d) in drafts {
        let (toks, st) = run(Some(d));
        assert_eq!(toks.len(), per_req * reqs as usize);
        let mut count = [0f64; 6];
        for &t in &toks {
            count[t as usize] += 1.0;
        }
        assert_eq!(count[5], 0.0, "{name}: a token of probability 0 was emitted");
        let n = toks.len() as f64;
        let chi2: f64 = (0..5).map(|i| (count[i] - n * p[i]).powi(2) / (n * p[i])).sum();
        // 4 degrees of freedom: P(chi2 > 13.28) = 0.01.
        assert!(chi2 < 13.28, "{name}: chi-square {chi2:.2}, counts {count:?}");
        assert_eq!(toks, plain, "{name}: speculation changed a seeded request's tokens");
        if name == "always wrong" {
            assert_eq!(st.spec_accepted_tokens_total, 0);
        } else {
            assert!(st.spec_accepted_tokens_total > 0, "{name}: {st:?}");
        }
    }
}

/// Runs `prompts` (70 new tokens each, all submitted at once) with `draft` proposing; returns
/// the outputs and the counters.
fn run_with_draft(
    cfg: SchedulerConfig,
    draft: &mut FakeModel,
    prompts: &[Vec<u32>],
) -> (Vec<Vec<u32>>, crate::scheduler::SchedulerStats) {
    let mut m = FakeModel::new(37, 4096, Predict::Recurrence);
    let mut s = Scheduler::new(cfg, None);
    let mut kv = KvStore::new(m.attention_needs().kv_layout, s.num_slots());
    let mut dkv = KvStore::new(draft.attention_needs().kv_layout, s.num_slots());
    for (i, p) in prompts.iter().enumerate() {
        s.submit(req(i as u64, p.clone(), 70)).expect("fits alone");
    }
    let mut got = vec![Vec::new(); prompts.len()];
    let mut steps = 0;
    while !s.is_idle() {
        steps += 1;
        assert!(steps < 5000, "no progress");
        for o in s.step_with_draft(&mut m, &mut kv, Some((draft, &mut dkv))) {
            match o {
                Output::Token { id, token, .. } => got[id as usize].push(token),
                Output::Finished { reason, .. } => assert!(!matches!(reason, FinishReason::Error(_)), "{reason:?}"),
                _ => {}
            }
        }
        s.check_pages().expect("pages accounted for");
    }
    s.flush_cache();
    assert_eq!(s.free_pages(), s.config().num_pages, "pages leaked");
    (got, s.stats())
}

/// A STANDALONE draft that computes the target's own recurrence in its own KV store proposes
/// exactly the target's next tokens, so every proposal is accepted: its lazily caught-up KV
/// (prompt chunks, accepted proposals, pages shared through the slot numbering) is right. A
/// draft of another model proposes wrong tokens; the outputs stay exact either way, with
/// retraction and the radix cache in play.
#[test]
fn a_draft_model_proposes_through_its_own_kv_and_outputs_stay_exact() {
    let base: Vec<u32> = (0..40).map(|i| (i * 11 + 3) % 37).collect();
    let prompts: Vec<Vec<u32>> = (0..8u32).map(|i| [&base[..12 + 3 * i as usize], &[i][..]].concat()).collect();
    let want: Vec<Vec<u32>> =
        prompts.iter().map(|p| FakeModel::new(37, 4096, Predict::Recurrence).reference(p, 70, None, 4096).0).collect();
    for page_size in [1usize, 4, 16] {
        let roomy = SchedulerConfig {
            page_size,
            num_pages: 4000 / page_size,
            spec: Some(external_spec(5)),
            disable_radix_cache: true,
            ..cfg(4000 / page_size, 16)
        };
        let mut same = FakeModel::new(37, 4096, Predict::Recurrence);
        let (got, st) = run_with_draft(roomy.clone(), &mut same, &prompts);
        assert_eq!(got, want, "page size {page_size}");
        assert!(st.spec_draft_tokens_total > 300, "{st:?}");
        assert_eq!(st.spec_accepted_tokens_total, st.spec_draft_tokens_total, "page size {page_size}: {st:?}");
        assert_eq!(st.spec_draft_failures, 0);
        // Tight pool, radix cache on: retraction and shared prefixes; the outputs stay exact.
        let pages = 140usize.div_ceil(page_size) + 1;
        let tight = SchedulerConfig { num_pages: pages, disable_radix_cache: false, ..roomy };
        let (got, st) = run_with_draft(tight.clone(), &mut same, &prompts);
        assert_eq!(got, want, "page size {page_size}, tight pool");
        assert!(st.num_retractions > 0 && st.spec_accepted_tokens_total > 0, "{st:?}");
        let mut other = FakeModel::new(37, 4096, Predict::NextToken);
        let (got, st) = run_with_draft(tight, &mut other, &prompts);
        assert_eq!(got, want, "page size {page_size}, wrong draft");
        assert!(st.spec_accepted_tokens_total < st.spec_draft_tokens_total / 4, "{st:?}");
    }
}

/// The recurrence value of a whole prompt (what the fake model's last row predicts from).
fn chain(prompt: &[u32]) -> u64 {
    prompt.iter().fold(1u64, |v, &t| crate::testing::mix(v, t))
}

/// Embedding requests share steps with generation, are chunked like any prompt, return one row
/// computed over their whole prompt (the fake model's prediction from the full recurrence), and
/// keep no page: nothing of theirs enters the radix cache.
#[test]
fn embedding_requests_return_their_row_once_and_keep_no_pages() {
    let mut m = FakeModel::new(37, 4096, Predict::Recurrence);
    let mut kv = KvStore::new(m.attention_needs().kv_layout, 300);
    let mut s = Scheduler::new(cfg(300, 16), None);
    let long: Vec<u32> = (0..50).map(|i| (i * 5) % 37).collect();
    let short: Vec<u32> = vec![3, 1, 4, 1, 5, 9, 2];
    let gen: Vec<u32> = (0..20).map(|i| (i * 3) % 37).collect();
    s.submit(NewRequest::embedding(1, long.clone())).expect("admissible");
    s.submit(req(2, gen.clone(), 6)).expect("admissible");
    s.submit(NewRequest::embedding(3, short.clone())).expect("admissible");
    let mut rows: std::collections::BTreeMap<u64, Vec<Vec<f32>>> = Default::default();
    let mut done = Vec::new();
    let mut tokens = Vec::new();
    while !s.is_idle() {
        for o in s.step(&mut m, &mut kv) {
            match o {
                Output::Embedding { id, values } => rows.entry(id).or_default().push(values),
                Output::Token { id, token, .. } => {
                    assert_eq!(id, 2, "an embedding request generates nothing");
                    tokens.push(token);
                }
                Output::Finished { id, reason, usage } => done.push((id, reason, usage.completion_tokens)),
                _ => {}
            }
        }
    }
    for (id, prompt) in [(1u64, &long), (3, &short)] {
        let r = &rows[&id];
        assert_eq!(r.len(), 1, "request {id}: one embedding");
        let mut want = vec![0f32; 37];
        want[(chain(prompt) % 37) as usize] = 1.0;
        assert_eq!(r[0], want, "request {id}: the row over its whole prompt");
    }
    assert!(!rows.contains_key(&2));
    assert_eq!(tokens, m.reference(&gen, 6, None, 4096).0);
    done.sort_by_key(|d| d.0);
    assert_eq!(done.iter().map(|d| (d.0, d.2)).collect::<Vec<_>>(), vec![(1, 0), (2, 6), (3, 0)]);
    // The 50-token prompt ran in chunks of the budget.
    assert!(s.stats().num_prefill_chunks >= 3, "{:?}", s.stats());
    // Only the generated request's pages may stay, as cache.
    assert!(s.cached_pages() <= gen.len() + 6, "{} cached pages", s.cached_pages());
    s.check_pages().expect("pages accounted for");
    // An embedding request is checked against the context, not context − 1.
    let s2 = Scheduler::new(SchedulerConfig { context_length: 7, ..cfg(300, 16) }, None);
    let mut s2 = s2;
    s2.submit(NewRequest::embedding(9, short.clone())).expect("a prompt of exactly the context");
    assert!(s2.submit(NewRequest::embedding(10, vec![1; 8])).is_err());
    assert!(s2.submit(NewRequest::embedding(11, vec![])).is_err());
}

/// An encoder's prompts run whole (`whole_prompts`): never split across steps, never started
/// from a cached prefix; a prompt waits for a step whose budget holds it.
#[test]
fn whole_prompts_are_never_chunked() {
    let mut m = FakeModel::new(37, 4096, Predict::Recurrence);
    let mut kv = KvStore::new(m.attention_needs().kv_layout, 300);
    let c = SchedulerConfig { whole_prompts: true, disable_radix_cache: true, ..cfg(300, 16) };
    let mut s = Scheduler::new(c, None);
    let prompts: Vec<Vec<u32>> =
        (0..6).map(|k| (0..(5 + 2 * k)).map(|i| ((i * 7 + k) % 37) as u32).collect()).collect();
    for (i, p) in prompts.iter().enumerate() {
        s.submit(NewRequest::embedding(i as u64, p.clone())).expect("admissible");
    }
    let mut got = std::collections::BTreeMap::new();
    let mut steps = 0;
    while !s.is_idle() {
        steps += 1;
        assert!(steps < 100, "no progress");
        for o in s.step(&mut m, &mut kv) {
            if let Output::Embedding { id, values } = o {
                got.insert(id, values);
            }
        }
        let b = s.last_batch().expect("a batch");
        assert!(b.num_tokens() <= 16, "budget");
        for q in &b.seqs {
            assert_eq!(q.prefix_len, 0, "no prefix");
            assert_eq!(q.num_logits, 1);
        }
    }
    for (i, p) in prompts.iter().enumerate() {
        let hot = got[&(i as u64)].iter().position(|&v| v == 1.0).expect("one-hot");
        assert_eq!(hot as u64, chain(p) % 37, "prompt {i}");
    }
    assert_eq!(s.stats().num_prefill_chunks, 0);
    s.check_pages().expect("pages accounted for");
    assert_eq!(s.free_pages(), 300, "every page free again");
}
