//! The task of one dataset row: wait for its due time and a concurrency slot, send, record,
//! and for a multi-round conversation build each next round from the answers so far. Each
//! finished record goes to the collector at once; a row that cannot start (interrupted, or
//! the server declared down) still yields a record per round, so the report accounts for
//! every request of the dataset.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

use super::health::Liveness;
use super::output::unix_now;
use crate::client::{self, ClientCtx, PromptInput, RequestOptions};
use crate::dataset::DatasetRow;
use crate::record::{Failure, FailureKind, RequestRecord, TokenCountSource, Turn};

/// What every request task of a run shares.
#[derive(Clone)]
pub(super) struct Shared {
    /// The client, clock and tokenizer.
    pub ctx: Arc<ClientCtx>,
    /// Finished records, to the collector.
    pub tx: mpsc::UnboundedSender<RequestRecord>,
    /// `--max-concurrency` slots.
    pub sem: Option<Arc<Semaphore>>,
    /// Cancelled on SIGINT/SIGTERM or by the embedding caller.
    pub cancel: CancellationToken,
    /// The server-liveness watch.
    pub live: Arc<Liveness>,
    /// Cancelled when requests in flight are abandoned (server down, grace over).
    pub abandon: CancellationToken,
    /// The dataset.
    pub rows: Arc<Vec<DatasetRow>>,
    /// How request bodies are built (later rounds of a conversation).
    pub opts: Arc<RequestOptions>,
    /// `--print-requests`.
    pub print_requests: bool,
}

pub(super) fn new_record(index: usize, prompt_len: u64, output_len: u64, scheduled_s: f64) -> RequestRecord {
    RequestRecord {
        index,
        turn: None,
        prompt_len,
        requested_output_len: output_len,
        scheduled_s,
        dispatched_s: -1.0,
        sent_s: scheduled_s,
        first_byte_s: None,
        chunks: Vec::new(),
        end_s: scheduled_s,
        output_tokens: 0,
        output_tokens_source: TokenCountSource::Server,
        finish_reason: None,
        text: String::new(),
        failure: None,
        retries: 0,
    }
}

