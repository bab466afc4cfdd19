//! The engine thread and its handle.
//!
//! One thread owns the [`Scheduler`], the [`KvStore`] and the [`Model`]; callers talk to it
//! through one typed channel of [`Command`]s, and it answers each request through the sink the
//! request brought (TGI's router shape: `schedule(request) -> stream of events`). A sink that
//! reports its receiver gone (the client disconnected) aborts its request within one step.
//!
//! A panic inside a step (a bug, never a request's fault by design) is caught: every live
//! request gets an error, the scheduler and KV pool are rebuilt, and the engine keeps serving.

use std::panic::AssertUnwindSafe;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use crate::config::{derive_config, AttentionBackend, EngineArgs, MoeRunner, MAX_RUNNING_LIMIT};
use crate::kv::hicache::{DiskTier, WritePolicy};
use crate::kv::KvStore;
pub use crate::model::load::load_model;
use crate::model::{check_compat, Model, ModelInfo, BACKENDS};
use crate::request::{FinishReason, NewRequest, Output};
use crate::scheduler::{Scheduler, SchedulerConfig, SchedulerStats};
use crate::spec::SpecAlgorithm;
pub use crate::tune::batch_cap::BatchCap;
use crate::EngineError;

/// Receives a request's outputs on the engine thread; returns `false` once nobody listens.
pub type Sink = Box<dyn FnMut(Output) -> bool + Send>;

/// Messages to the engine thread.
pub enum Command {
    /// Queue a request; its outputs go to the sink.
    Submit(NewRequest, Sink),
    /// Queue a request that arrived past a full queue (see [`Engine::submit_over_limit`]).
    SubmitOverLimit(NewRequest, Sink),
    /// End a request (queued or running).
    Abort(u64),
    /// Drop unlocked radix-cache pages; the callback gets the pages freed.
    FlushCache(Box<dyn FnOnce(usize) + Send>),
    /// Write every radix page the file tier lacks, finish the tier's writes and stop the
    /// thread; the channel gets the pages written.
    Shutdown(mpsc::Sender<usize>),
}

/// A running engine. Cloning shares the same thread.
#[derive(Clone)]
pub struct Engine {
    tx: mpsc::Sender<Command>,
    stats: Arc<Mutex<SchedulerStats>>,
    info: ModelInfo,
    config: SchedulerConfig,
    backend: &'static str,
    isa: &'static str,
    notes: serde_json::Value,
    batch_cap: BatchCap,
    kv_layout: crate::kv::KvLayout,
    /// A hybrid model's recurrent state per request (its pool has one per request slot).
    state_layout: Option<crate::kv::StateLayout>,
    /// The end-of-generation token ids the scheduler stops on.
    eos: Vec<u32>,
    /// What an embedding engine returns per request (none: it generates).
    embedding: Option<crate::model::EmbeddingSpec>,
    /// Requests submitted and not yet admitted once (see [`Engine::check_queue`]).
    queued: Arc<AtomicUsize>,
    /// The file tier as opened (`None`: off).
    hicache: Option<HiCacheInfo>,
}

/// The hierarchical cache's file tier as the engine opened it (for start-up logs and
/// `/get_server_info`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct HiCacheInfo {
    /// Its directory.
    pub dir: std::path::PathBuf,
    /// Its byte budget.
    pub budget_bytes: u64,
    /// `write_through` or `write_back`.
    pub write_policy: &'static str,
    /// What the start-up scan found.
    pub scan: crate::kv::hicache::ScanReport,
}

/// One request's place in the count of queued requests: given back at its first admission,
/// its end, or when its sink is dropped (the engine thread gone), whichever comes first.
struct QueueSlot(Option<Arc<AtomicUsize>>);

impl QueueSlot {
    fn release(&mut self) {
        if let Some(q) = self.0.take() {
            q.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.release();
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("info", &self.info).field("config", &self.config).finish()
    }
}

impl Engine {
    /// Loads the model, checks it against the backend, sizes the KV pool, caps the running
    /// requests where a larger batch stops paying ([`crate::tune::batch_cap`]) and starts the
    /// thread.
    ///
    /// # Errors
    /// Loading, compatibility or configuration errors, all before any request is accepted.
    pub fn start(args: &EngineArgs) -> Result<Engine, EngineError> {
        let (model, isa, notes) = load_model(args)?;
        let draft = match args.speculative.as_ref().and_then(|s| s.draft_model_path.clone()) {
            Some(p) => {
                let dargs = EngineArgs { model_path: p.clone(), speculative: None, ..args.clone() };
                let (d, _, _) = load_model(&dargs)
                    .map_err(|e| EngineError::Config(format!("--speculative-draft-model-path {}: {e}", p.display())))?;
                Some(d)
            }
            None => None,
        };
        let mut e = Self::start_with_models(model, draft, args, isa)?;
        e.notes = notes;
        Ok(e)
    }

