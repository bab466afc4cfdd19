//! Memory facts sampled once a second while a step runs: the server's RSS summed over its
//! whole process tree (from `/proc`), the machine's `MemAvailable`, the cgroup's
//! `memory.max`, `memory.current` and `memory.events` `oom_kill` (cgroup v2), and, where
//! `nvidia-smi` exists, GPU memory used/total. These are the evidence for and against an
//! out-of-memory verdict.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

/// `/proc/meminfo` field in bytes (`MemTotal`, `MemAvailable`).
pub fn meminfo(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok().flatten().map_or(4096, |p| p as u64)
}

/// `root` and every descendant (parent links from `/proc/<pid>/stat`); just `root` when
/// `/proc` cannot be read.
pub fn tree_pids(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
            // `pid (comm) state ppid ...`: comm may hold spaces and parentheses.
            let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else { continue };
            if let Some(ppid) = after.split_whitespace().nth(1).and_then(|s| s.parse::<u32>().ok()) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let (mut stack, mut out) = (vec![root], vec![]);
    while let Some(p) = stack.pop() {
        out.push(p);
        if let Some(c) = children.get(&p) {
            stack.extend(c);
        }
    }
    out
}

/// Resident bytes of `root` and every descendant. 0 when `root` is gone.
pub fn tree_rss(root: u32) -> u64 {
    pids_rss(&tree_pids(root))
}

/// Resident bytes of the processes `pids` (those gone count 0).
pub fn pids_rss(pids: &[u32]) -> u64 {
    let page = page_size();
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/statm")).ok())
        .map(|statm| statm.split_whitespace().nth(1).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0) * page)
        .sum()
}

/// The cgroup v2 folder of `pid` (`/sys/fs/cgroup` + the `0::` line of `/proc/<pid>/cgroup`).
pub fn cgroup_of(pid: u32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/'));
    dir.join("memory.events").exists().then_some(dir)
}

/// `memory.max` in bytes (`None` for `max` or no file).
pub fn cgroup_max(dir: &Path) -> Option<u64> {
    std::fs::read_to_string(dir.join("memory.max")).ok()?.trim().parse().ok()
}

/// `memory.current` in bytes.
pub fn cgroup_current(dir: &Path) -> Option<u64> {
    std::fs::read_to_string(dir.join("memory.current")).ok()?.trim().parse().ok()
}

/// The `oom_kill` count of `memory.events`.
pub fn cgroup_oom_kills(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join("memory.events")).ok()?;
    text.lines().find_map(|l| l.strip_prefix("oom_kill "))?.trim().parse().ok()
}

/// GPU memory (used, total) in MiB summed over GPUs, when `nvidia-smi` answers.
pub async fn gpu_memory() -> Option<(u64, u64)> {
    let out = tokio::time::timeout(
        Duration::from_secs(3),
        tokio::process::Command::new("nvidia-smi")
            .args(["--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .ok()?
    .ok()?;
    if !out.status.success() {
        return None;
    }
    let (mut used, mut total) = (0, 0);
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let mut it = l.split(',').map(|s| s.trim().parse::<u64>().ok());
        used += it.next()??;
        total += it.next()??;
    }
    Some((used, total))
}

/// True when `nvidia-smi` is on the PATH.
pub fn has_nvidia_smi() -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("nvidia-smi").is_file()))
}

/// Memory evidence gathered over one step (or one server's life within it).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct MemEvidence {
    /// Samples taken.
    pub samples: usize,
    /// Largest server-tree RSS seen, bytes.
    pub peak_rss: u64,
    /// Smallest `MemAvailable` seen, bytes.
    pub min_available: Option<u64>,
    /// `MemTotal`, bytes.
    pub mem_total: Option<u64>,
    /// The cgroup folder read.
    pub cgroup: Option<String>,
    /// `memory.max`, bytes (`None`: no limit).
    pub cgroup_max: Option<u64>,
    /// Largest `memory.current`, bytes.
    pub cgroup_peak: Option<u64>,
    /// `oom_kill` at the start of the step.
    pub oom_kills_before: Option<u64>,
    /// `oom_kill` at the end (read after the server died).
    pub oom_kills_after: Option<u64>,
    /// Largest GPU memory used and the total, MiB.
    pub gpu_peak_mib: Option<(u64, u64)>,
    /// False for a server the sweep did not launch: its RSS is unknown.
    pub owned: bool,
}

