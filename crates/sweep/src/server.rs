//! A server the sweep launches: its command under `sh -c` in a process group of its own, its
//! stdout and stderr kept whole in `server-<n>.log` with a timestamp on every line, readiness
//! by polling, and a clean stop of the whole group (SIGINT, then SIGTERM, then SIGKILL).
//!
//! The process group keeps a terminal's Ctrl-C away from the server (the sweep stops it
//! itself, after saving what the step measured) and lets one signal reach every process the
//! command started (SGLang's scheduler and detokenizer, a wrapper script's children).
//!
//! The same group outlives a sweep killed with SIGKILL, still holding its port. So every
//! launch leaves `server-<n>.pid` beside its log (the group id, the leader's start time and
//! the sweep's own pid and start time) until it is stopped, and the next sweep over that
//! folder ([`reap_orphans`]) stops any group whose sweep is gone before it launches its own.

use std::io::Write as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// How a server process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    /// Exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that killed it, when one did.
    pub signal: Option<i32>,
}

impl ExitInfo {
    /// From a std exit status.
    pub fn from_status(s: std::process::ExitStatus) -> Self {
        ExitInfo { code: s.code(), signal: s.signal() }
    }
    /// The signal that ended it: the killing signal, or the one a shell reports as exit
    /// status 128 + N (the command ran under `sh -c`, which may not `exec` it).
    pub fn effective_signal(&self) -> Option<i32> {
        self.signal.or(self.code.filter(|c| (129..=159).contains(c)).map(|c| c - 128))
    }
    /// "exit status 1", "killed by SIGKILL", "exit status 137 (a shell reporting SIGKILL)".
    pub fn describe(&self) -> String {
        match (self.code, self.signal) {
            (_, Some(s)) => format!("killed by {}", signal_name(s)),
            (Some(c), None) if (129..=159).contains(&c) => {
                format!("exit status {c} (a shell reporting death by {})", signal_name(c - 128))
            }
            (Some(127), None) => "exit status 127 (command not found)".into(),
            (Some(126), None) => "exit status 126 (command not executable)".into(),
            (Some(c), None) => format!("exit status {c}"),
            (None, None) => "ended (no status)".into(),
        }
    }
}

/// `SIGSEGV` for 11, `signal 77` for what nix does not know.
pub fn signal_name(s: i32) -> String {
    Signal::try_from(s).map_or_else(|_| format!("signal {s}"), |sig| sig.as_str().to_owned())
}

/// Errors of launching or stopping a server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The command could not be started.
    #[error("cannot start `{cmd}`: {source}")]
    Spawn {
        /// The command line.
        cmd: String,
        /// Why.
        source: std::io::Error,
    },
    /// The log file could not be created.
    #[error("cannot write {path}: {source}")]
    Log {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// UTC `YYYY-MM-DDTHH:MM:SS.mmmZ` of a system time.
pub fn utc(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (y, m, day) = sparrow_bench::run::civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!("{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z", s / 3600, s / 60 % 60, s % 60, d.subsec_millis())
}

/// The prefix every log line gets: `<UTC time> +<seconds since launch> <out|err>| `.
/// [`strip_prefix`] undoes it.
fn prefix(start: Instant, stream: &str) -> String {
    format!("{} +{:.3}s {stream}| ", utc(SystemTime::now()), start.elapsed().as_secs_f64())
}

/// The server's own text of a log line written by [`Server::launch`] (header lines, which
/// start with `#`, give `None`).
pub fn strip_prefix(line: &str) -> Option<&str> {
    if line.starts_with('#') {
        return None;
    }
    line.split_once("| ").map(|(_, rest)| rest).or(Some(line))
}

/// A launched server.
#[derive(Debug)]
pub struct Server {
    /// 1-based launch number (the `n` of `server-<n>.log`).
    pub index: usize,
    /// The command line.
    pub cmd: String,
    /// Its log.
    pub log_path: PathBuf,
    /// `server-<n>.pid`: there while the group may be alive (see [`reap_orphans`]).
    pid_file: PathBuf,
    /// The pid of `sh -c` (also the process group id).
    pub pid: u32,
    /// When it was launched.
    pub started: Instant,
    child: Child,
    exit: Option<ExitInfo>,
    /// The group was killed by [`Self::stop`]: its id may since belong to someone else.
    stopped: bool,
    log_task: Option<tokio::task::JoinHandle<()>>,
    log_lines: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// Copies one pipe into the log channel, line by line, bytes kept (invalid UTF-8 replaced).
async fn pump(r: impl AsyncRead + Unpin, stream: &'static str, tx: mpsc::UnboundedSender<(&'static str, String)>) {
    let mut r = BufReader::new(r);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match r.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    buf.pop();
                }
                if tx.send((stream, String::from_utf8_lossy(&buf).into_owned())).is_err() {
                    return;
                }
            }
        }
    }
}

