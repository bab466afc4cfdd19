//! The sweep itself: steps one after another (never two at once), servers launched and
//! stopped, a memory watch and a hang watch around every step, a verdict after it, every
//! result written the moment it exists.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Map, Value};
use sparrow_bench::report as bench_report;
use sparrow_bench::run::{self as bench_run, BenchError, RunOutcome};
use tokio_util::sync::CancellationToken;

use crate::analysis::fmt_value;
use crate::args::{Axis, OnCrash, Restart, Side, SweepConfig};
use crate::forensics::{Verdict, VerdictKind};
use crate::monitor::MemEvidence;
use crate::report::{self, Machine, Report};
use crate::server::{self, Server};
use crate::step::{Status, StepResult};

mod plan;
mod step_run;

use plan::{Plan, Planner};

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

/// What was seen while a step ran.
struct Observed {
    outcome: Result<RunOutcome, BenchError>,
    mem: MemEvidence,
    /// Set when the sweep judged the server hung and stopped the step.
    hang: Option<String>,
    /// When the server last showed life (a /health answer or a byte on a stream).
    last_life: Instant,
    /// Its `/metrics`, CPU and RSS, once a second.
    series: Vec<crate::scrape::Sample>,
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
    /// Steps planned, when known up front (not in an SLO search).
    planned: Option<usize>,
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

/// What makes two steps the same measurement: the side (label, command with the
/// configuration's flags, address), the step's effective settings (concurrency, rate, prompts,
/// seed, repeat), the bench flags (the workload's included) and the SLOs it was judged by.
fn step_key(cfg: &SweepConfig, si: usize, vi: usize, r: usize) -> String {
    let side = &cfg.sides[si];
    format!(
        "{}|{}|{}|concurrency={}|rate={}|prompts={}|seed={}|repeat={r}|{}",
        side.label,
        side.server_cmd.as_deref().unwrap_or("-"),
        side.base_url,
        cfg.concurrency(vi).map_or("-".into(), |c| c.to_string()),
        fmt_value(cfg.request_rate(vi)),
        cfg.num_prompts(si, vi),
        cfg.seed(si, vi, r),
        side.bench_argv(&cfg.bench_argv).join("\u{1f}"),
    ) + &slo_key(cfg)
}

/// The SLOs in a step's key: a step judged under other SLOs (or none) is measured again, so
/// a resumed search never decides on another judgement.
fn slo_key(cfg: &SweepConfig) -> String {
    if cfg.has_slos() {
        format!("|slo={}", cfg.slo.describe())
    } else {
        String::new()
    }
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
        let n_servers = cfg.sides.iter().map(|s| s.server + 1).max().unwrap_or(1);
        Ok(Sweep {
            cfg,
            argv,
            dir,
            started: server::utc(SystemTime::now()),
            machine: Machine::read(),
            http,
            steps: vec![],
            servers: (0..n_servers).map(|_| None).collect(),
            launches,
            previous,
            interrupt: CancellationToken::new(),
            interrupt_code: Arc::default(),
            tokenizer: None,
            planned: None,
            _folder: folder,
        })
    }

    /// The output folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `/N` after a step number when the step count is known (not in a search).
    fn of(&self) -> String {
        self.planned.map_or(String::new(), |n| format!("/{n}"))
    }

