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
    };
    engine.submit(req, Box::new(move |o| tx.send(o).is_ok())).expect("engine running");
    let mut toks = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(10)).expect("an answer") {
            Output::Token { token, .. } => toks.push(token),
            Output::Finished { reason, .. } => return (toks, reason),
            Output::Started { .. } | Output::PromptLogprobs { .. } => {}
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
