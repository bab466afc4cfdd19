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
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::kv::KvStore;
use crate::model::llama::LlamaModel;
use crate::model::{check_compat, Model, ModelInfo, BACKENDS};
use crate::request::{FinishReason, NewRequest, Output};
use crate::scheduler::{SchedulePolicy, Scheduler, SchedulerConfig, SchedulerStats};
use crate::EngineError;

/// Receives a request's outputs on the engine thread; returns `false` once nobody listens.
pub type Sink = Box<dyn FnMut(Output) -> bool + Send>;

/// Messages to the engine thread.
pub enum Command {
    /// Queue a request; its outputs go to the sink.
    Submit(NewRequest, Sink),
    /// End a request (queued or running).
    Abort(u64),
    /// Drop unlocked radix-cache pages; the callback gets the pages freed.
    FlushCache(Box<dyn FnOnce(usize) + Send>),
}

/// Start-up options (the `sparrow serve` flags that concern the engine).
#[derive(Debug, Clone)]
pub struct EngineArgs {
    /// GGUF model file.
    pub model_path: PathBuf,
    /// Compute threads (caller included).
    pub threads: usize,
    /// Slots per KV page.
    pub page_size: usize,
    /// KV pool size in tokens; derived from `kv_cache_gb` when `None`.
    pub max_total_tokens: Option<usize>,
    /// KV memory budget in GiB (used when `max_total_tokens` is `None`).
    pub kv_cache_gb: f64,
    /// Derived from the pool the way SGLang derives it when `None`.
    pub max_running_requests: Option<usize>,
    /// Prefill chunk size in tokens.
    pub chunked_prefill_size: usize,
    /// Prefill tokens per batch.
    pub max_prefill_tokens: usize,
    /// Overrides the model's context length (must not exceed it).
    pub context_length: Option<usize>,
    /// Radix prefix cache off.
    pub disable_radix_cache: bool,
    /// Admission order.
    pub schedule_policy: SchedulePolicy,
    /// Attention backend name (`auto` picks the first backend that implements the model's
    /// attention).
    pub attention_backend: String,
    /// DSA attention for EXTEND rows (`sparse` or `dense`).
    pub nsa_prefill_backend: String,
    /// DSA attention for DECODE rows (`sparse` or `dense`).
    pub nsa_decode_backend: String,
    /// MoE implementation: `auto` (autotuned, or a default when autotune is off),
    /// `token_major` or `expert_major`.
    pub moe_runner_backend: String,
    /// Skip the start-up MoE autotune.
    pub disable_autotune: bool,
    /// Where autotune results are kept (none: not kept).
    pub autotune_cache_dir: Option<PathBuf>,
    /// End-of-sequence tokens (the tokenizer's, and the model's `eos_token_id` list).
    pub eos: Vec<u32>,
}

impl EngineArgs {
    /// `sparrow serve`'s defaults for `model_path` (one compute thread): callers that drive
    /// the engine directly change only what they need with struct-update syntax.
    pub fn new(model_path: PathBuf) -> Self {
        EngineArgs {
            model_path,
            threads: 1,
            page_size: 1,
            max_total_tokens: None,
            kv_cache_gb: 4.0,
            max_running_requests: None,
            chunked_prefill_size: 512,
            max_prefill_tokens: 16384,
            context_length: None,
            disable_radix_cache: false,
            schedule_policy: SchedulePolicy::Fcfs,
            attention_backend: "auto".into(),
            nsa_prefill_backend: "sparse".into(),
            nsa_decode_backend: "sparse".into(),
            moe_runner_backend: "auto".into(),
            disable_autotune: false,
            autotune_cache_dir: None,
            eos: Vec::new(),
        }
    }
}

/// Largest `--max-running-requests` accepted (request slots are 32-bit and preallocated).
pub const MAX_RUNNING_LIMIT: usize = 1 << 16;

