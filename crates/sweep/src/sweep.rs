//! The sweep itself: steps one after another (never two at once), servers launched and
//! stopped, a memory watch and a hang watch around every step, a verdict after it, every
//! result written the moment it exists.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Map, Value};
use sparrow_bench::args::BenchArgs;
use sparrow_bench::report as bench_report;
use sparrow_bench::run::{self as bench_run, exit, BenchError, RunHooks, RunOutcome};
use tokio_util::sync::CancellationToken;

use crate::analysis::fmt_value;
use crate::args::{Axis, OnCrash, Restart, Side, SweepConfig};
use crate::forensics::{self, Verdict, VerdictKind};
use crate::monitor::{gib, MemEvidence, MemWatch};
use crate::report::{self, Machine, Report};
use crate::server::{self, Server};
use crate::step::{Slos, Status, StepResult};

/// Errors that end a sweep before or outside its steps.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The output folder cannot be used.
    #[error("{0}")]
    Setup(String),
    /// A result file could not be written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SweepError + '_ {
    move |source| SweepError::Io { path: path.to_owned(), source }
}

/// What became of a server after a step in which it stopped answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    /// It answers again.
    Alive,
    /// Alive but silent to the end of the hang window.
    Silent,
    /// Its process ended (or, not launched by the sweep, it refuses connections).
    Ended,
    /// A signal came before it was decided.
    Interrupted,
}

/// One planned step.
#[derive(Debug, Clone, Copy)]
struct Plan {
    value_index: usize,
    repeat: usize,
    side: usize,
}

/// What was seen while a step ran.
struct Observed {
    outcome: Result<RunOutcome, BenchError>,
    mem: MemEvidence,
    /// Set when the sweep judged the server hung and stopped the step.
    hang: Option<String>,
    /// When the server last showed life (a /health answer or a byte on a stream).
    last_life: Instant,
}

/// A sweep in progress.
pub struct Sweep {
    cfg: SweepConfig,
    argv: Vec<String>,
    dir: PathBuf,
    started: String,
    machine: Machine,
    http: reqwest::Client,
    steps: Vec<StepResult>,
    servers: Vec<Option<Server>>,
    launches: usize,
    previous: HashMap<String, StepResult>,
    interrupt: CancellationToken,
    interrupt_code: Arc<Mutex<Option<i32>>>,
    /// The tokenizer every step of both sides builds its prompts with.
    tokenizer: Option<PathBuf>,
    /// Held while the sweep runs: no other sweep writes this folder meanwhile.
    _folder: server::FolderLock,
}

/// The default output folder: `sweep-YYYYMMDD-HHMMSS` (UTC).
fn default_dir() -> PathBuf {
    let t = server::utc(SystemTime::now());
    let digits: String = t.chars().filter(char::is_ascii_digit).take(14).collect();
    PathBuf::from(format!("sweep-{}-{}", &digits[..8], &digits[8..]))
}

/// What makes two steps the same measurement: the side (label, command, address), the
/// step's effective settings (concurrency, rate, prompts, seed, repeat) and the bench flags.
fn step_key(cfg: &SweepConfig, side: &Side, vi: usize, r: usize) -> String {
    format!(
        "{}|{}|{}|concurrency={}|rate={}|prompts={}|seed={}|repeat={r}|{}",
        side.label,
        side.server_cmd.as_deref().unwrap_or("-"),
        side.base_url,
        cfg.concurrency(vi).map_or("-".into(), |c| c.to_string()),
        fmt_value(cfg.request_rate(vi)),
        cfg.num_prompts(vi),
        cfg.seed(vi, r),
        cfg.bench_argv.join("\u{1f}")
    )
}

/// The bench's JSONL pairs as a JSON object, without the keys the step holds itself.
fn bench_keys(o: &RunOutcome) -> Map<String, Value> {
    let mut m = Map::new();
    for (k, v) in bench_report::result_pairs(&o.summary, &o.metrics) {
        let v = v.to_value();
        match k.as_str() {
            "completed" | "failed" | "request_rate" => {}
            "concurrency" => {
                m.insert("mean_concurrency".into(), v);
            }
            _ => {
                m.insert(k, v);
            }
        }
    }
    m
}