    /// Start-up facts worth reporting (backend choices, autotune results), as JSON.
    pub fn notes(&self) -> &serde_json::Value {
        &self.notes
    }

    /// Starts the engine thread around an already built model (tests use a fake one). Unless
    /// `args` gives `max_running_requests` or disables autotune, the batch cap is measured on
    /// `model` (or read from `args.autotune_cache_dir`) first, and the scheduler's
    /// `max_running_requests` is the smaller of the derived value and the cap.
    ///
    /// # Errors
    /// Compatibility or configuration errors; a failed batch-cap measurement or cache write.
    pub fn start_with_model(
        model: Box<dyn Model>,
        args: &EngineArgs,
        isa: &'static str,
    ) -> Result<Engine, EngineError> {
        Self::start_with_models(model, None, args, isa)
    }

    /// [`Engine::start_with_model`] with the STANDALONE draft model `args.speculative` asks
    /// for. The draft is checked against the target once, here: the same vocabulary size, a
    /// context at least the served one, an attention the backend runs; the KV pool is sized
    /// for both models' bytes per token (the draft's KV sits at the target's slots).
    ///
    /// # Errors
    /// As [`Engine::start_with_model`]; a draft missing, given without STANDALONE, or
    /// incompatible, with the reason.
    pub fn start_with_models(
        mut model: Box<dyn Model>,
        mut draft: Option<Box<dyn Model>>,
        args: &EngineArgs,
        isa: &'static str,
    ) -> Result<Engine, EngineError> {
        if let Some(d) = args.kv_cache_dtype {
            model.set_kv_dtype(d)?;
            if let Some(dm) = draft.as_mut() {
                dm.set_kv_dtype(d)?;
            }
        }
        let standalone = args.speculative.as_ref().is_some_and(|s| s.algorithm == SpecAlgorithm::Standalone);
        match (&draft, standalone) {
            (None, true) => {
                return Err(EngineError::Config(
                    "--speculative-algorithm STANDALONE needs a draft model (--speculative-draft-model-path)".into(),
                ))
            }
            (Some(_), false) => {
                return Err(EngineError::Config(
                    "a draft model is only used with --speculative-algorithm STANDALONE".into(),
                ))
            }
            _ => {}
        }
        let embedding = if args.is_embedding || model.embedding_only() {
            if args.speculative.is_some() {
                return Err(EngineError::Config(
                    "speculative decoding generates tokens; an embedding model (--is-embedding) generates none".into(),
                ));
            }
            Some(model.set_embedding()?)
        } else {
            None
        };
        let needs = model.attention_needs();
        let caps = match args.attention_backend {
            AttentionBackend::Auto => BACKENDS.iter().find(|b| b.kinds.contains(&needs.kind)).ok_or_else(|| {
                EngineError::Incompatible(format!("no attention backend implements {:?}", needs.kind))
            })?,
            named => BACKENDS
                .iter()
                .find(|b| b.name == named.name())
                .ok_or_else(|| EngineError::Internal(format!("backend {:?} is not registered", named.name())))?,
        };
        check_compat(&needs, caps)?;
        let state = model.state_layout();
        if state.is_some() {
            check_hybrid(args, embedding.is_some())?;
        }
        let info = model.info().clone();
        let mut bytes_per_token = needs.kv_layout.bytes_per_token();
        if let Some(dm) = &draft {
            let (di, dn) = (dm.info(), dm.attention_needs());
            if di.vocab_size != info.vocab_size {
                return Err(EngineError::Incompatible(format!(
                    "the draft model's vocabulary has {} tokens, the model's {}: a draft must share the target's \
                     tokenizer",
                    di.vocab_size, info.vocab_size
                )));
            }
            let ctx = args.context_length.unwrap_or(info.context_length).min(info.context_length);
            if di.context_length < ctx {
                return Err(EngineError::Incompatible(format!(
                    "the draft model's context is {} tokens, shorter than the {ctx} served: give --context-length {} \
                     or a draft with a longer context",
                    di.context_length, di.context_length
                )));
            }
            let dcaps = BACKENDS.iter().find(|b| b.kinds.contains(&dn.kind)).ok_or_else(|| {
                EngineError::Incompatible(format!("no attention backend implements the draft's {:?}", dn.kind))
            })?;
            check_compat(&dn, dcaps)?;
            bytes_per_token += dn.kv_layout.bytes_per_token();
        }
        let mut derived = derive_config(args, bytes_per_token, info.context_length)?;
        if args.hicache.is_some() {
            let why = if derived.disable_radix_cache {
                Some("it keeps radix-cache pages; drop --disable-radix-cache")
            } else if embedding.is_some() {
                Some("an embedding model keeps no KV after a request")
            } else if draft.is_some() {
                Some("a STANDALONE draft model's KV is not kept in the tier")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(EngineError::Config(format!("--enable-hierarchical-cache: {why}")));
            }
        }
        if let (Some(st), None) = (&state, args.max_running_requests) {
            // The state pool gets the KV pool's budget again (`--kv-cache-gb`, SGLang's
            // `mamba_full_memory_ratio` of 1): each request slot with its share of saved
            // states (`STATE_CHECKPOINTS_PER_SLOT`) as many times as they fit in it.
            let budget = (args.kv_cache_gb.max(0.0) * (1u64 << 30) as f64) as usize;
            let per = st.bytes_per_request() * (1 + STATE_CHECKPOINTS_PER_SLOT);
            derived.max_running_requests = derived.max_running_requests.min((budget / per).max(1));
        }
        if embedding.is_some() {
            // Embedding requests keep no KV: the radix cache would stay empty.
            derived.disable_radix_cache = true;
        }
        if needs.whole_sequences() {
            // An encoder computes a sequence in one step: no chunks, no cached prefixes, a
            // budget that holds the longest input.
            derived.whole_prompts = true;
            derived.disable_radix_cache = true;
            derived.chunked_prefill_size = derived.chunked_prefill_size.max(derived.context_length);
            derived.max_prefill_tokens = derived.max_prefill_tokens.max(derived.context_length);
        }
        // The batch cap is measured on DECODE steps, which an embedding engine never runs.
        let cap_args = EngineArgs { disable_autotune: args.disable_autotune || embedding.is_some(), ..args.clone() };
        let batch_cap = crate::tune::batch_cap::decide(
            model.as_mut(),
            &cap_args,
            isa,
            derived.max_running_requests,
            derived.max_total_tokens(),
        )?;
        let mut config = SchedulerConfig { max_running_requests: batch_cap.chosen, ..derived };
        if state.is_some() {
            // Saved states for prefix hits: one where each running prompt ends, the rest kept
            // by the radix cache.
            config.state_checkpoints = STATE_CHECKPOINTS_PER_SLOT * config.max_running_requests;
        }
        // Built here, so the pool's totals are published before the engine thread allocates the
        // KV storage: a `/get_server_info` right after start-up never sees an empty pool.
        let mut sched = Scheduler::with_eos_ids(config.clone(), args.eos.clone());
        sched.set_vocab_size(info.vocab_size);
        let hicache = match &args.hicache {
            Some(h) => {
                let layout = &needs.kv_layout;
                let fp = crate::kv::hicache::fingerprint(&args.model_path, layout, config.page_size);
                let page_bytes = config.page_size * layout.bytes_per_token();
                let pool_bytes = (config.max_total_tokens() * layout.bytes_per_token()) as u64;
                let (tier, scan) = DiskTier::open(h, fp, config.page_size, page_bytes, pool_bytes)
                    .map_err(|e| EngineError::Config(format!("--enable-hierarchical-cache: {e}")))?;
                let budget_bytes = tier.budget();
                sched.attach_tier(tier);
                Some(HiCacheInfo {
                    dir: h.dir.clone(),
                    budget_bytes,
                    write_policy: match h.write_policy {
                        WritePolicy::WriteThrough => "write_through",
                        WritePolicy::WriteBack => "write_back",
                    },
                    scan,
                })
            }
            None => None,
        };
        let stats = Arc::new(Mutex::new(sched.stats()));
        let (tx, rx) = mpsc::channel();
        let st = stats.clone();
        let eos = args.eos.clone();
        std::thread::Builder::new()
            .name("sparrow-engine".into())
            .spawn(move || engine_loop(model, draft, sched, eos, rx, st))
            .map_err(|e| EngineError::Config(format!("cannot spawn the engine thread: {e}")))?;
        Ok(Engine {
            tx,
            stats,
            info,
            config,
            backend: caps.name,
            isa,
            notes: serde_json::Value::Null,
            batch_cap,
            eos: args.eos.clone(),
            kv_layout: needs.kv_layout.clone(),
            state_layout: state,
            embedding,
            queued: Arc::new(AtomicUsize::new(0)),
            hicache,
        })
    }