/// Derives the scheduler configuration from flags and the model, as SGLang does
/// (`model_executor/model_runner.py`): the request pool holds
/// `clamp(max_total_tokens / context_len · 512, 2048, 4096)` rows and
/// `max_running_requests = min(max_total_tokens / 2, that)` unless given.
///
/// # Errors
/// [`EngineError::Config`] for contradicting flags.
pub fn derive_config(
    args: &EngineArgs,
    bytes_per_token: usize,
    model_ctx: usize,
) -> Result<SchedulerConfig, EngineError> {
    let cerr = |m: String| Err(EngineError::Config(m));
    if !(1..=4096).contains(&args.page_size) {
        return cerr(format!("--page-size {} must be between 1 and 4096", args.page_size));
    }
    if bytes_per_token == 0 {
        return cerr("the model's KV layout has no bytes per token (no layers?)".into());
    }
    let ctx = args.context_length.unwrap_or(model_ctx);
    if ctx == 0 || ctx > model_ctx {
        return cerr(format!("--context-length {ctx} must be between 1 and the model's {model_ctx}"));
    }
    let total = match args.max_total_tokens {
        Some(t) => t,
        None => {
            if args.kv_cache_gb.is_nan() || args.kv_cache_gb <= 0.0 {
                return cerr(format!("--kv-cache-gb {} must be positive", args.kv_cache_gb));
            }
            (args.kv_cache_gb * (1u64 << 30) as f64 / bytes_per_token as f64) as usize
        }
    };
    let num_pages = total / args.page_size;
    if num_pages == 0 {
        return cerr(format!("a KV pool of {total} tokens holds no page of {} tokens", args.page_size));
    }
    let total = num_pages * args.page_size;
    if (num_pages + 1) * args.page_size > u32::MAX as usize {
        return cerr(format!("a KV pool of {total} tokens exceeds the 32-bit slot index space"));
    }
    let req_pool = (total as f64 / ctx as f64 * 512.0) as usize;
    let req_pool = req_pool.clamp(2048, 4096);
    let max_running = match args.max_running_requests {
        Some(0) => return cerr("--max-running-requests must be at least 1".into()),
        Some(m) if m > MAX_RUNNING_LIMIT => {
            return cerr(format!("--max-running-requests {m} is above the limit of {MAX_RUNNING_LIMIT}"))
        }
        Some(m) => m,
        None => (total / 2).min(req_pool).max(1),
    };
    if args.chunked_prefill_size == 0 || args.max_prefill_tokens == 0 {
        return cerr("--chunked-prefill-size and --max-prefill-tokens must be positive".into());
    }
    Ok(SchedulerConfig {
        page_size: args.page_size,
        num_pages,
        max_running_requests: max_running,
        chunked_prefill_size: args.chunked_prefill_size,
        max_prefill_tokens: args.max_prefill_tokens,
        context_length: ctx,
        disable_radix_cache: args.disable_radix_cache,
        policy: args.schedule_policy,
    })
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
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("info", &self.info).field("config", &self.config).finish()
    }
}

impl Engine {
    /// Loads the model, checks it against the backend, sizes the KV pool and starts the thread.
    ///
    /// # Errors
    /// Loading, compatibility or configuration errors, all before any request is accepted.
    pub fn start(args: &EngineArgs) -> Result<Engine, EngineError> {
        let (model, isa, notes) = load_model(args)?;
        let mut e = Self::start_with_model(model, args, isa)?;
        e.notes = notes;
        Ok(e)
    }

    /// Start-up facts worth reporting (backend choices, autotune results), as JSON.
    pub fn notes(&self) -> &serde_json::Value {
        &self.notes
    }

