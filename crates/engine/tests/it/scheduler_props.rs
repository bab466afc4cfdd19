//! Seeded randomized invariant test of the scheduler, KV pages and radix cache, driven with a
//! fake model whose output depends on every KV slot it reads.
//!
//! The fake model keeps one number per token per layer: `v[p] = mix(v[p-1], token[p])`, read
//! back from the slot of position `p-1` through the batch's slot list, and it predicts
//! `v[last] mod vocab`. A wrong slot, a stale page, a prefix shared when it should not be, a
//! chunk boundary off by one, or a retraction that loses state changes the outputs, so
//! comparing every request with the recurrence computed directly checks the batch metadata end
//! to end. Each schedule draws arrivals, prompt lengths, shared prefixes, chunk sizes, page
//! sizes, pool sizes (small enough to force retraction), radix on/off, the policy, and NGRAM
//! speculation on or off (its proposals mostly wrong for this model, so verify rows accept,
//! reject and give pages back).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sparrow_engine::kv::KvStore;
use sparrow_engine::model::Model;
use sparrow_engine::sampler::SamplingParams;
use sparrow_engine::scheduler::{FinishReason, NewRequest, Output, SchedulePolicy, Scheduler, SchedulerConfig};
use sparrow_engine::spec::SpecConfig;
use sparrow_engine::testing::{FakeModel, Predict};

const VOCAB: usize = 37;

fn fake() -> FakeModel {
    FakeModel::new(VOCAB, 4096, Predict::Recurrence)
}

/// The greedy output of the fake model computed directly.
fn reference(prompt: &[u32], max_new: usize, eos: Option<u32>, ctx: usize) -> (Vec<u32>, FinishReason) {
    let (out, stopped) = fake().reference(prompt, max_new, eos, ctx);
    let last = out.last().copied().unwrap_or(0);
    (out, if stopped { FinishReason::Stop(last) } else { FinishReason::Length })
}

struct Expect {
    prompt: Vec<u32>,
    max_new: usize,
    ignore_eos: bool,
    got: Vec<u32>,
    end: Option<FinishReason>,
    aborted: bool,
}

/// Coverage counters of one schedule: retractions, cached prompt tokens, mixed batches,
/// chunked continuations.
#[derive(Default)]
struct Seen {
    retractions: u64,
    cached: u64,
    mixed: u64,
    chunked: u64,
    accepted: u64,
    rejected: u64,
}