impl Server {
    /// Starts `cmd` under `sh -c` in its own process group, its output going to `log_path`.
    ///
    /// # Errors
    /// [`ServerError`] when the log cannot be created or the shell cannot start.
    pub fn launch(cmd: &str, index: usize, log_path: &Path) -> Result<Server, ServerError> {
        let log_err = |source| ServerError::Log { path: log_path.to_owned(), source };
        let started = Instant::now();
        let header =
            format!("# sparrow sweep: server {index}, launched {} with: sh -c {cmd:?}\n", utc(SystemTime::now()));
        std::fs::write(log_path, header.as_bytes()).map_err(log_err)?;
        // Append mode: the footer `stop` writes can never be overwritten by a late line.
        let log = std::fs::OpenOptions::new().append(true).open(log_path).map_err(log_err)?;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|source| ServerError::Spawn { cmd: cmd.to_owned(), source })?;
        let pid = child.id().unwrap_or(0);
        if let Ok(mut live) = LIVE_GROUPS.lock() {
            live.push(pid);
        }
        let pid_file = log_path.with_extension("pid");
        let owner = PidFile {
            pgid: pid,
            start: start_time(pid),
            sweep_pid: std::process::id(),
            sweep_start: start_time(std::process::id()),
        };
        if let Err(e) = crate::out::write_atomic(&pid_file, owner.to_line().as_bytes()) {
            // Unrecorded, a kill of the sweep would leave it running for good: not started.
            if pid > 0 {
                let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
            if let Ok(mut live) = LIVE_GROUPS.lock() {
                live.retain(|p| *p != pid);
            }
            return Err(ServerError::Log { path: pid_file, source: e });
        }
        let (tx, mut rx) = mpsc::unbounded_channel();
        if let Some(out) = child.stdout.take() {
            tokio::spawn(pump(out, "out", tx.clone()));
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(pump(err, "err", tx));
        }
        let log_lines = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(1));
        let lines = log_lines.clone();
        let log_task = tokio::spawn(async move {
            let mut w = std::io::BufWriter::new(log);
            while let Some((stream, text)) = rx.recv().await {
                let _ = writeln!(w, "{}{text}", prefix(started, stream));
                lines.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                // Flushed whenever the pipes are drained, so forensics read what was written.
                if rx.is_empty() {
                    let _ = w.flush();
                }
            }
            let _ = w.flush();
        });
        Ok(Server {
            index,
            cmd: cmd.to_owned(),
            log_path: log_path.to_owned(),
            pid_file,
            pid,
            started,
            child,
            exit: None,
            stopped: false,
            log_task: Some(log_task),
            log_lines,
        })
    }

    /// Lines written to the log so far (header included).
    pub fn log_lines(&self) -> usize {
        self.log_lines.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How it ended, if it has (non-blocking).
    pub fn exited(&mut self) -> Option<ExitInfo> {
        if self.exit.is_none() {
            if let Ok(Some(s)) = self.child.try_wait() {
                self.exit = Some(ExitInfo::from_status(s));
            }
        }
        self.exit
    }

    /// Waits up to `d` for the process to end.
    pub async fn wait_exit(&mut self, d: Duration) -> Option<ExitInfo> {
        if self.exit.is_none() {
            if let Ok(Ok(s)) = tokio::time::timeout(d, self.child.wait()).await {
                self.exit = Some(ExitInfo::from_status(s));
            }
        }
        self.exit
    }

    /// Waits (at most 3 s, as grandchildren may hold the pipes open) until everything the
    /// process wrote is in the log file.
    pub async fn drain_log(&mut self) {
        if let Some(t) = self.log_task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(3), t).await;
        }
    }

    fn signal_group(&self, sig: Signal) {
        if self.pid > 0 {
            let _ = killpg(Pid::from_raw(self.pid as i32), sig);
        }
    }

    /// Stops the whole process group: SIGINT, `grace`, SIGTERM, `grace`, SIGKILL. Returns how
    /// it went, for the log and the report (e.g. "stopped by SIGINT, 0.4 s after it was sent").
    pub async fn stop(&mut self, grace: Duration) -> String {
        let how = if let Some(e) = self.exited() {
            format!("had already ended: {}", e.describe())
        } else {
            let t = Instant::now();
            let mut how = None;
            for sig in [Signal::SIGINT, Signal::SIGTERM] {
                self.signal_group(sig);
                if self.wait_exit(grace).await.is_some() {
                    how = Some(format!(
                        "stopped by {}, {:.1} s after it was sent",
                        sig.as_str(),
                        t.elapsed().as_secs_f64()
                    ));
                    break;
                }
            }
            how.unwrap_or_else(|| {
                self.signal_group(Signal::SIGKILL);
                "did not stop on SIGINT or SIGTERM: killed with SIGKILL".into()
            })
        };
        // Whatever is left of the group (children that outlived the shell) goes too.
        self.signal_group(Signal::SIGKILL);
        self.stopped = true;
        if let Ok(mut live) = LIVE_GROUPS.lock() {
            live.retain(|p| *p != self.pid);
        }
        let _ = std::fs::remove_file(&self.pid_file);
        let _ = self.wait_exit(Duration::from_secs(5)).await;
        self.drain_log().await;
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&self.log_path) {
            let _ = writeln!(f, "# sparrow sweep: {} ({})", how, utc(SystemTime::now()));
        }
        how
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Never leave a server behind, whatever path the sweep took out: the group can
        // outlive the shell that leads it.
        if !self.stopped {
            self.signal_group(Signal::SIGKILL);
            if let Ok(mut live) = LIVE_GROUPS.lock() {
                live.retain(|p| *p != self.pid);
            }
            let _ = std::fs::remove_file(&self.pid_file);
        }
    }
}