/// The sweep owns SIGINT/SIGTERM: the first ends the current step cleanly (its results are
/// saved, its server stopped); a second kills every server's group and exits at once.
async fn signals(token: CancellationToken, code: Arc<Mutex<Option<i32>>>) {
    let (got, _) = bench_run::interrupted().await;
    if let Ok(mut c) = code.lock() {
        *c = Some(got);
    }
    token.cancel();
    sparrow_bench::errln!(
        "sparrow sweep: stopping: the current step ends now and what it measured is saved (again to quit at once)"
    );
    let _ = bench_run::interrupted().await;
    sparrow_bench::errln!("sparrow sweep: second signal: killing the servers and quitting");
    server::kill_all_groups();
    std::process::exit(got);
}

impl Sweep {
    /// Prepares a sweep: the output folder (new, or the one to resume) and earlier results.
    ///
    /// # Errors
    /// [`SweepError`] when the folder cannot be created, or holds a sweep and `--resume` was
    /// not given.
    pub fn new(cfg: SweepConfig, argv: Vec<String>) -> Result<Sweep, SweepError> {
        let dir = cfg.args.output_dir.clone().unwrap_or_else(default_dir);
        let steps_file = dir.join("steps.jsonl");
        if steps_file.exists() && !cfg.args.resume {
            return Err(SweepError::Setup(format!(
                "{} already holds a sweep: pass --resume to continue it, or another --output-dir",
                dir.display()
            )));
        }
        std::fs::create_dir_all(dir.join("steps")).map_err(io_err(&dir))?;
        let folder = server::claim_folder(&dir).map_err(|e| SweepError::Setup(e.to_string()))?;
        let mut previous = HashMap::new();
        if cfg.args.resume {
            // Lossy: a line torn by a kill may end inside a multi-byte character, and must not
            // make the whole file unreadable.
            let text = std::fs::read(&steps_file).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
            if !text.is_empty() && !text.ends_with('\n') {
                // A line cut by a kill: end it, so the next one starts on its own line.
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&steps_file)
                    .and_then(|mut f| f.write_all(b"\n"))
                    .map_err(io_err(&steps_file))?;
            }
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                // A line cut by a kill is skipped: its step simply runs again.
                if let Ok(s) = serde_json::from_str::<StepResult>(line) {
                    if s.status == Status::Ok {
                        previous.insert(s.key.clone(), s);
                    } else {
                        previous.remove(&s.key);
                    }
                }
            }
        }
        // Server logs of an earlier run of this folder are kept: numbering goes on after them.
        let launches = std::fs::read_dir(&dir)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| {
                        let n = e.file_name().to_string_lossy().into_owned();
                        n.strip_prefix("server-")?.strip_suffix(".log")?.parse::<usize>().ok()
                    })
                    .max()
                    .unwrap_or(0)
            })
            .unwrap_or(0);
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| SweepError::Setup(format!("cannot build HTTP client: {e}")))?;
        let n_sides = cfg.sides.len();
        Ok(Sweep {
            cfg,
            argv,
            dir,
            started: server::utc(SystemTime::now()),
            machine: Machine::read(),
            http,
            steps: vec![],
            servers: (0..n_sides).map(|_| None).collect(),
            launches,
            previous,
            interrupt: CancellationToken::new(),
            interrupt_code: Arc::default(),
            tokenizer: None,
            _folder: folder,
        })
    }

    /// The output folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn plan(&self) -> Vec<Plan> {
        let mut p = vec![];
        for value_index in 0..self.cfg.axis.len() {
            for repeat in 0..self.cfg.args.repeat {
                for side in 0..self.cfg.sides.len() {
                    p.push(Plan { value_index, repeat, side });
                }
            }
        }
        p
    }

    fn step_name(&self, k: usize, p: Plan) -> String {
        let axis = match self.cfg.axis {
            Axis::Concurrency(_) => "c",
            Axis::RequestRate(_) => "r",
        };
        let rep = if self.cfg.args.repeat > 1 { format!("-rep{}", p.repeat + 1) } else { String::new() };
        format!(
            "{:02}-{}-{axis}{}{rep}",
            k + 1,
            self.cfg.sides[p.side].label,
            fmt_value(self.cfg.axis.value(p.value_index))
        )
    }

    fn blank(&self, k: usize, p: Plan, status: Status, evidence: String) -> StepResult {
        let side = &self.cfg.sides[p.side];
        StepResult {
            step: k + 1,
            key: step_key(&self.cfg, side, p.value_index, p.repeat),
            label: side.label.clone(),
            value_index: p.value_index,
            repeat: p.repeat,
            concurrency: self.cfg.concurrency(p.value_index),
            request_rate: self.cfg.request_rate(p.value_index),
            seed: self.cfg.seed(p.value_index, p.repeat),
            num_prompts: self.cfg.num_prompts(p.value_index),
            status,
            verdict: None,
            evidence,
            quote: None,
            error_type: None,
            location: None,
            context: vec![],
            completed: 0,
            failed: 0,
            server_log: None,
            peak_rss_bytes: None,
            goodput: None,
            slo_attainment: None,
            block_file: None,
            bench: Map::new(),
        }
    }

    fn rel(&self, p: &Path) -> String {
        p.strip_prefix(&self.dir).unwrap_or(p).display().to_string()
    }

    /// Appends the step to `steps.jsonl` and rewrites the summary, plots and report.
    fn record(&mut self, s: StepResult) -> Result<(), SweepError> {
        let path = self.dir.join("steps.jsonl");
        // One write per line: a kill can cut the line short but never glue two together.
        let line = serde_json::to_string(&s).unwrap_or_default() + "\n";
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(io_err(&path))?;
        self.steps.push(s);
        self.write_report().map(|_| ())
    }

    fn write_report(&self) -> Result<String, SweepError> {
        let r = Report {
            cfg: &self.cfg,
            argv: &self.argv,
            started: self.started.clone(),
            steps: &self.steps,
            machine: &self.machine,
        };
        report::write_all(&r, &self.dir).map_err(io_err(&self.dir))
    }

    /// Makes sure side `i`'s server runs (when the sweep launches it); on failure, the
    /// verdict of the failed start.
    async fn ensure_server(
        &mut self,
        i: usize,
        from_step: usize,
    ) -> Result<(), (Verdict, Option<String>, MemEvidence)> {
        let side: Side = self.cfg.sides[i].clone();
        let Some(cmd) = side.server_cmd.clone() else { return Ok(()) };
        if let Some(s) = self.servers[i].as_mut() {
            if s.exited().is_none() {
                return Ok(());
            }
        }
        if let Some(mut old) = self.servers[i].take() {
            // A death right after a step is judged with that step; one between steps only
            // shows here.
            let how = old.stop(self.cfg.stop_grace).await;
            sparrow_bench::errln!(
                "sparrow sweep: warning: server {} of {} ended between steps ({how}); relaunching",
                old.index,
                side.label
            );
        }
        // Two sides at one address cannot both be up: the other side's server makes way.
        for j in 0..self.servers.len() {
            if j != i && self.cfg.sides[j].base_url == side.base_url {
                if let Some(mut other) = self.servers[j].take() {
                    sparrow_bench::errln!(
                        "sparrow sweep: stopping {}'s server (same address as {})",
                        self.cfg.sides[j].label,
                        side.label
                    );
                    other.stop(self.cfg.stop_grace).await;
                }
            }
        }
        let url = format!("{}{}", side.base_url, self.cfg.args.ready_path);
        // Whatever answers before the launch would pass for the new server's readiness.
        let t = Instant::now();
        while server::answers(&self.http, &url, Duration::from_secs(2)).await {
            if t.elapsed() > self.cfg.stop_grace {
                let why = format!(
                    "{url} already answers before the server is launched: another process holds the address (stop it, or give another --port/--base-url; a server left by a sweep that was killed is stopped by `--resume --output-dir <its folder>`, which holds its server-<n>.pid)"
                );
                return Err((Verdict::plain(VerdictKind::Exited, why), None, MemEvidence::default()));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        self.launches += 1;
        let log = self.dir.join(format!("server-{}.log", self.launches));
        sparrow_bench::errln!(
            "sparrow sweep: launching server {} for {} (step {}): {cmd}",
            self.launches,
            side.label,
            from_step + 1
        );
        let mut srv = match Server::launch(&cmd, self.launches, &log) {
            Ok(s) => s,
            Err(e) => return Err((Verdict::plain(VerdictKind::Exited, e.to_string()), None, MemEvidence::default())),
        };
        let rel = self.rel(&log);
        let mut watch = MemWatch::new(Some(srv.pid), self.cfg.args.cgroup_dir.clone());
        let ready = tokio::select! {
            r = server::wait_ready(&mut srv, &self.http, &url, self.cfg.startup_timeout, &mut watch) => r,
            () = self.interrupt.cancelled() => Err("interrupted while the server was starting".into()),
        };
        match ready {
            Ok(t) => {
                sparrow_bench::errln!(
                    "sparrow sweep: server {} ready after {:.1} s (log: {rel})",
                    srv.index,
                    t.as_secs_f64()
                );
                self.servers[i] = Some(srv);
                Ok(())
            }
            Err(why) => {
                let _ = watch.sample(Some(srv.pid)).await;
                let exit = srv.wait_exit(Duration::from_secs(2)).await;
                let how = srv.stop(self.cfg.stop_grace).await;
                let mut mem = watch.finish();
                mem.refresh_oom_kills();
                let log_text = std::fs::read_to_string(&log).unwrap_or_default();
                let v = match exit {
                    Some(e) => {
                        let mut v = forensics::classify_death(&log_text, 1, e, &mem);
                        v.evidence = format!("did not become ready: {}", v.evidence);
                        v
                    }
                    None => Verdict::plain(
                        if self.interrupt.is_cancelled() { VerdictKind::Ok } else { VerdictKind::Hang },
                        format!("{why}; {how}; {}", mem.describe()),
                    ),
                };
                Err((v, Some(rel), mem))
            }
        }
    }

    /// The tokenizer for every step: `--tokenizer`, else a local `--model`, else the path the
    /// first side's server reports in `/get_model_info` (when readable here). Found once, so
    /// that B builds its prompts exactly as A does even if its server names another file.
    async fn tokenizer_for(&mut self, side: usize) -> Option<PathBuf> {
        let a = &self.cfg.bench.args;
        if a.tokenizer.is_some() {
            return a.tokenizer.clone();
        }
        if self.tokenizer.is_none() {
            self.tokenizer = a.model.as_deref().map(PathBuf::from).filter(|p| p.exists());
        }
        if self.tokenizer.is_none() {
            let url = format!("{}/get_model_info", self.cfg.sides[side].base_url);
            if let Ok(r) = self.http.get(&url).timeout(Duration::from_secs(10)).send().await {
                if let Ok(v) = r.json::<Value>().await {
                    self.tokenizer = ["tokenizer_path", "model_path"]
                        .iter()
                        .filter_map(|k| v.get(*k).and_then(Value::as_str).map(PathBuf::from))
                        .find(|p| p.exists());
                }
            }
        }
        self.tokenizer.clone()
    }

    /// Runs one bench step with the memory and hang watches around it.
    async fn observe(&mut self, side: usize, bench: BenchArgs, prefix: String) -> Observed {
        let cfg = match bench.validate() {
            Ok(c) => c,
            Err(e) => {
                return Observed {
                    outcome: Err(BenchError::Setup(e.0)),
                    mem: MemEvidence::default(),
                    hang: None,
                    last_life: Instant::now(),
                }
            }
        };
        let base = self.cfg.sides[side].base_url.clone();
        let pid = self.servers[side].as_ref().map(|s| s.pid);
        let mut watch = MemWatch::new(pid, self.cfg.args.cgroup_dir.clone());
        let hooks = RunHooks { bar_prefix: prefix, ignore_signals: true, ..Default::default() };
        // On a task of its own: its set-up (a dataset load, a tokenizer) runs without awaiting,
        // and the watch below must keep its one-second beat meanwhile.
        let mut run = tokio::spawn(bench_run::run_with(cfg, hooks.clone()));
        let started = Instant::now();
        let last_health = Arc::new(Mutex::new(started));
        let probing = Arc::new(AtomicBool::new(false));
        let url = format!("{base}{}", self.cfg.args.ready_path);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let (mut hang, mut death_seen, mut stopping) = (None, None::<Instant>, false);
        let life = |lh: &Arc<Mutex<Instant>>| lh.lock().map_or(started, |t| *t).max(hooks.activity.last()).max(started);
        let stop = |reason: String| {
            if let Ok(mut r) = hooks.stop_reason.lock() {
                *r = Some(reason);
            }
            hooks.stop.cancel();
        };
        let outcome = loop {
            tokio::select! {
                r = &mut run => break r.unwrap_or_else(|e| Err(BenchError::Setup(format!("the bench run failed: {e}")))),
                () = self.interrupt.cancelled(), if !stopping => {
                    stopping = true;
                    stop("interrupted (signal to sparrow sweep)".into());
                }
                _ = tick.tick() => {
                    let rss = watch.sample(pid).await;
                    if let Ok(mut s) = hooks.bar_status.lock() {
                        *s = if pid.is_some() { format!("server RSS {}", gib(rss)) } else { String::new() };
                    }
                    if let Some(srv) = self.servers[side].as_mut() {
                        if let Some(e) = srv.exited() {
                            let t = *death_seen.get_or_insert_with(Instant::now);
                            // Requests end by themselves on a dead server; a child still
                            // holding the port must not keep the step alive.
                            if t.elapsed() > Duration::from_secs(5) && !stopping {
                                stopping = true;
                                stop(format!("the server process ended ({})", e.describe()));
                            }
                        }
                    }
                    let silent = life(&last_health).elapsed();
                    if silent > self.cfg.hang_timeout && !stopping && death_seen.is_none() {
                        stopping = true;
                        let why = format!("no /health answer and no byte on any stream for {:.0} s", silent.as_secs_f64());
                        hang = Some(why.clone());
                        stop(format!("server hung: {why}"));
                    }
                    if !probing.swap(true, Ordering::SeqCst) {
                        let (http, url, lh, probing) = (self.http.clone(), url.clone(), last_health.clone(), probing.clone());
                        tokio::spawn(async move {
                            if server::answers(&http, &url, Duration::from_secs(5)).await {
                                if let Ok(mut t) = lh.lock() {
                                    *t = Instant::now();
                                }
                            }
                            probing.store(false, Ordering::SeqCst);
                        });
                    }
                }
            }
        };
        let _ = watch.sample(pid).await;
        Observed { outcome, mem: watch.finish(), hang, last_life: life(&last_health) }
    }

    /// After a step whose server may be gone: waits (up to the hang window) for it to either
    /// end or answer again.
    async fn settle(&mut self, side: usize, last_life: Instant) -> Settled {
        let url = format!("{}{}", self.cfg.sides[side].base_url, self.cfg.args.ready_path);
        let deadline = last_life + self.cfg.hang_timeout;
        loop {
            if let Some(s) = self.servers[side].as_mut() {
                if s.exited().is_some() {
                    return Settled::Ended;
                }
            }
            match self.http.get(&url).timeout(Duration::from_secs(2)).send().await {
                Ok(_) => return Settled::Alive,
                Err(e) if e.is_connect() && self.servers[side].is_none() => return Settled::Ended,
                Err(_) => {}
            }
            if self.interrupt.is_cancelled() {
                return Settled::Interrupted;
            }
            if Instant::now() >= deadline {
                return Settled::Silent;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The verdict on side `side`'s server after a step: alive, silent (hang), or ended
    /// (judged from its log, exit status and memory). `evidence` is the step's own summary,
    /// kept for a server that is fine.
    async fn judge(
        &mut self,
        side: usize,
        obs: &Observed,
        server_down: bool,
        from_line: usize,
        evidence: &str,
    ) -> (Settled, Verdict) {
        let base_url = self.cfg.sides[side].base_url.clone();
        // A server that dies just as the step's last request ends is this step's.
        let exited = match self.servers[side].as_mut() {
            Some(srv) => srv.wait_exit(Duration::from_millis(300)).await,
            None => None,
        };
        let state = if obs.hang.is_some() {
            Settled::Silent
        } else if exited.is_some() {
            Settled::Ended
        } else if self.interrupt.is_cancelled() {
            Settled::Interrupted
        } else if server_down {
            self.settle(side, obs.last_life).await
        } else {
            Settled::Alive
        };
        let verdict = match state {
            Settled::Alive | Settled::Interrupted => Verdict::plain(VerdictKind::Ok, evidence),
            Settled::Silent => Verdict::plain(
                VerdictKind::Hang,
                format!(
                    "alive but silent: {}; {}",
                    obs.hang.clone().unwrap_or_else(|| format!("no answer for {:.0} s (--hang-timeout)", self.cfg.hang_timeout.as_secs_f64())),
                    obs.mem.describe()
                ),
            ),
            Settled::Ended => match self.servers[side].as_mut() {
                Some(srv) => {
                    let e = srv.wait_exit(Duration::from_secs(1)).await.unwrap_or(server::ExitInfo { code: None, signal: None });
                    srv.drain_log().await;
                    let text = std::fs::read_to_string(&srv.log_path).unwrap_or_default();
                    let mut mem = obs.mem.clone();
                    mem.refresh_oom_kills();
                    forensics::classify_death(&text, from_line, e, &mem)
                }
                None => Verdict::plain(
                    VerdictKind::Exited,
                    format!("{} stopped answering (connection refused); the sweep did not launch it: no log, exit status or memory figures", base_url),
                ),
            },
        };
        (state, verdict)
    }

    /// A records file of step `k` already there was left by an earlier run of this step whose
    /// result is not kept (cut short by a signal or a kill of the sweep, failed, or measured
    /// with other flags). The step runs again from its start, since throughput and concurrency
    /// figures only mean something for one uninterrupted run; the requests that run finished
    /// are kept, renamed `<name>.earlier<i>.requests.jsonl`, rather than overwritten.
    fn keep_earlier_records(&self, k: usize, name: &str, details: &Path) {
        if !details.exists() {
            return;
        }
        let kept = (1..)
            .map(|i| details.with_file_name(format!("{name}.earlier{i}.requests.jsonl")))
            .find(|p| !p.exists())
            .unwrap_or_else(|| details.with_extension("earlier"));
        let finished = sparrow_bench::merge::read_records(details).map_or(0, |r| r.records.len());
        match std::fs::rename(details, &kept) {
            Ok(()) => sparrow_bench::errln!(
                "sparrow sweep: step {}: an earlier run of it left {finished} finished request(s): kept in {}; the step runs again",
                k + 1,
                self.rel(&kept)
            ),
            Err(e) => sparrow_bench::errln!(
                "sparrow sweep: warning: cannot keep {} aside ({e}); the step's new run overwrites it",
                self.rel(details)
            ),
        }
    }

    /// Runs step `k`: makes sure its server is up, runs the bench under the memory and hang
    /// watch, and judges the server afterwards.
    async fn run_step(&mut self, k: usize, p: Plan, out_file: &Path, slos: &Slos) -> Result<StepResult, SweepError> {
        let side = self.cfg.sides[p.side].clone();
        let n = self.cfg.axis.len() * self.cfg.args.repeat * self.cfg.sides.len();
        let value = fmt_value(self.cfg.axis.value(p.value_index));
        let mut result = self.blank(k, p, Status::Ok, String::new());
        if let Err((v, log, mem)) = self.ensure_server(p.side, k).await {
            if self.interrupt.is_cancelled() {
                result.status = Status::Interrupted;
                result.evidence = v.evidence;
            } else {
                result.status = Status::Crashed;
                apply_verdict(&mut result, v);
            }
            result.server_log = log;
            result.peak_rss_bytes = Some(mem.peak_rss).filter(|r| *r > 0);
            return Ok(result);
        }
        let name = self.step_name(k, p);
        let mut b = self.cfg.bench.args.clone();
        b.base_url = Some(side.base_url.clone());
        b.max_concurrency = self.cfg.concurrency(p.value_index);
        b.request_rate = self.cfg.request_rate(p.value_index);
        b.num_prompts = self.cfg.num_prompts(p.value_index);
        b.seed = self.cfg.seed(p.value_index, p.repeat);
        b.output_file = Some(out_file.to_owned());
        let details = self.dir.join("steps").join(format!("{name}.requests.jsonl"));
        self.keep_earlier_records(k, &name, &details);
        b.details_file = Some(details);
        b.tag = Some(b.tag.map_or_else(|| side.label.clone(), |t| format!("{t} {}", side.label)));
        b.tokenizer = self.tokenizer_for(p.side).await;
        let from_line = self.servers[p.side].as_ref().map_or(1, |s| s.log_lines() + 1);
        let prefix = format!(
            "[{}/{n} {} {}={value}]",
            k + 1,
            side.label,
            if self.cfg.axis.name() == "concurrency" { "c" } else { "rate" }
        );
        let obs = self.observe(p.side, b, prefix).await;
        result.peak_rss_bytes = self.servers[p.side].as_ref().map(|_| obs.mem.peak_rss);
        result.server_log = self.servers[p.side].as_ref().map(|s| s.log_path.clone()).map(|l| self.rel(&l));
        let server_down;
        match &obs.outcome {
            Ok(o) => {
                result.completed = o.metrics.completed;
                result.failed = o.metrics.failed;
                result.bench = bench_keys(o);
                if self.cfg.has_slos() {
                    let (g, a) = slos.judge(&o.records, o.summary.duration_s);
                    result.goodput = Some(g);
                    result.slo_attainment = Some(a);
                }
                let block = bench_report::render_block(&o.summary, &o.metrics);
                let bf = self.dir.join("steps").join(format!("{name}.txt"));
                report::write_atomic(&bf, block.as_bytes()).map_err(io_err(&bf))?;
                result.block_file = Some(self.rel(&bf));
                server_down = o.summary.server_down.is_some() || o.exit_code == exit::STOPPED;
                // Anything but a clean bench exit (failures over the limit, a server
                // that stopped answering for a while) fails the step even if the
                // server is up again afterwards.
                result.status = if o.exit_code == exit::OK { Status::Ok } else { Status::Failed };
                result.evidence = format!("{} of {} requests completed", o.metrics.completed, o.records.len());
            }
            Err(e) => {
                // A set-up failure may be the server's doing (no answer to the model
                // list, a warmup that died): it is judged like a run that saw it go.
                server_down = true;
                result.status = Status::Failed;
                result.evidence = format!("the step could not run: {e}");
            }
        }
        let (state, verdict) = self.judge(p.side, &obs, server_down, from_line, &result.evidence).await;
        if verdict.kind != VerdictKind::Ok {
            result.status = Status::Crashed;
            let done = result.evidence.clone();
            apply_verdict(&mut result, verdict);
            result.evidence = format!("{}; {done}", result.evidence);
        } else {
            result.verdict = Some(VerdictKind::Ok);
        }
        if state == Settled::Interrupted || (self.interrupt.is_cancelled() && result.status != Status::Crashed) {
            // Cut by a signal: the server was not judged, and the step will run again.
            result.status = Status::Interrupted;
            result.verdict = None;
            result.evidence = format!("interrupted by a signal; {}", result.evidence);
        }
        Ok(result)
    }

    /// Runs every step; returns the exit status.
    ///
    /// # Errors
    /// [`SweepError`] when a result file cannot be written.
    pub async fn run(mut self) -> Result<i32, SweepError> {
        tokio::spawn(signals(self.interrupt.clone(), self.interrupt_code.clone()));
        // Servers of an earlier sweep over this folder that died without stopping them (a
        // SIGKILL) still hold their ports: stopped before anything is launched.
        for line in
            server::reap_orphans(&self.dir, self.cfg.stop_grace).await.map_err(|e| SweepError::Setup(e.to_string()))?
        {
            sparrow_bench::errln!("sparrow sweep: {line}");
        }
        let plan = self.plan();
        let n = plan.len();
        let out_file = self.cfg.args.output_file.clone().unwrap_or_else(|| self.dir.join("results.jsonl"));
        let mut stopped: Option<String> = None;
        let slos = Slos {
            ttft_ms: self.cfg.args.slo_ttft_ms,
            tpot_ms: self.cfg.args.slo_tpot_ms,
            e2e_ms: self.cfg.args.slo_e2e_ms,
        };
        for side in self.cfg.sides.iter().filter(|s| s.server_cmd.is_none()) {
            let url = format!("{}{}", side.base_url, self.cfg.args.ready_path);
            if !server::answers(&self.http, &url, Duration::from_secs(2)).await {
                return Err(SweepError::Setup(format!(
                    "nothing answers at {url} ({}): start the server, or let the sweep launch it with --server-cmd",
                    side.label
                )));
            }
        }
        sparrow_bench::errln!("sparrow sweep: {n} step(s), results in {}", self.dir.display());
        if let [a, b] = &self.cfg.sides[..] {
            if a.server_cmd == b.server_cmd && a.base_url == b.base_url {
                sparrow_bench::errln!(
                    "sparrow sweep: note: A and B are the same server command and address (an A/A run)"
                );
            }
        }
        for (k, p) in plan.iter().copied().enumerate() {
            let side = self.cfg.sides[p.side].clone();
            if self.interrupt.is_cancelled() && stopped.is_none() {
                stopped = Some("not run: the sweep was interrupted".into());
            }
            if let Some(why) = &stopped {
                let s = self.blank(k, p, Status::Skipped, why.clone());
                self.record(s)?;
                continue;
            }
            let key = step_key(&self.cfg, &side, p.value_index, p.repeat);
            if let Some(prev) = self.previous.get(&key).cloned() {
                sparrow_bench::errln!(
                    "sparrow sweep: step {}/{n} ({}) already measured: kept (--resume)",
                    k + 1,
                    side.label
                );
                self.record(StepResult { step: k + 1, ..prev })?;
                continue;
            }
            let value = fmt_value(self.cfg.axis.value(p.value_index));
            sparrow_bench::errln!(
                "sparrow sweep: step {}/{n}: {} {}={value} prompts={} seed={}",
                k + 1,
                side.label,
                self.cfg.axis.name(),
                self.cfg.num_prompts(p.value_index),
                self.cfg.seed(p.value_index, p.repeat)
            );
            let result = self.run_step(k, p, &out_file, &slos).await?;
            let crashed = result.status == Status::Crashed;
            sparrow_bench::errln!(
                "sparrow sweep: step {}/{n} {}: {} ({})",
                k + 1,
                side.label,
                result.verdict.map_or("-", VerdictKind::as_str),
                result.evidence
            );
            let log = result.server_log.as_deref().unwrap_or("log");
            for q in result.quote.iter().chain(&result.context) {
                sparrow_bench::errln!("    {log}:{}: {}", q.line, q.text);
            }
            let step_no = k + 1;
            self.record(result)?;
            if crashed {
                if let Some(mut srv) = self.servers[p.side].take() {
                    srv.stop(self.cfg.stop_grace).await;
                }
                match self.cfg.args.on_crash {
                    OnCrash::Stop => {
                        stopped =
                            Some(format!("not run: the sweep stopped after step {step_no} crashed (--on-crash stop)"))
                    }
                    OnCrash::Restart => {
                        sparrow_bench::errln!("sparrow sweep: step {step_no} lost; going on (--on-crash restart)")
                    }
                }
            } else if self.cfg.args.restart == Restart::PerStep {
                if let Some(mut srv) = self.servers[p.side].take() {
                    srv.stop(self.cfg.stop_grace).await;
                }
            }
        }
        for s in self.servers.iter_mut() {
            if let Some(mut srv) = s.take() {
                let how = srv.stop(self.cfg.stop_grace).await;
                sparrow_bench::errln!("sparrow sweep: server {} {how}", srv.index);
            }
        }
        let table = self.write_report()?;
        sparrow_bench::outln!("\n{:=^60}\n{table}", " Sweep Summary ");
        sparrow_bench::errln!(
            "sparrow sweep: summary.json, summary.csv, report.html and plots/ in {}",
            self.dir.display()
        );
        let code = self.interrupt_code.lock().ok().and_then(|c| *c);
        Ok(match code {
            Some(c) => c,
            None if self.steps.iter().all(|s| s.status == Status::Ok) => 0,
            None => 1,
        })
    }
}

fn apply_verdict(r: &mut StepResult, v: Verdict) {
    r.verdict = Some(v.kind);
    r.evidence = v.evidence;
    r.quote = v.quote;
    r.error_type = v.error_type;
    r.location = v.location;
    r.context = v.context;
}
