//! The engine thread survives a model that panics: the batch's requests get an error, the pool
//! is rebuilt, and later requests are served.

use std::sync::mpsc;
use std::time::Duration;

use sparrow_engine::batch::ForwardBatch;
use sparrow_engine::engine::{Engine, EngineArgs};
use sparrow_engine::kv::{KvLayout, KvStore};
use sparrow_engine::model::{AttentionNeeds, Model, ModelInfo};
use sparrow_engine::sampler::SamplingParams;
use sparrow_engine::scheduler::{FinishReason, NewRequest, Output};
use sparrow_engine::EngineError;

/// Predicts `token + 1`; panics (a stand-in for a bug) on token 13.
struct Fragile(ModelInfo);

impl Model for Fragile {
    fn info(&self) -> &ModelInfo {
        &self.0
    }
    fn attention_needs(&self) -> AttentionNeeds {
        AttentionNeeds { kind: "gqa", kv_layout: KvLayout::gqa(1, 1, 8) }
    }
    fn forward(&mut self, b: &ForwardBatch, _kv: &mut KvStore) -> Result<Vec<f32>, EngineError> {
        assert!(!b.input_ids.contains(&13), "bug triggered by token 13");
        let mut out = Vec::new();
        for &r in &b.logits_rows {
            let mut row = vec![0f32; 100];
            row[(b.input_ids[r as usize] as usize + 1) % 100] = 1.0;
            out.extend(row);
        }
        Ok(out)
    }
}

fn args() -> EngineArgs {
    EngineArgs {
        max_total_tokens: Some(1000),
        kv_cache_gb: 1.0,
        chunked_prefill_size: 64,
        max_prefill_tokens: 64,
        attention_backend: "cpu".into(),
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
    };
    engine.submit(req, Box::new(move |o| tx.send(o).is_ok())).expect("engine running");
    let mut toks = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(10)).expect("an answer") {
            Output::Token { token, .. } => toks.push(token),
            Output::Finished { reason, .. } => return (toks, reason),
            Output::Started { .. } => {}
        }
    }
}

#[test]
fn a_panicking_model_fails_the_batch_and_the_engine_keeps_serving() {
    let info = ModelInfo {
        architecture: "fake".into(),
        name: "fragile".into(),
        vocab_size: 100,
        context_length: 256,
        num_layers: 1,
        hidden_size: 8,
        weight_bytes: 0,
    };
    let engine = Engine::start_with_model(Box::new(Fragile(info)), &args(), "scalar").expect("starts");
    assert_eq!(run(&engine, 1, vec![5, 6]), (vec![7, 8, 9], FinishReason::Length));
    let (toks, reason) = run(&engine, 2, vec![12, 13]);
    assert!(toks.is_empty());
    assert!(matches!(reason, FinishReason::Error(ref m) if m.contains("internal engine error")), "{reason:?}");
    assert_eq!(run(&engine, 3, vec![40]), (vec![41, 42, 43], FinishReason::Length));
    assert_eq!(engine.stats().free_pages + engine.stats().evictable_pages, 1000);
}