    /// Queues a request.
    ///
    /// # Errors
    /// [`EngineError::Stopped`] when the engine thread is gone; [`EngineError::InvalidRequest`]
    /// for an embedding request to a generating engine or the other way round.
    pub fn submit(&self, req: NewRequest, sink: Sink) -> Result<(), EngineError> {
        self.submit_as(req, sink, false)
    }

    fn submit_as(&self, req: NewRequest, sink: Sink, over_limit: bool) -> Result<(), EngineError> {
        match (req.embed, self.embedding.is_some()) {
            (true, false) => {
                return Err(EngineError::InvalidRequest(
                    "this model generates text; it does not serve embeddings (start it with --is-embedding)".into(),
                ))
            }
            (false, true) => {
                return Err(EngineError::InvalidRequest(
                    "this model serves embeddings (--is-embedding or an encoder); it does not generate text".into(),
                ))
            }
            _ => {}
        }
        self.queued.fetch_add(1, Ordering::Relaxed);
        let mut slot = QueueSlot(Some(self.queued.clone()));
        let mut sink = sink;
        let counted: Sink = Box::new(move |o| {
            if matches!(o, Output::Started { .. } | Output::Finished { .. }) {
                slot.release();
            }
            sink(o)
        });
        let cmd = if over_limit { Command::SubmitOverLimit(req, counted) } else { Command::Submit(req, counted) };
        self.tx.send(cmd).map_err(|_| EngineError::Stopped)
    }