fn run_schedule(seed: u64, seen: &mut Seen) {
    let mut rng = StdRng::seed_from_u64(seed);
    let page_size = [1usize, 2, 4, 16, 64][rng.random_range(0..5)];
    let ctx = 300;
    let max_req_tokens: usize = 160;
    // Pools from "one request barely fits" up to roomy.
    let min_pages = max_req_tokens.div_ceil(page_size) + 1;
    let num_pages = rng.random_range(min_pages..min_pages * 4);
    let cfg = SchedulerConfig {
        page_size,
        num_pages,
        max_running_requests: rng.random_range(1..10),
        chunked_prefill_size: rng.random_range(1..80),
        max_prefill_tokens: rng.random_range(1..200),
        context_length: ctx,
        disable_radix_cache: rng.random_bool(0.3),
        policy: if rng.random_bool(0.5) { SchedulePolicy::Fcfs } else { SchedulePolicy::Lpm },
        spec: rng.random_bool(0.5).then(|| SpecConfig {
            ngram_min_window: rng.random_range(1..3),
            ngram_max_window: rng.random_range(1..6),
            ..SpecConfig::ngram(rng.random_range(2..8))
        }),
        whole_prompts: false,
        state_checkpoints: 0,
        queue: Default::default(),
    };
    let eos = if rng.random_bool(0.5) { Some(0u32) } else { None };
    let mut sched = Scheduler::new(cfg.clone(), eos);
    let mut model = fake();
    let mut kv = KvStore::new(model.attention_needs().kv_layout, sched.num_slots());
    let start_free = sched.free_pages();
    let bases: Vec<Vec<u32>> =
        (0..3).map(|_| (0..rng.random_range(1..120)).map(|_| rng.random_range(1..VOCAB as u32)).collect()).collect();
    let n_req = rng.random_range(1..25);
    let mut reqs: Vec<Expect> = Vec::new();
    let mut steps = 0;
    loop {
        // Arrivals: a few per step, sometimes bursts.
        while reqs.len() < n_req && rng.random_bool(0.4) {
            let mut prompt: Vec<u32> = if rng.random_bool(0.6) {
                let b = &bases[rng.random_range(0..bases.len())];
                b[..rng.random_range(1..=b.len())].to_vec()
            } else {
                Vec::new()
            };
            let extra = rng.random_range(if prompt.is_empty() { 1 } else { 0 }..40);
            prompt.extend((0..extra).map(|_| rng.random_range(0..VOCAB as u32)));
            prompt.truncate(max_req_tokens - 30);
            let max_new = rng.random_range(1..30);
            let ignore_eos = rng.random_bool(0.5);
            let id = reqs.len() as u64;
            let r = NewRequest {
                id,
                input_ids: prompt.clone(),
                max_new_tokens: max_new,
                sampling: SamplingParams { temperature: 0.0, ..Default::default() },
                stop_token_ids: Vec::new(),
                ignore_eos,
                logprobs: Default::default(),
                constraint: None,
                embed: false,
                priority: None,
            };
            sched.submit(r).expect("valid request");
            reqs.push(Expect { prompt, max_new, ignore_eos, got: Vec::new(), end: None, aborted: false });
        }
        if rng.random_bool(0.03) && !reqs.is_empty() {
            let id = rng.random_range(0..reqs.len());
            if reqs[id].end.is_none() {
                if let Some(Output::Finished { reason, .. }) = sched.abort(id as u64) {
                    assert_eq!(reason, FinishReason::Abort);
                    reqs[id].aborted = true;
                    reqs[id].end = Some(FinishReason::Abort);
                }
            }
        }
        for o in sched.step(&mut model, &mut kv) {
            match o {
                Output::Started { .. } | Output::PromptLogprobs { .. } => {}
                Output::Embedding { .. } => panic!("no embedding request was sent"),
                Output::Token { id, token, .. } => reqs[id as usize].got.push(token),
                Output::Finished { id, reason, usage } => {
                    let r = &mut reqs[id as usize];
                    assert!(!matches!(reason, FinishReason::Error(_)), "seed {seed}: {reason:?}");
                    assert_eq!(usage.completion_tokens, r.got.len(), "seed {seed}: usage");
                    assert!(r.end.is_none(), "seed {seed}: finished twice");
                    r.end = Some(reason);
                }
            }
        }
        if let Some(b) = sched.last_batch() {
            b.validate(sched.num_slots()).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            if b.mode() == sparrow_engine::batch::ForwardMode::Mixed {
                seen.mixed += 1;
            }
            if b.seqs.iter().any(|s| s.prefix_len > 0 && s.extend_len > 1 && s.num_logits == 0) {
                seen.chunked += 1;
            }
        }
        sched.check_pages().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        steps += 1;
        assert!(steps < 20_000, "seed {seed}: no progress ({cfg:?})");
        if reqs.len() == n_req && sched.is_idle() {
            break;
        }
    }
    for (id, r) in reqs.iter().enumerate() {
        if r.aborted {
            continue;
        }
        let (want, why) = reference(&r.prompt, r.max_new, if r.ignore_eos { None } else { eos }, ctx);
        assert_eq!(r.got, want, "seed {seed}: request {id} output ({cfg:?})");
        assert_eq!(r.end.as_ref(), Some(&why), "seed {seed}: request {id} finish");
    }
    sched.flush_cache();
    assert_eq!(sched.free_pages(), start_free, "seed {seed}: pages leaked");
    let st = sched.stats();
    seen.retractions += st.num_retractions;
    seen.cached += st.cached_tokens_total;
    seen.accepted += st.spec_accepted_tokens_total;
    seen.rejected += st.spec_draft_tokens_total - st.spec_accepted_tokens_total;
}