/// Process groups of servers launched and not yet stopped.
static LIVE_GROUPS: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// SIGKILLs every launched server's group at once (a second Ctrl-C: the user wants out now).
pub fn kill_all_groups() {
    if let Ok(live) = LIVE_GROUPS.lock() {
        for pid in live.iter().filter(|p| **p > 0) {
            let _ = killpg(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        }
    }
}

/// The start time of process `pid` in clock ticks since boot (field 22 of
/// `/proc/<pid>/stat`, proc(5)): with the pid, it names one process for good, as pids are
/// reused. `None` when there is no such process (or no `/proc`).
pub fn start_time(pid: u32) -> Option<u64> {
    proc_stat(pid).map(|s| s.start)
}

/// The fields of `/proc/<pid>/stat` this module reads.
struct ProcStat {
    /// Field 3: `Z` for a zombie (ended, not yet reaped).
    state: char,
    /// Field 5: the process group.
    pgrp: u32,
    /// Field 22: start time, clock ticks since boot.
    start: u64,
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let f: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(ProcStat { state: f.first()?.chars().next()?, pgrp: f.get(2)?.parse().ok()?, start: f.get(19)?.parse().ok()? })
}

/// Whether the process `pid` that started at `start` still runs (`start` unknown: whether
/// any live process has that pid). A zombie has ended.
fn alive(pid: u32, start: Option<u64>) -> bool {
    proc_stat(pid).is_some_and(|s| s.state != 'Z' && start.is_none_or(|t| t == s.start))
}

/// Live (not zombie) processes of process group `pgid`.
fn group_members(pgid: u32) -> usize {
    let Ok(d) = std::fs::read_dir("/proc") else { return 0 };
    d.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(proc_stat)
        .filter(|s| s.pgrp == pgid && s.state != 'Z')
        .count()
}

/// The contents of `server-<n>.pid`: `pgid start sweep_pid sweep_start` (a start time of
/// `-` when it could not be read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PidFile {
    pgid: u32,
    start: Option<u64>,
    sweep_pid: u32,
    sweep_start: Option<u64>,
}