    /// Starts the engine thread around an already built model (tests use a fake one).
    ///
    /// # Errors
    /// Compatibility or configuration errors.
    pub fn start_with_model(
        model: Box<dyn Model>,
        args: &EngineArgs,
        isa: &'static str,
    ) -> Result<Engine, EngineError> {
        let needs = model.attention_needs();
        let caps = if args.attention_backend == "auto" {
            BACKENDS
                .iter()
                .find(|b| b.kinds.contains(&needs.kind))
                .ok_or_else(|| EngineError::Incompatible(format!("no attention backend implements {:?}", needs.kind)))?
        } else {
            BACKENDS.iter().find(|b| b.name == args.attention_backend).ok_or_else(|| {
                let names: Vec<&str> = BACKENDS.iter().map(|b| b.name).collect();
                EngineError::Config(format!(
                    "unknown --attention-backend {:?} (have: auto, {})",
                    args.attention_backend,
                    names.join(", ")
                ))
            })?
        };
        check_compat(&needs, caps)?;
        let info = model.info().clone();
        let config = derive_config(args, needs.kv_layout.bytes_per_token(), info.context_length)?;
        let stats = Arc::new(Mutex::new(SchedulerStats::default()));
        let (tx, rx) = mpsc::channel();
        let cfg = config.clone();
        let st = stats.clone();
        let eos = args.eos.clone();
        std::thread::Builder::new()
            .name("sparrow-engine".into())
            .spawn(move || engine_loop(model, cfg, eos, rx, st))
            .map_err(|e| EngineError::Config(format!("cannot spawn the engine thread: {e}")))?;
        Ok(Engine { tx, stats, info, config, backend: caps.name, isa, notes: serde_json::Value::Null })
    }

    /// Queues a request.
    ///
    /// # Errors
    /// [`EngineError::Stopped`] when the engine thread is gone.
    pub fn submit(&self, req: NewRequest, sink: Sink) -> Result<(), EngineError> {
        self.tx.send(Command::Submit(req, sink)).map_err(|_| EngineError::Stopped)
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

    /// Attention backend name.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Kernel instruction set name.
    pub fn isa(&self) -> &'static str {
        self.isa
    }
}

/// Loads the model `args.model_path` names: a GGUF file (Llama family), or a Hugging Face
/// checkpoint directory whose `config.json` says `glm_moe_dsa` (GLM-5) or `llama`. For GLM-5
/// the NSA backends and the MoE implementation are applied, autotuning the MoE choice unless
/// told otherwise. Returns the model, its kernel ISA name, and start-up notes.
///
/// # Errors
/// Unreadable or unsupported checkpoints, unknown backend names.
pub fn load_model(args: &EngineArgs) -> Result<(Box<dyn Model>, &'static str, serde_json::Value), EngineError> {
    use crate::model::glm5::{AttnImpl, Glm5Model, Glm5Options, MoeChoice, MoeImpl};
    let p = &args.model_path;
    // Checked for every model, so a typo is caught even where the flag has no effect.
    let prefill_attn = AttnImpl::parse("--nsa-prefill-backend", &args.nsa_prefill_backend)?;
    let decode_attn = AttnImpl::parse("--nsa-decode-backend", &args.nsa_decode_backend)?;
    let fixed = match args.moe_runner_backend.as_str() {
        "auto" => None,
        "token_major" => Some(MoeImpl::TokenMajor),
        "expert_major" => Some(MoeImpl::ExpertMajor),
        other => {
            return Err(EngineError::Config(format!(
                "--moe-runner-backend {other:?} is unknown (have: auto, token_major, expert_major{})",
                if ["triton", "triton_kernel", "deep_gemm", "cutlass"].contains(&other)
                    || other.starts_with("flashinfer")
                {
                    "; SGLang's CUDA MoE kernels do not exist in this CPU build"
                } else {
                    ""
                }
            )))
        }
    };
    if p.is_dir() {
        let cfg = crate::checkpoint::hf::read_json(&p.join("config.json"))?;
        let mt = cfg.get("model_type").and_then(|v| v.as_str()).unwrap_or("").to_owned();
        match mt.as_str() {
            "glm_moe_dsa" => {
                let opts = Glm5Options {
                    prefill_attn,
                    decode_attn,
                    moe: MoeChoice::Fixed(fixed.unwrap_or(MoeImpl::ExpertMajor)),
                };
                let mut m = Glm5Model::load(p, args.threads, opts.clone())?;
                let mut notes = serde_json::json!({
                    "nsa_prefill_backend": args.nsa_prefill_backend,
                    "nsa_decode_backend": args.nsa_decode_backend,
                });
                let moe = match fixed {
                    Some(f) => {
                        notes["moe_runner_backend"] = f.name().into();
                        MoeChoice::Fixed(f)
                    }
                    None if m.first_moe().is_none() => {
                        notes["moe_runner_backend"] = "auto (no MoE layer)".into();
                        MoeChoice::Fixed(MoeImpl::ExpertMajor)
                    }
                    None if args.disable_autotune => {
                        // Without timings: a GEMV per pair for one token, grouped GEMMs beyond.
                        notes["moe_runner_backend"] =
                            "auto (autotune disabled: token_major for 1 token, expert_major beyond)".into();
                        MoeChoice::Buckets(vec![(1, MoeImpl::TokenMajor), (usize::MAX, MoeImpl::ExpertMajor)])
                    }
                    None => {
                        let max_tokens = args.chunked_prefill_size.min(args.max_prefill_tokens).clamp(1, 1024);
                        let bl = crate::autotune::buckets(max_tokens);
                        let key = crate::autotune::key(&m, bl.last().copied().unwrap_or(1));
                        let cached =
                            args.autotune_cache_dir.as_deref().and_then(|d| crate::autotune::load(d, &key, &bl));
                        let (tune, source) = match cached {
                            Some(t) => (t, "cache"),
                            None => (crate::autotune::tune(&m, &bl, args.autotune_cache_dir.as_deref())?, "measured"),
                        };
                        notes["moe_runner_backend"] = "auto".into();
                        notes["moe_autotune"] = serde_json::json!({
                            "source": source,
                            "key": tune.key,
                            "file": args.autotune_cache_dir.as_ref().map(|d| d.join(format!("{}.json", tune.key))),
                            "summary": tune.summary(),
                        });
                        MoeChoice::Buckets(tune.choices())
                    }
                };
                m.set_options(Glm5Options { moe, ..opts });
                let isa = m.isa().name();
                Ok((Box::new(m), isa, notes))
            }
            "llama" => {
                let m = LlamaModel::load_hf(p, args.threads)?;
                let isa = m.isa().name();
                Ok((Box::new(m), isa, serde_json::Value::Null))
            }
            other => Err(EngineError::Model(format!(
                "{}: model_type {other:?} is not supported (glm_moe_dsa and llama checkpoints, or Llama GGUF files)",
                p.display()
            ))),
        }
    } else {
        let m = LlamaModel::load(p, args.threads)?;
        let isa = m.isa().name();
        Ok((Box::new(m), isa, serde_json::Value::Null))
    }
}