#[test]
fn random_schedules_keep_metadata_complete_and_outputs_exact() {
    let mut seen = Seen::default();
    for seed in 0..3000 {
        run_schedule(seed, &mut seen);
    }
    // The schedules must actually reach the paths they are meant to check.
    assert!(seen.retractions > 20, "retractions: {}", seen.retractions);
    assert!(seen.cached > 1000, "cached prompt tokens: {}", seen.cached);
    assert!(seen.mixed > 1000, "mixed batches: {}", seen.mixed);
    assert!(seen.chunked > 1000, "chunked continuations: {}", seen.chunked);
    assert!(
        seen.accepted > 100 && seen.rejected > 1000,
        "NGRAM proposals: {} accepted, {} rejected",
        seen.accepted,
        seen.rejected
    );
    eprintln!(
        "retractions {}, cached tokens {}, mixed batches {}, chunk steps {}",
        seen.retractions, seen.cached, seen.mixed, seen.chunked
    );
}

/// A FCFS scheduler with radix cache over `num_pages` pages of `page_size`.
fn small_pool(page_size: usize, num_pages: usize) -> SchedulerConfig {
    SchedulerConfig {
        page_size,
        num_pages,
        max_running_requests: 8,
        chunked_prefill_size: 16,
        max_prefill_tokens: 64,
        context_length: 300,
        disable_radix_cache: false,
        policy: SchedulePolicy::Fcfs,
        spec: None,
        whole_prompts: false,
        state_checkpoints: 0,
        queue: Default::default(),
    }
}

/// Retraction happens in these schedules (not only in theory): a pool that holds one request
/// and a half, many requests decoding long outputs.
#[test]
fn retraction_recomputes_the_same_greedy_output() {
    let mut sched = Scheduler::new(small_pool(4, 30), None);
    let mut model = fake();
    let mut kv = KvStore::new(model.attention_needs().kv_layout, sched.num_slots());
    let prompts: Vec<Vec<u32>> = (0..8u32).map(|i| (0..20).map(|j| (i * 7 + j) % 37).collect()).collect();
    for (i, p) in prompts.iter().enumerate() {
        let r = NewRequest {
            id: i as u64,
            input_ids: p.clone(),
            max_new_tokens: 60,
            sampling: SamplingParams { temperature: 0.0, ..Default::default() },
            stop_token_ids: vec![],
            ignore_eos: true,
            logprobs: Default::default(),
            constraint: None,
            embed: false,
            priority: None,
        };
        sched.submit(r).expect("fits alone");
    }
    let mut got = vec![Vec::new(); 8];
    while !sched.is_idle() {
        for o in sched.step(&mut model, &mut kv) {
            if let Output::Token { id, token, .. } = o {
                got[id as usize].push(token);
            }
        }
    }
    assert!(sched.stats().num_retractions > 0, "the pool was meant to force retraction");
    for (p, g) in prompts.iter().zip(&got) {
        assert_eq!(g, &reference(p, 60, None, 300).0);
    }
}

#[test]
fn a_request_that_can_never_fit_is_refused_at_admission() {
    let mut sched = Scheduler::new(small_pool(16, 4), None);
    let r = NewRequest {
        id: 1,
        input_ids: vec![1; 60],
        max_new_tokens: 5,
        sampling: SamplingParams::default(),
        stop_token_ids: vec![],
        ignore_eos: false,
        logprobs: Default::default(),
        constraint: None,
        embed: false,
        priority: None,
    };
    let e = sched.submit(r).expect_err("65 tokens > 64-token pool");
    assert!(e.to_string().contains("KV pool holds 64"), "{e}");
    assert!(sched.is_idle());
}