impl MemEvidence {
    /// Reads `oom_kill` again (after the server has ended: the kernel's record may come
    /// after the step's requests have already failed).
    pub fn refresh_oom_kills(&mut self) {
        if let Some(dir) = self.cgroup.as_deref() {
            if let Some(n) = cgroup_oom_kills(Path::new(dir)) {
                self.oom_kills_after = Some(n);
            }
        }
    }

    /// The memory limit that applied: the cgroup's, else the machine's.
    pub fn limit(&self) -> Option<u64> {
        match (self.cgroup_max, self.mem_total) {
            (Some(c), Some(m)) => Some(c.min(m)),
            (c, m) => c.or(m),
        }
    }
    /// OOM kills recorded in the cgroup during the step.
    pub fn oom_kills(&self) -> u64 {
        match (self.oom_kills_before, self.oom_kills_after) {
            (Some(b), Some(a)) => a.saturating_sub(b),
            _ => 0,
        }
    }
    /// True when the server's peak RSS came within 5 % of the limit, or the machine ran
    /// below 3 % available memory (a machine-wide OOM kill leaves no cgroup record).
    /// The cgroup's `memory.current` is not used: it counts page cache, which a model load
    /// fills up to the limit without any memory pressure.
    pub fn at_limit(&self) -> bool {
        let rss_at = self.limit().is_some_and(|l| self.owned && self.peak_rss as f64 >= 0.95 * l as f64);
        let machine_low = match (self.min_available, self.mem_total) {
            (Some(a), Some(t)) => (a as f64) < 0.03 * t as f64,
            _ => false,
        };
        rss_at || machine_low
    }
    /// "peak RSS 4.1 GiB of 24.0 GiB (MemTotal)" and the cgroup and GPU figures.
    pub fn describe(&self) -> String {
        let mut parts = vec![];
        let lim = match (self.cgroup_max, self.mem_total) {
            (Some(c), m) if m.is_none_or(|m| c < m) => format!("{} (cgroup memory.max)", gib(c)),
            (_, Some(m)) => format!("{} (MemTotal)", gib(m)),
            _ => "an unknown limit".into(),
        };
        if self.owned {
            parts.push(format!("peak RSS {} of {lim}", gib(self.peak_rss)));
        } else {
            parts.push("server not launched by the sweep: its RSS is not known".into());
        }
        if let Some(a) = self.min_available {
            parts.push(format!("MemAvailable never below {}", gib(a)));
        }
        match (self.oom_kills_before, self.oom_kills_after) {
            (Some(b), Some(a)) if a > b => parts.push(format!("memory.events oom_kill {b} -> {a}")),
            (Some(b), _) => parts.push(format!("memory.events oom_kill unchanged ({b})")),
            _ => parts.push("no cgroup memory.events to read".into()),
        }
        if let Some((u, t)) = self.gpu_peak_mib {
            parts.push(format!("GPU memory peak {u} of {t} MiB"));
        }
        parts.join("; ")
    }
}

