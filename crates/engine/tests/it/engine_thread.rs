//! The engine thread survives a model that panics: the batch's requests get an error, the pool
//! is rebuilt, and later requests are served.

use std::sync::mpsc;
use std::time::Duration;

use sparrow_engine::engine::{Engine, EngineArgs};
use sparrow_engine::sampler::SamplingParams;
use sparrow_engine::scheduler::{FinishReason, NewRequest, Output};
use sparrow_engine::testing::{FakeModel, Predict};

fn args() -> EngineArgs {
    EngineArgs {
        max_total_tokens: Some(1000),
        kv_cache_gb: 1.0,
        chunked_prefill_size: 64,
        max_prefill_tokens: 64,
        attention_backend: sparrow_engine::config::AttentionBackend::Cpu,
        disable_autotune: true,
        ..EngineArgs::new("unused".into())
    }
}

fn run(engine: &Engine, id: u64, prompt: Vec<u32>) -> (Vec<u32>, FinishReason) {
    let (tx, rx) = mpsc::channel();
    let req = NewRequest {
        id,
        input_ids: prompt,
        max_new_tokens: 3,
        sampling: SamplingParams { temperature: 0.0, ..Default::default() },
        stop_token_ids: vec![],
        ignore_eos: true,
        logprobs: Default::default(),
        constraint: None,
        embed: false,
        priority: None,
    };
    engine.submit(req, Box::new(move |o| tx.send(o).is_ok())).expect("engine running");
    let mut toks = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(10)).expect("an answer") {
            Output::Token { token, .. } => toks.push(token),
            Output::Finished { reason, .. } => return (toks, reason),
            Output::Started { .. } | Output::PromptLogprobs { .. } => {}
            Output::Embedding { .. } => panic!("no embedding request was sent"),
        }
    }
}

#[test]
fn a_panicking_model_fails_the_batch_and_the_engine_keeps_serving() {
    let engine = Engine::start_with_model(
        Box::new(FakeModel::new(100, 256, Predict::NextToken).panic_on(13)),
        &args(),
        "scalar",
    )
    .expect("starts");
    assert_eq!(run(&engine, 1, vec![5, 6]), (vec![7, 8, 9], FinishReason::Length));
    let (toks, reason) = run(&engine, 2, vec![12, 13]);
    assert!(toks.is_empty());
    assert!(matches!(reason, FinishReason::Error(ref m) if m.contains("internal engine error")), "{reason:?}");
    assert_eq!(run(&engine, 3, vec![40]), (vec![41, 42, 43], FinishReason::Length));
    assert_eq!(engine.stats().free_pages + engine.stats().evictable_pages, 1000);
}

/// A STANDALONE draft is checked against the model once, at start-up: a different vocabulary
/// size, a context shorter than the one served, or a draft without STANDALONE (or STANDALONE
/// without a draft) is refused with the reason; a matching draft serves, its proposals
/// verified (the fake draft computes the model's own recurrence, so it is accepted).
#[test]
fn a_draft_model_is_checked_at_start_up_and_then_serves() {
    use sparrow_engine::spec::{SpecAlgorithm, SpecConfig};
    let spec = SpecConfig {
        algorithm: SpecAlgorithm::Standalone,
        draft_model_path: Some("draft".into()),
        num_steps: 3,
        ..SpecConfig::ngram(4)
    };
    let a = EngineArgs { speculative: Some(spec), ..args() };
    let model = || Box::new(FakeModel::new(37, 4096, Predict::Recurrence));
    let err = |r: Result<Engine, sparrow_engine::EngineError>| r.err().map(|e| e.to_string()).unwrap_or_default();
    let e = err(Engine::start_with_models(
        model(),
        Some(Box::new(FakeModel::new(38, 4096, Predict::Recurrence))),
        &a,
        "scalar",
    ));
    assert!(e.contains("vocabulary has 38 tokens, the model's 37"), "{e}");
    let e = err(Engine::start_with_models(
        model(),
        Some(Box::new(FakeModel::new(37, 1024, Predict::Recurrence))),
        &a,
        "scalar",
    ));
    assert!(e.contains("context is 1024 tokens, shorter than the 4096 served"), "{e}");
    let e = err(Engine::start_with_models(model(), None, &a, "scalar"));
    assert!(e.contains("STANDALONE needs a draft model"), "{e}");
    let e = err(Engine::start_with_models(model(), Some(model()), &args(), "scalar"));
    assert!(e.contains("only used with --speculative-algorithm STANDALONE"), "{e}");
    let engine = Engine::start_with_models(model(), Some(model()), &a, "scalar").expect("a matching draft");
    let prompt: Vec<u32> = (0..20).map(|i| (i * 7) % 37).collect();
    let (toks, _) = run(&engine, 1, prompt.clone());
    assert_eq!(toks, FakeModel::new(37, 4096, Predict::Recurrence).reference(&prompt, 3, None, 4096).0);
    let st = engine.stats();
    assert!(st.spec_accepted_tokens_total > 0 && st.spec_accepted_tokens_total == st.spec_draft_tokens_total, "{st:?}");
}