    /// Admission control (SGLang's `--max-queued-requests`): refuses a new request while the
    /// limit's worth of submitted requests wait for their first admission. Called once per
    /// API request, before its engine requests (choices, inputs) are submitted, so one API
    /// request is refused or served whole.
    ///
    /// # Errors
    /// [`EngineError::QueueFull`] with the count and the limit.
    pub fn check_queue(&self) -> Result<(), EngineError> {
        let waiting = self.queued.load(Ordering::Relaxed);
        match self.config.queue.max_queued_requests {
            Some(max) if waiting >= max => Err(EngineError::QueueFull { waiting, max }),
            _ => Ok(()),
        }
    }

    /// True under priority scheduling: a request past a full queue may then take the place of
    /// a less urgent waiting one ([`Engine::submit_over_limit`]), as SGLang's does.
    pub fn priority_scheduling(&self) -> bool {
        self.config.queue.priority.is_some()
    }

    /// Queues a request that arrived past a full queue under priority scheduling: the least
    /// urgent waiting request (not yet admitted), when less urgent than this one, is answered
    /// [`FinishReason::Overloaded`] and this one takes its place; otherwise this one is
    /// answered so (SGLang's queue-limit abort by priority).
    ///
    /// # Errors
    /// As [`Engine::submit`].
    pub fn submit_over_limit(&self, req: NewRequest, sink: Sink) -> Result<(), EngineError> {
        self.submit_as(req, sink, true)
    }

    /// Stops the engine thread after the file tier has every radix page it lacks (the pages a
    /// `write_back` tier would write on eviction) and has finished its queued writes. Requests
    /// still live are dropped. Returns the pages written, or `None` when the thread did not
    /// answer within `wait` (or was gone).
    pub fn shutdown(&self, wait: Duration) -> Option<usize> {
        let (tx, rx) = mpsc::channel();
        self.tx.send(Command::Shutdown(tx)).ok()?;
        rx.recv_timeout(wait).ok()
    }

    /// The hierarchical cache's file tier as opened (`None`: off).
    pub fn hicache(&self) -> Option<&HiCacheInfo> {
        self.hicache.as_ref()
    }

    /// Asks the engine to end a request; harmless if it already finished.
    pub fn abort(&self, id: u64) {
        // A closed channel means the engine is gone and the request with it.
        let _ = self.tx.send(Command::Abort(id));
    }