/// Bytes as `x.y GiB` (or MiB below one GiB).
pub fn gib(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

/// Samples memory for one step.
#[derive(Debug)]
pub struct MemWatch {
    /// What was seen.
    pub ev: MemEvidence,
    cgroup: Option<PathBuf>,
    gpu: bool,
}

impl MemWatch {
    /// Starts watching `pid` (the server; `None` for a server the sweep does not own, where
    /// only the machine is sampled). `cgroup` overrides the server's own cgroup folder.
    pub fn new(pid: Option<u32>, cgroup: Option<PathBuf>) -> Self {
        let cgroup = cgroup.or_else(|| pid.and_then(cgroup_of)).or_else(|| cgroup_of(std::process::id()));
        let ev = MemEvidence {
            mem_total: meminfo("MemTotal"),
            cgroup: cgroup.as_ref().map(|c| c.display().to_string()),
            cgroup_max: cgroup.as_deref().and_then(cgroup_max),
            oom_kills_before: cgroup.as_deref().and_then(cgroup_oom_kills),
            owned: pid.is_some(),
            ..Default::default()
        };
        MemWatch { ev, cgroup, gpu: has_nvidia_smi() }
    }

    /// Takes one sample; returns the server tree's RSS now.
    pub async fn sample(&mut self, pid: Option<u32>) -> u64 {
        let rss = pid.map_or(0, tree_rss);
        let e = &mut self.ev;
        e.samples += 1;
        e.peak_rss = e.peak_rss.max(rss);
        if let Some(a) = meminfo("MemAvailable") {
            e.min_available = Some(e.min_available.map_or(a, |m| m.min(a)));
        }
        if let Some(c) = self.cgroup.as_deref().and_then(cgroup_current) {
            e.cgroup_peak = Some(e.cgroup_peak.map_or(c, |p| p.max(c)));
        }
        if self.gpu {
            if let Some((u, t)) = gpu_memory().await {
                e.gpu_peak_mib = Some(e.gpu_peak_mib.map_or((u, t), |(pu, _)| (pu.max(u), t)));
            }
        }
        rss
    }

    /// Reads the end-of-step `oom_kill` count and returns the evidence.
    pub fn finish(mut self) -> MemEvidence {
        self.ev.oom_kills_after = self.cgroup.as_deref().and_then(cgroup_oom_kills);
        self.ev
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_tree_and_machine() {
        let rss = tree_rss(std::process::id());
        assert!(rss > 1 << 20, "this test process holds more than 1 MiB: {rss}");
        assert!(meminfo("MemTotal").is_some_and(|t| t > rss));
        assert_eq!(tree_rss(u32::MAX), 0);
    }

    #[test]
    fn cgroup_files_are_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("memory.max"), "1073741824\n").expect("write");
        std::fs::write(dir.path().join("memory.events"), "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n").expect("write");
        assert_eq!(cgroup_max(dir.path()), Some(1 << 30));
        assert_eq!(cgroup_oom_kills(dir.path()), Some(2));
        std::fs::write(dir.path().join("memory.max"), "max\n").expect("write");
        assert_eq!(cgroup_max(dir.path()), None);
    }

    #[test]
    fn evidence_both_ways() {
        let ev = MemEvidence {
            peak_rss: 4 << 30,
            mem_total: Some(24 << 30),
            oom_kills_before: Some(0),
            oom_kills_after: Some(0),
            owned: true,
            ..Default::default()
        };
        assert!(!ev.at_limit());
        // Page cache in the cgroup up to its limit is not memory pressure.
        let cache = MemEvidence { cgroup_max: Some(8 << 30), cgroup_peak: Some(8 << 30), ..ev.clone() };
        assert!(!cache.at_limit());
        let machine = MemEvidence { min_available: Some(200 << 20), ..ev.clone() };
        assert!(machine.at_limit());
        assert_eq!(ev.oom_kills(), 0);
        assert!(ev.describe().starts_with("peak RSS 4.0 GiB of 24.0 GiB (MemTotal)"), "{}", ev.describe());
        let full = MemEvidence { cgroup_max: Some(1 << 30), peak_rss: 1 << 30, oom_kills_after: Some(1), ..ev };
        assert!(full.at_limit());
        assert_eq!(full.oom_kills(), 1);
        assert!(full.describe().contains("(cgroup memory.max)") && full.describe().contains("oom_kill 0 -> 1"));
    }
}