impl PidFile {
    fn to_line(self) -> String {
        let t = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
        format!("{} {} {} {}\n", self.pgid, t(self.start), self.sweep_pid, t(self.sweep_start))
    }

    fn parse(text: &str) -> Option<PidFile> {
        let f: Vec<&str> = text.split_whitespace().collect();
        let t = |s: &str| s.parse().ok();
        match f[..] {
            [pgid, start, sweep_pid, sweep_start] => Some(PidFile {
                pgid: pgid.parse().ok().filter(|p| *p > 1)?,
                start: t(start),
                sweep_pid: sweep_pid.parse().ok()?,
                sweep_start: t(sweep_start),
            }),
            _ => None,
        }
    }

    /// Whether the group still has a live process. A leader with another start time means
    /// the id was reused, which the kernel only does once the old group is empty.
    fn group_alive(&self) -> bool {
        if let (Some(now), Some(then)) = (start_time(self.pgid), self.start) {
            if now != then {
                return false;
            }
        }
        group_members(self.pgid) > 0
    }
}

/// Errors of [`reap_orphans`] and [`claim_folder`].
#[derive(Debug, thiserror::Error)]
pub enum FolderError {
    /// Another sweep that is still running uses the folder.
    #[error("another sparrow sweep (pid {pid}) is running in {dir}: wait for it, or stop it first")]
    Busy {
        /// The folder.
        dir: PathBuf,
        /// That sweep's pid.
        pid: u32,
    },
    /// A file of the folder could not be written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// This sweep's hold on its output folder: an exclusive `flock(2)` on `<dir>/sweep.lock`,
/// which also holds the sweep's pid for the message another sweep gets. The kernel drops the
/// lock when the process ends in any way, SIGKILL included, so a dead sweep never blocks
/// its folder, and two sweeps started together cannot both get it.
#[derive(Debug)]
pub struct FolderLock(#[allow(dead_code)] nix::fcntl::Flock<std::fs::File>);

/// Takes `dir` for this sweep, refusing it while another sweep holds it: two sweeps appending
/// to one `steps.jsonl` would mix their results. Keep the lock for the sweep's lifetime.
///
/// # Errors
/// [`FolderError::Busy`] when another sweep holds it; [`FolderError::Io`] when the lock file
/// cannot be opened or written.
pub fn claim_folder(dir: &Path) -> Result<FolderLock, FolderError> {
    use nix::fcntl::{Flock, FlockArg};
    use std::io::{Read as _, Seek as _};
    let path = dir.join("sweep.lock");
    let io = |source| FolderError::Io { path: path.clone(), source };
    let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(io)?;
    let mut lock = match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(l) => l,
        Err((mut f, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut text = String::new();
            let _ = f.read_to_string(&mut text);
            let pid = text.split_whitespace().next().and_then(|p| p.parse().ok()).unwrap_or(0);
            return Err(FolderError::Busy { dir: dir.to_owned(), pid });
        }
        Err((_, e)) => return Err(io(std::io::Error::from(e))),
    };
    lock.set_len(0).and_then(|()| lock.rewind()).map_err(io)?;
    writeln!(*lock, "{}", std::process::id()).map_err(io)?;
    Ok(FolderLock(lock))
}

/// Stops the servers an earlier sweep over `dir` launched and never stopped (it was killed
/// with SIGKILL, or the machine's OOM killer took it): each `server-<n>.pid` whose sweep is
/// gone and whose group still runs gets SIGTERM, then SIGKILL after `grace`, and a footer in
/// its log. Returns one line per server stopped, for the sweep to print.
///
/// # Errors
/// [`FolderError::Busy`] when the sweep that launched one of them still runs.
pub async fn reap_orphans(dir: &Path, grace: Duration) -> Result<Vec<String>, FolderError> {
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    files.retain(|p| {
        p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("server-") && n.ends_with(".pid"))
    });
    files.sort();
    let mut stopped = Vec::new();
    for path in files {
        let Some(owner) = std::fs::read_to_string(&path).ok().and_then(|t| PidFile::parse(&t)) else {
            let _ = std::fs::remove_file(&path);
            continue;
        };
        if owner.sweep_pid != std::process::id() && alive(owner.sweep_pid, owner.sweep_start) {
            return Err(FolderError::Busy { dir: dir.to_owned(), pid: owner.sweep_pid });
        }
        if owner.group_alive() {
            let group = Pid::from_raw(owner.pgid as i32);
            let t = Instant::now();
            let _ = killpg(group, Signal::SIGTERM);
            while owner.group_alive() && t.elapsed() < grace {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let how = if owner.group_alive() {
                let _ = killpg(group, Signal::SIGKILL);
                // Gone only once its port (and a GPU's memory) is free for the new launch.
                let t = Instant::now();
                while owner.group_alive() && t.elapsed() < Duration::from_secs(10) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                if owner.group_alive() {
                    "did not stop on SIGTERM, and still runs 10 s after SIGKILL".to_owned()
                } else {
                    "did not stop on SIGTERM: killed with SIGKILL".to_owned()
                }
            } else {
                format!("stopped by SIGTERM, {:.1} s after it was sent", t.elapsed().as_secs_f64())
            };
            let log = path.with_extension("log");
            let line = format!(
                "left running by sweep pid {} (gone without stopping it); {how} by the sweep that took the folder over",
                owner.sweep_pid
            );
            if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&log) {
                let _ = writeln!(f, "# sparrow sweep: {line} ({})", utc(SystemTime::now()));
            }
            let name = log.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
            stopped.push(format!("server of {name} (process group {}): {line}", owner.pgid));
        }
        let _ = std::fs::remove_file(&path);
    }
    Ok(stopped)
}

/// True when anything answers HTTP at `url` (any status) within `timeout`.
pub async fn answers(http: &reqwest::Client, url: &str, timeout: Duration) -> bool {
    http.get(url).timeout(timeout).send().await.is_ok()
}

/// Polls `url` until it answers 2xx, the process ends, or `timeout` passes, sampling memory
/// into `watch` once a second meanwhile (a model load is where many servers run out of it).
///
/// # Errors
/// The reason it never became ready.
pub async fn wait_ready(
    server: &mut Server,
    http: &reqwest::Client,
    url: &str,
    timeout: Duration,
    watch: &mut crate::monitor::MemWatch,
) -> Result<Duration, String> {
    let t0 = Instant::now();
    let mut last_sample: Option<Instant> = None;
    loop {
        if last_sample.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            last_sample = Some(Instant::now());
            let _ = watch.sample(Some(server.pid)).await;
        }
        if let Some(e) = server.exited() {
            return Err(format!("the server ended before it was ready: {}", e.describe()));
        }
        if let Ok(r) = http.get(url).timeout(Duration::from_secs(2)).send().await {
            if r.status().is_success() {
                return Ok(t0.elapsed());
            }
        }
        if t0.elapsed() > timeout {
            return Err(format!("{url} did not answer 2xx within {:.0} s (--startup-timeout)", timeout.as_secs_f64()));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_descriptions() {
        assert_eq!(ExitInfo { code: None, signal: Some(9) }.describe(), "killed by SIGKILL");
        let shell = ExitInfo { code: Some(139), signal: None };
        assert_eq!(shell.effective_signal(), Some(11));
        assert!(shell.describe().contains("SIGSEGV"), "{}", shell.describe());
        assert_eq!(ExitInfo { code: Some(1), signal: None }.effective_signal(), None);
    }

    #[test]
    fn utc_format_and_prefix() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_575_207_123);
        assert_eq!(utc(t), "2025-12-01T07:46:47.123Z");
        assert_eq!(strip_prefix("2025-12-01T07:46:47.123Z +1.000s err| boom | x"), Some("boom | x"));
        assert_eq!(strip_prefix("# header"), None);
    }