    fn step_name(&self, k: usize, p: Plan) -> String {
        let axis = match self.cfg.axis {
            Axis::Concurrency(_) => "c",
            Axis::RequestRate(_) => "r",
        };
        let rep = if self.cfg.args.repeat > 1 { format!("-rep{}", p.repeat + 1) } else { String::new() };
        // Grid names come from files: anything a file name should not hold becomes '_'.
        let label: String = self.cfg.sides[p.side]
            .label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || "-_=.,+:".contains(c) { c } else { '_' })
            .collect();
        format!("{:02}-{label}-{axis}{}{rep}", k + 1, fmt_value(self.cfg.axis.value(p.value_index)))
    }

    fn blank(&self, k: usize, p: Plan, status: Status, evidence: String) -> StepResult {
        let side = &self.cfg.sides[p.side];
        StepResult {
            step: k + 1,
            key: step_key(&self.cfg, p.side, p.value_index, p.repeat),
            label: side.label.clone(),
            config: side.config.clone(),
            workload: side.workload.clone(),
            value_index: p.value_index,
            repeat: p.repeat,
            concurrency: self.cfg.concurrency(p.value_index),
            request_rate: self.cfg.request_rate(p.value_index),
            seed: self.cfg.seed(p.side, p.value_index, p.repeat),
            num_prompts: self.cfg.num_prompts(p.side, p.value_index),
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
            slo_met: None,
            slo_missed: vec![],
            server_stats: None,
            limit: None,
            series_file: None,
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
        let mut planner = Planner::new(&self.cfg);
        self.planned = planner.planned();
        let out_file = self.cfg.args.output_file.clone().unwrap_or_else(|| self.dir.join("results.jsonl"));
        let mut stopped: Option<String> = None;
        // In a grid, a crash with `--on-crash stop` ends only its configuration's steps.
        let mut config_stopped: HashMap<usize, String> = HashMap::new();
        for side in self.cfg.sides.iter().filter(|s| s.server_cmd.is_none()) {
            let url = format!("{}{}", side.base_url, self.cfg.args.ready_path);
            if !server::answers(&self.http, &url, Duration::from_secs(2)).await {
                return Err(SweepError::Setup(format!(
                    "nothing answers at {url} ({}): start the server, or let the sweep launch it with --server-cmd",
                    side.label
                )));
            }
        }
        match self.planned {
            Some(n) => sparrow_bench::errln!("sparrow sweep: {n} step(s), results in {}", self.dir.display()),
            None => sparrow_bench::errln!(
                "sparrow sweep: searching the load that meets {} on {} side(s), results in {}",
                self.cfg.slo.describe(),
                self.cfg.sides.len(),
                self.dir.display()
            ),
        }
        if let [a, b] = &self.cfg.sides[..] {
            if a.server_cmd == b.server_cmd && a.base_url == b.base_url {
                sparrow_bench::errln!(
                    "sparrow sweep: note: A and B are the same server command and address (an A/A run)"
                );
            }
        }
        for k in 0.. {
            let Some(p) = planner.next(&mut self.cfg, &self.steps) else { break };
            let side = self.cfg.sides[p.side].clone();
            if self.interrupt.is_cancelled() && stopped.is_none() {
                stopped = Some("not run: the sweep was interrupted".into());
            }
            if let Some(why) = stopped.as_ref().or(config_stopped.get(&side.server)) {
                let s = self.blank(k, p, Status::Skipped, why.clone());
                self.record(s)?;
                planner.end_side(p.side);
                continue;
            }
            if self.cfg.grid {
                // One configuration at a time: the one before makes way (memory, the port).
                for j in (0..self.servers.len()).filter(|&j| j != side.server) {
                    if let Some(mut srv) = self.servers[j].take() {
                        let how = srv.stop(self.cfg.stop_grace).await;
                        sparrow_bench::errln!("sparrow sweep: server {} {how} (its configuration is done)", srv.index);
                    }
                }
            }
            let key = step_key(&self.cfg, p.side, p.value_index, p.repeat);
            if let Some(prev) = self.previous.get(&key).cloned() {
                sparrow_bench::errln!(
                    "sparrow sweep: step {}{} ({}) already measured: kept (--resume)",
                    k + 1,
                    self.of(),
                    side.label
                );
                self.record(StepResult { step: k + 1, ..prev })?;
                continue;
            }
            let value = fmt_value(self.cfg.axis.value(p.value_index));
            sparrow_bench::errln!(
                "sparrow sweep: step {}{}: {} {}={value} prompts={} seed={}",
                k + 1,
                self.of(),
                side.label,
                self.cfg.axis.name(),
                self.cfg.num_prompts(p.side, p.value_index),
                self.cfg.seed(p.side, p.value_index, p.repeat)
            );
            let result = self.run_step(k, p, &out_file).await?;
            let crashed = result.status == Status::Crashed;
            sparrow_bench::errln!(
                "sparrow sweep: step {}{} {}: {} ({})",
                k + 1,
                self.of(),
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
                if let Some(mut srv) = self.servers[side.server].take() {
                    srv.stop(self.cfg.stop_grace).await;
                }
                match self.cfg.args.on_crash {
                    OnCrash::Stop if self.cfg.grid => {
                        let name = side.config.clone().unwrap_or_default();
                        sparrow_bench::errln!(
                            "sparrow sweep: configuration {name} crashed at step {step_no}: its other steps are skipped; the grid goes on"
                        );
                        config_stopped.insert(
                            side.server,
                            format!("not run: configuration {name} crashed at step {step_no} (--on-crash stop)"),
                        );
                    }
                    OnCrash::Stop => {
                        stopped =
                            Some(format!("not run: the sweep stopped after step {step_no} crashed (--on-crash stop)"))
                    }
                    OnCrash::Restart => {
                        sparrow_bench::errln!("sparrow sweep: step {step_no} lost; going on (--on-crash restart)")
                    }
                }
            } else if self.cfg.args.restart == Restart::PerStep {
                if let Some(mut srv) = self.servers[side.server].take() {
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
