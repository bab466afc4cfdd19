//! One step of the sweep: the server it needs (launched, or restarted after a crash), the
//! bench run under the memory and hang watches, and the verdict on how it ended.

use std::sync::atomic::{AtomicBool, Ordering};

use sparrow_bench::args::BenchArgs;
use sparrow_bench::run::{exit, RunHooks};

use super::*;
use crate::forensics;
use crate::monitor::{gib, MemWatch};

impl Sweep {
    /// Makes sure side `i`'s server runs (when the sweep launches it); on failure, the
    /// verdict of the failed start.
    pub(super) async fn ensure_server(
        &mut self,
        i: usize,
        from_step: usize,
    ) -> Result<(), (Verdict, Option<String>, MemEvidence)> {
        let side: Side = self.cfg.sides[i].clone();
        let si = side.server;
        let Some(cmd) = side.server_cmd.clone() else { return Ok(()) };
        if let Some(s) = self.servers[si].as_mut() {
            if s.exited().is_none() {
                return Ok(());
            }
        }
        if let Some(mut old) = self.servers[si].take() {
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
            let Some(other_side) = self.cfg.sides.iter().find(|s| s.server == j) else { continue };
            if j != si && other_side.base_url == side.base_url {
                if let Some(mut other) = self.servers[j].take() {
                    sparrow_bench::errln!(
                        "sparrow sweep: stopping {}'s server (same address as {})",
                        other_side.config.as_ref().unwrap_or(&other_side.label),
                        side.config.as_ref().unwrap_or(&side.label)
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
                self.servers[si] = Some(srv);
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
    pub(super) async fn tokenizer_for(&mut self, side: usize) -> Option<PathBuf> {
        let a = &self.cfg.sides[side].bench.args;
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
    pub(super) async fn observe(&mut self, side: usize, bench: BenchArgs, prefix: String) -> Observed {
        let cfg = match bench.validate() {
            Ok(c) => c,
            Err(e) => {
                return Observed {
                    outcome: Err(BenchError::Setup(e.0)),
                    mem: MemEvidence::default(),
                    hang: None,
                    last_life: Instant::now(),
                    series: vec![],
                }
            }
        };
        let base = self.cfg.sides[side].base_url.clone();
        let pid = self.servers[self.cfg.sides[side].server].as_ref().map(|s| s.pid);
        let mut watch = MemWatch::new(pid, self.cfg.args.cgroup_dir.clone());
        let hooks = RunHooks { bar_prefix: prefix, ignore_signals: true, ..Default::default() };
        // On a task of its own: its set-up (a dataset load, a tokenizer) runs without awaiting,
        // and the watch below must keep its one-second beat meanwhile.
        let mut run = tokio::spawn(bench_run::run_with(cfg, hooks.clone()));
        let scrape_stop = CancellationToken::new();
        let every = Duration::from_secs_f64(self.cfg.args.scrape_interval);
        let scrape = tokio::spawn(crate::scrape::watch(
            self.http.clone(),
            format!("{base}/metrics"),
            pid,
            every,
            scrape_stop.clone(),
        ));
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
                    if let Some(srv) = self.servers[self.cfg.sides[side].server].as_mut() {
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
        scrape_stop.cancel();
        let series = scrape.await.unwrap_or_default();
        Observed { outcome, mem: watch.finish(), hang, last_life: life(&last_health), series }
    }

    /// After a step whose server may be gone: waits (up to the hang window) for it to either
    /// end or answer again.
    pub(super) async fn settle(&mut self, side: usize, last_life: Instant) -> Settled {
        let url = format!("{}{}", self.cfg.sides[side].base_url, self.cfg.args.ready_path);
        let deadline = last_life + self.cfg.hang_timeout;
        loop {
            if let Some(s) = self.servers[self.cfg.sides[side].server].as_mut() {
                if s.exited().is_some() {
                    return Settled::Ended;
                }
            }
            match self.http.get(&url).timeout(Duration::from_secs(2)).send().await {
                Ok(_) => return Settled::Alive,
                Err(e) if e.is_connect() && self.servers[self.cfg.sides[side].server].is_none() => {
                    return Settled::Ended
                }
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
    pub(super) async fn judge(
        &mut self,
        side: usize,
        obs: &Observed,
        server_down: bool,
        from_line: usize,
        evidence: &str,
    ) -> (Settled, Verdict) {
        let base_url = self.cfg.sides[side].base_url.clone();
        // A server that dies just as the step's last request ends is this step's.
        let exited = match self.servers[self.cfg.sides[side].server].as_mut() {
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
            Settled::Ended => match self.servers[self.cfg.sides[side].server].as_mut() {
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
    pub(super) fn keep_earlier_records(&self, k: usize, name: &str, details: &Path) {
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
    pub(super) async fn run_step(&mut self, k: usize, p: Plan, out_file: &Path) -> Result<StepResult, SweepError> {
        let side = self.cfg.sides[p.side].clone();
        let of = self.of();
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
        let mut b = side.bench.args.clone();
        b.base_url = Some(side.base_url.clone());
        b.max_concurrency = self.cfg.concurrency(p.value_index);
        b.request_rate = self.cfg.request_rate(p.value_index);
        b.num_prompts = self.cfg.num_prompts(p.side, p.value_index);
        b.seed = self.cfg.seed(p.side, p.value_index, p.repeat);
        b.output_file = Some(out_file.to_owned());
        let details = self.dir.join("steps").join(format!("{name}.requests.jsonl"));
        self.keep_earlier_records(k, &name, &details);
        b.details_file = Some(details);
        b.tag = Some(b.tag.map_or_else(|| side.label.clone(), |t| format!("{t} {}", side.label)));
        b.tokenizer = self.tokenizer_for(p.side).await;
        let from_line = self.servers[side.server].as_ref().map_or(1, |s| s.log_lines() + 1);
        let prefix = format!(
            "[{}{of} {} {}={value}]",
            k + 1,
            side.label,
            if self.cfg.axis.name() == "concurrency" { "c" } else { "rate" }
        );
        let obs = self.observe(p.side, b, prefix).await;
        result.peak_rss_bytes = self.servers[side.server].as_ref().map(|_| obs.mem.peak_rss);
        result.server_log = self.servers[side.server].as_ref().map(|s| s.log_path.clone()).map(|l| self.rel(&l));
        if !obs.series.is_empty() {
            let sf = self.dir.join("steps").join(format!("{name}.series.json"));
            let text = serde_json::to_string(&obs.series).unwrap_or_default();
            crate::out::write_atomic(&sf, text.as_bytes()).map_err(io_err(&sf))?;
            result.series_file = Some(self.rel(&sf));
            result.server_stats = Some(crate::scrape::stats(&obs.series));
        }
        let server_down;
        match &obs.outcome {
            Ok(o) => {
                result.completed = o.metrics.completed;
                result.failed = o.metrics.failed;
                result.bench = bench_keys(o);
                if self.cfg.has_slos() {
                    let j = self.cfg.slo.judge(&o.records, o.summary.duration_s);
                    result.goodput = Some(j.goodput);
                    result.slo_attainment = Some(j.attainment);
                    result.slo_met = Some(j.met && o.exit_code == exit::OK);
                    result.slo_missed = j.missed;
                }
                let block = bench_report::render_block(&o.summary, &o.metrics);
                let bf = self.dir.join("steps").join(format!("{name}.txt"));
                crate::out::write_atomic(&bf, block.as_bytes()).map_err(io_err(&bf))?;
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
        if let Some(st) = &result.server_stats {
            let cap =
                result.bench.get("server_info").and_then(|i| i.get("max_running_requests")).and_then(Value::as_f64);
            let offered = result.concurrency.map(|c| c as f64);
            result.limit = crate::scrape::limit(st, cap, offered, self.machine.cores);
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
}