    #[test]
    fn pid_file_round_trip_and_start_time() {
        let me = std::process::id();
        let start = start_time(me);
        assert!(start.is_some(), "no /proc/{me}/stat start time");
        assert!(alive(me, start));
        assert!(!alive(me, start.map(|t| t + 1)), "another start time is another process");
        let f = PidFile { pgid: 4242, start: Some(17), sweep_pid: me, sweep_start: None };
        assert_eq!(PidFile::parse(&f.to_line()), Some(f));
        assert_eq!(PidFile::parse("1 2 3"), None);
        assert_eq!(PidFile::parse("0 - 3 -"), None, "group 0 would be the sweep's own");
    }

    #[tokio::test]
    async fn orphaned_group_is_reaped_and_a_live_sweep_keeps_its_folder() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("server-1.log");
        let s = Server::launch("sleep 30 & sleep 30", 1, &log).expect("launch");
        let pgid = s.pid;
        tokio::time::sleep(Duration::from_millis(200)).await;
        // As a sweep killed with SIGKILL leaves it: the group runs on, its pid file stays.
        std::mem::forget(s);
        // Still this process's: another sweep must not take the folder.
        let owner = PidFile::parse(&std::fs::read_to_string(dir.path().join("server-1.pid")).expect("pid file"))
            .expect("parses");
        assert_eq!((owner.pgid, owner.sweep_pid), (pgid, std::process::id()));
        assert!(owner.group_alive());
        // Written as a sweep that is gone (pid 1 never started at that tick).
        let gone = PidFile { sweep_pid: 1, sweep_start: Some(u64::MAX), ..owner };
        std::fs::write(dir.path().join("server-1.pid"), gone.to_line()).expect("write");
        let stopped = reap_orphans(dir.path(), Duration::from_secs(2)).await.expect("reap");
        assert_eq!(stopped.len(), 1, "{stopped:?}");
        assert!(stopped[0].contains("stopped by SIGTERM"), "{stopped:?}");
        assert!(!owner.group_alive(), "the orphaned group still runs");
        assert!(!dir.path().join("server-1.pid").exists());
        assert!(std::fs::read_to_string(&log).expect("log").contains("left running by sweep pid 1"));
        // A held folder is refused (flock locks belong to the open file, so a second open in
        // this process stands for another sweep); once let go, it can be taken.
        let held = claim_folder(dir.path()).expect("a free folder");
        let me = std::process::id();
        assert!(matches!(claim_folder(dir.path()), Err(FolderError::Busy { pid, .. }) if pid == me));
        drop(held);
        claim_folder(dir.path()).expect("a folder let go");
    }

    #[tokio::test]
    async fn launch_logs_both_streams_and_stops_the_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("server-1.log");
        // A child that ignores nothing, plus a grandchild: both must go on stop. The shell waits
        // in short steps: `sh -c` (dash) catches SIGINT and acts on it between commands, so a
        // SIGINT that came while it was forking a 30 s foreground `sleep` (after the lines below
        // were logged, before the sleep existed) left it waiting 30 s; that failed under load.
        // The trap: a SIGINT that lands just as a `sleep 0.1` ends normally is otherwise
        // ignored (the shell only exits when its foreground child died of the signal), and the
        // loop went on past the grace (seen once in a loaded CI run).
        let cmd = "echo hello; echo oops >&2; sleep 30 & trap 'exit 130' INT; while :; do sleep 0.1; done";
        let mut s = Server::launch(cmd, 1, &log).expect("launch");
        // Until both lines are in the log (a fixed 300 ms wait failed once on a loaded machine:
        // the stop came before the shell had printed).
        let logged = |t: &str| t.contains("out| hello") && t.contains("err| oops");
        for _ in 0..200 {
            if std::fs::read_to_string(&log).is_ok_and(|t| logged(&t)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(s.exited().is_none());
        let how = s.stop(Duration::from_secs(2)).await;
        assert!(how.contains("SIGINT"), "{how}");
        let text = std::fs::read_to_string(&log).expect("log");
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("# sparrow sweep: server 1"), "{text}");
        assert!(lines.iter().any(|l| l.ends_with("out| hello")), "{text}");
        assert!(lines.iter().any(|l| l.ends_with("err| oops")), "{text}");
        assert!(lines.last().is_some_and(|l| l.contains("stopped by SIGINT")), "{text}");
    }
}