    /// Drops the radix cache's unlocked pages; `done` gets the count.
    ///
    /// # Errors
    /// [`EngineError::Stopped`] when the engine thread is gone.
    pub fn flush_cache(&self, done: Box<dyn FnOnce(usize) + Send>) -> Result<(), EngineError> {
        self.tx.send(Command::FlushCache(done)).map_err(|_| EngineError::Stopped)
    }

    /// Latest scheduler counters (updated after every step).
    pub fn stats(&self) -> SchedulerStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Model facts.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The derived scheduler configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The end-of-generation token ids a request stops on (unless it ignores EOS).
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos
    }

    /// The batch cap in effect (measured, cached, given or disabled) and the curve behind it.
    pub fn batch_cap(&self) -> &BatchCap {
        &self.batch_cap
    }

    /// What the KV cache keeps per token (its element type and bytes per token).
    pub fn kv_layout(&self) -> &crate::kv::KvLayout {
        &self.kv_layout
    }

    /// A hybrid model's recurrent state per request (`None`: attention layers only); the pool
    /// holds `max_running_requests` of them.
    pub fn state_layout(&self) -> Option<crate::kv::StateLayout> {
        self.state_layout
    }

    /// What the engine returns per embedding request, when it serves embeddings (`None`: it
    /// generates, and embedding requests are refused).
    pub fn embedding(&self) -> Option<&crate::model::EmbeddingSpec> {
        self.embedding.as_ref()
    }

    /// Attention backend name.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Kernel instruction set name.
    pub fn isa(&self) -> &'static str {
        self.isa
    }
}

/// Saved states of a hybrid model per request slot ([`SchedulerConfig::state_checkpoints`]).
pub const STATE_CHECKPOINTS_PER_SLOT: usize = 2;

/// Refuses, by capability, what a hybrid model's recurrent state cannot do yet: speculative
/// decoding (a rejected proposal would need the state rolled back to the last accepted
/// token), the file tier (its blocks hold KV pages, not states) and embeddings.
fn check_hybrid(args: &EngineArgs, embedding: bool) -> Result<(), EngineError> {
    let why = if args.speculative.is_some() {
        Some("--speculative-algorithm: a rejected proposal would need the recurrent state rolled back to the last accepted token, which the state pool does not keep")
    } else if args.hicache.is_some() {
        Some("--enable-hierarchical-cache: the file tier stores KV pages, not the recurrent states a prefix of this model needs")
    } else if embedding {
        Some("--is-embedding: embeddings are served by attention-only models")
    } else {
        None
    };
    match why {
        Some(w) => Err(EngineError::Incompatible(format!("the model has recurrent (linear-attention) layers; {w}"))),
        None => Ok(()),
    }
}

struct Live {
    sched: Scheduler,
    kv: KvStore,
    /// The STANDALONE draft model's KV store (same slots as `kv`).
    draft_kv: Option<KvStore>,
    sinks: std::collections::HashMap<u64, Sink>,
}