struct Live {
    sched: Scheduler,
    kv: KvStore,
    sinks: std::collections::HashMap<u64, Sink>,
}

fn engine_loop(
    mut model: Box<dyn Model>,
    cfg: SchedulerConfig,
    eos: Vec<u32>,
    rx: mpsc::Receiver<Command>,
    stats: Arc<Mutex<SchedulerStats>>,
) {
    let layout = model.attention_needs().kv_layout;
    let fresh = |cfg: &SchedulerConfig| {
        let sched = Scheduler::with_eos_ids(cfg.clone(), eos.clone());
        let kv = KvStore::new(layout.clone(), sched.num_slots());
        (sched, kv)
    };
    let (sched, kv) = fresh(&cfg);
    let mut live = Live { sched, kv, sinks: Default::default() };
    publish(&live, &stats);
    loop {
        let cmd = if live.sched.is_idle() {
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
            handle(&mut live, c, &mut replies);
            while let Ok(c) = rx.try_recv() {
                handle(&mut live, c, &mut replies);
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
        let step = std::panic::catch_unwind(AssertUnwindSafe(|| live.sched.step(model.as_mut(), &mut live.kv)));
        match step {
            Ok(outs) => {
                let progressed = !outs.is_empty();
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
                let (sched, kv) = fresh(&cfg);
                live.sched = sched;
                live.kv = kv;
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
        Command::Abort(id) => {
            if let Some(o) = live.sched.abort(id) {
                route(live, vec![o]);
            }
        }
        Command::FlushCache(done) => {
            let n = live.sched.flush_cache();
            replies.push(Box::new(move || done(n)));
        }
    }
}

fn route(live: &mut Live, outs: Vec<Output>) {
    let mut gone = Vec::new();
    for o in outs {
        let id = match &o {
            Output::Started { id, .. } | Output::Token { id, .. } | Output::Finished { id, .. } => *id,
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