/// Spawns the task of row `i`, whose records are `base ..= base + rounds`, due `offset_s`
/// after the run's start; `body` is its first round's request, serialized in advance.
pub(super) fn spawn(s: Shared, i: usize, base: usize, body: Bytes, offset_s: f64) {
    let mut rec = new_record(base, s.rows[i].prompt_len, s.rows[i].output_len, offset_s);
    rec.turn = (!s.rows[i].turns.is_empty()).then_some(Turn { conversation: i, round: 0 });
    let due = s.ctx.t0 + Duration::from_secs_f64(offset_s);
    tokio::spawn(async move {
        let Shared { ctx, tx, sem, cancel, live, abandon, rows, opts, print_requests } = s;
        let row = &rows[i];
        // A conversation that cannot start takes all its rounds with it.
        let not_sent = |mut rec: RequestRecord, kind: FailureKind, msg: &str| {
            let end = ctx.now();
            for r in 0..=row.turns.len() {
                if r > 0 {
                    rec = new_record(base + r, 0, row.output_len, rec.scheduled_s);
                    rec.turn = Some(Turn { conversation: i, round: r });
                }
                rec.end_s = end;
                rec.failure = Some(Failure { kind, message: msg.into() });
                let _ = tx.send(rec.clone());
            }
        };
        tokio::select! {
            () = tokio::time::sleep_until(due.into()) => {},
            () = cancel.cancelled() => { not_sent(rec, FailureKind::NotSentInterrupted, "interrupted before send"); return; }
            () = live.down.cancelled() => { not_sent(rec, FailureKind::NotSent, "server down before send"); return; }
        }
        rec.dispatched_s = ctx.now();
        // One slot per conversation, held through all its rounds (as SGLang's client).
        let _permit = match &sem {
            None => None,
            Some(s) => tokio::select! {
                p = s.clone().acquire_owned() => p.ok(),
                () = cancel.cancelled() => { not_sent(rec, FailureKind::NotSentInterrupted, "interrupted before send"); return; }
                () = live.down.cancelled() => { not_sent(rec, FailureKind::NotSent, "server down before send"); return; }
            },
        };
        let mut history: Vec<Value> = Vec::new();
        let mut body = body;
        for round in 0..=row.turns.len() {
            if round > 0 {
                // The earlier rounds and their answers, then this round's question.
                history.push(serde_json::json!({"role": "user", "content": row.turns[round - 1]}));
                let t = ctx.now();
                let msgs: Vec<sparrow_tokenizer::ChatMessage> = history
                    .iter()
                    .map(|m| {
                        sparrow_tokenizer::ChatMessage::new(
                            m["role"].as_str().unwrap_or("user"),
                            m["content"].as_str().unwrap_or(""),
                        )
                    })
                    .collect();
                // An estimate (the templated history, else its contents); the server's own
                // count replaces it when it reports one.
                let tok = &ctx.tokenizer;
                let prompt_len = match tok.apply_chat_template(&msgs, true) {
                    Ok(text) => tok.encode(&text, false).map_or(0, |ids| ids.len() as u64),
                    Err(_) => {
                        msgs.iter().map(|m| tok.encode(&m.content, false).map_or(0, |ids| ids.len() as u64)).sum()
                    }
                };
                rec = new_record(base + round, prompt_len, row.output_len, t);
                rec.turn = Some(Turn { conversation: i, round });
                rec.dispatched_s = t;
                body = Bytes::from(
                    client::build_body(&opts, PromptInput::Messages(&history), row.output_len, &row.extra_body)
                        .to_string(),
                );
            }
            let start_unix = unix_now();
            if print_requests {
                crate::outln!(
                    "rid={} time={start_unix:.6} message=\"request start\" prompt_len={} output_len={}",
                    rec.index,
                    rec.prompt_len,
                    rec.requested_output_len
                );
            }
            if live.down.is_cancelled() {
                rec.end_s = ctx.now();
                rec.failure = Some(Failure { kind: FailureKind::NotSent, message: "server down before send".into() });
            } else if cancel.is_cancelled() {
                rec.end_s = ctx.now();
                rec.failure =
                    Some(Failure { kind: FailureKind::NotSentInterrupted, message: "interrupted before send".into() });
            } else {
                client::send(&ctx, std::mem::take(&mut body), &mut rec, &cancel, &abandon, row.routing_key.as_deref())
                    .await;
            }
            if print_requests {
                let now = unix_now();
                crate::outln!(
                    "rid={} time={now:.6} time_delta={:.6} message=\"request end\" success={} output_tokens={} ttft={} error={:?}",
                    rec.index,
                    now - start_unix,
                    rec.success(),
                    rec.output_tokens,
                    rec.ttft().map_or("none".into(), |t| format!("{t:.6}")),
                    rec.failure.as_ref().map_or(String::new(), |f| format!("{}: {}", f.kind.label(), f.message)),
                );
            }
            if let Some(f) = &rec.failure {
                if f.kind.is_connection_level() {
                    live.sign(rec.end_s, format!("request {}: {}", rec.index, f.kind.label()));
                    live.probe_now.notify_one();
                }
                if f.kind == FailureKind::ConnectionRefused {
                    live.declare("requests: connection refused".into());
                }
            }
            if round < row.turns.len() {
                // Only a conversation with rounds to come keeps a history.
                if round == 0 {
                    history = match &row.messages {
                        Some(m) => m.clone(),
                        None => vec![serde_json::json!({"role": "user", "content": row.prompt})],
                    };
                }
                // A failed round's answer is empty, and the conversation goes on (as SGLang's).
                history.push(serde_json::json!({"role": "assistant", "content": rec.text}));
            }
            let _ = tx.send(std::mem::replace(&mut rec, new_record(0, 0, 0, 0.0)));
        }
    });
}