fn engine_loop(
    mut model: Box<dyn Model>,
    mut draft: Option<Box<dyn Model>>,
    sched: Scheduler,
    eos: Vec<u32>,
    rx: mpsc::Receiver<Command>,
    stats: Arc<Mutex<SchedulerStats>>,
) {
    let cfg = sched.config().clone();
    let kv = crate::model::kv_store(model.as_ref(), sched.num_slots(), cfg.max_running_requests, cfg.state_checkpoints);
    let draft_layout = draft.as_ref().map(|d| d.attention_needs().kv_layout);
    let draft_kv = draft_layout.as_ref().map(|l| KvStore::new(l.clone(), sched.num_slots()));
    let mut live = Live { sched, kv, draft_kv, sinks: Default::default() };
    publish(&live, &stats);
    loop {
        let cmd = if live.sched.is_idle() {
            // Pages cached by the last step reach the file tier before the thread sleeps.
            live.sched.sync_tier(&mut live.kv);
            publish(&live, &stats);
            match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => return,
            }
        } else {
            match rx.try_recv() {
                Ok(c) => Some(c),
                Err(mpsc::TryRecvError::Empty) => None,
                Err(mpsc::TryRecvError::Disconnected) => return,
            }
        };
        let mut replies = Vec::new();
        if let Some(c) = cmd {
            let mut next = Some(c);
            while let Some(c) = next {
                if let Command::Shutdown(done) = c {
                    let n = live.sched.close_tier(&mut live.kv);
                    let _ = done.send(n);
                    return;
                }
                handle(&mut live, c, &mut replies);
                next = rx.try_recv().ok();
            }
        }
        if !replies.is_empty() {
            // Publish first, so a caller that reads the stats after the reply sees the effect.
            publish(&live, &stats);
            for r in replies {
                r();
            }
        }
        if live.sched.is_idle() {
            publish(&live, &stats);
            continue;
        }
        let step = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let d = draft.as_mut().zip(live.draft_kv.as_mut()).map(|(m, k)| (m.as_mut() as &mut dyn Model, k));
            live.sched.step_with_draft(model.as_mut(), &mut live.kv, d)
        }));
        match step {
            Ok(outs) => {
                let progressed = !outs.is_empty();
                // Publish before the sinks run, so a caller that reads the stats after its
                // request finished sees the pages it freed.
                publish(&live, &stats);
                route(&mut live, outs);
                if !progressed && live.sched.last_batch().is_none() {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            Err(_) => {
                // A bug, not a request: fail everything live and start over with a clean pool.
                for (id, mut sink) in live.sinks.drain() {
                    sink(Output::Finished {
                        id,
                        reason: FinishReason::Error("internal engine error; the request was dropped".into()),
                        usage: Default::default(),
                    });
                }
                let tier = live.sched.take_tier();
                live.sched = Scheduler::with_eos_ids(cfg.clone(), eos.clone());
                live.sched.set_vocab_size(model.info().vocab_size);
                if let Some(t) = tier {
                    live.sched.attach_tier(t);
                }
                live.kv = crate::model::kv_store(
                    model.as_ref(),
                    live.sched.num_slots(),
                    cfg.max_running_requests,
                    cfg.state_checkpoints,
                );
                live.draft_kv = draft_layout.as_ref().map(|l| KvStore::new(l.clone(), live.sched.num_slots()));
            }
        }
        publish(&live, &stats);
    }
}

fn publish(live: &Live, stats: &Mutex<SchedulerStats>) {
    if let Ok(mut s) = stats.lock() {
        *s = live.sched.stats();
    }
}

fn handle(live: &mut Live, cmd: Command, replies: &mut Vec<Box<dyn FnOnce()>>) {
    match cmd {
        Command::Submit(req, mut sink) => {
            let id = req.id;
            match live.sched.submit(req) {
                Ok(()) => {
                    live.sinks.insert(id, sink);
                }
                Err(e) => {
                    sink(Output::Finished {
                        id,
                        reason: FinishReason::Error(e.to_string()),
                        usage: Default::default(),
                    });
                }
            }
        }
        Command::SubmitOverLimit(req, mut sink) => {
            let id = req.id;
            match live.sched.submit_over_limit(req) {
                Ok(displaced) => {
                    live.sinks.insert(id, sink);
                    route(live, vec![displaced]);
                }
                Err(e) => {
                    let reason = match e {
                        EngineError::QueueFull { .. } => FinishReason::Overloaded(e.to_string()),
                        e => FinishReason::Error(e.to_string()),
                    };
                    sink(Output::Finished { id, reason, usage: Default::default() });
                }
            }
        }
        Command::Abort(id) => {
            if let Some(o) = live.sched.abort(id) {
                route(live, vec![o]);
            }
        }
        Command::FlushCache(done) => {
            let n = live.sched.flush_cache();
            replies.push(Box::new(move || done(n)));
        }
        // Handled by the loop, which stops after it.
        Command::Shutdown(_) => {}
    }
}

fn route(live: &mut Live, outs: Vec<Output>) {
    let mut gone = Vec::new();
    for o in outs {
        let id = match &o {
            Output::Started { id, .. }
            | Output::Token { id, .. }
            | Output::PromptLogprobs { id, .. }
            | Output::Embedding { id, .. }
            | Output::Finished { id, .. } => *id,
        };
        let finished = matches!(o, Output::Finished { .. });
        if let Some(sink) = live.sinks.get_mut(&id) {
            if !sink(o) && !finished {
                gone.push(id);
            }
        }
        if finished {
            live.sinks.remove(&id);
        }
    }
    for id in gone {
        live.sinks.remove(&id);
        live.sched.abort(id);
    }
}
