//! Data-parallel `sparrow serve` behind sglang-router: `scripts/ops/fleet.sh` starts two workers
//! (SmolLM2, one thread each) and the router (pip-installed into the cache directory on
//! first use), and `sparrow bench` drives a shared-prefix workload through the router.
//!
//! One test, three phases, so that at most one fleet loads the machine at a time:
//! 1. `--policy cache_aware`: every request succeeds, both workers serve, and the fleet's
//!    radix hit rate (cached prompt tokens over prompt tokens, summed over the workers'
//!    `/metrics`) is recorded;
//! 2. `--policy round_robin`, the same workload: its hit rate must be clearly lower;
//! 3. one worker is SIGKILLed while it runs requests: the bench counts the failures by
//!    cause, requests sent after one health-check interval all succeed on the other worker,
//!    and the run ends on time.
//!
//! Phases 1 and 2 keep two requests in flight (`--max-concurrency 2`): cache_aware sends a
//! prompt that matches no cached prefix to the worker with fewer requests in flight (ties to
//! the first), so one at a time would put every group on worker 0; two spread the groups,
//! and two prompts of one group rarely overlap (one pair in about 16).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs_f64()
}

/// A running `scripts/ops/fleet.sh`; dropped, it gets SIGTERM and stops its workers and router.
struct Fleet {
    child: Child,
    env: HashMap<String, String>,
    _dir: tempfile::TempDir,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Fleet {
    fn var(&self, k: &str) -> &str {
        self.env.get(k).map(String::as_str).unwrap_or_else(|| panic!("fleet.env has no {k}: {:?}", self.env))
    }
    fn worker_ports(&self) -> [u16; 2] {
        [0, 1].map(|i| {
            let url = self.var(&format!("WORKER{i}_URL"));
            url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port in url")
        })
    }
}

/// Four free consecutive ports: two workers, the router, its Prometheus listener. Below
/// Linux's ephemeral range (32768..), so no outgoing connection takes one meanwhile.
fn ports() -> (u16, u16, u16) {
    let seed = u64::from(std::process::id()) ^ unix_now().to_bits();
    for k in 0..500u64 {
        let a = 20_000 + (seed.wrapping_mul(2_654_435_761).wrapping_add(k * 97) % 12_000) as u16;
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if (a..a + 4).all(free) {
            return (a, a + 2, a + 3);
        }
    }
    panic!("no four free consecutive ports");
}

fn start_fleet(router_flags: &[&str]) -> Fleet {
    let dir = tempfile::tempdir().expect("tempdir");
    let (workers, router, prom) = ports();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ops/fleet.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(script)
        .arg("2")
        // No batch-cap timing while other tests load the machine (see serve.rs).
        .args(["--disable-autotune", "--max-running-requests", "8", "--max-total-tokens", "30000"])
        .arg("--")
        .args(["--prometheus-host", "127.0.0.1", "--prometheus-port", &prom.to_string(), "--log-level", "warn"])
        .args(router_flags)
        .env("SPARROW", env!("CARGO_BIN_EXE_sparrow"))
        .env("FLEET_DIR", dir.path())
        .env("WORKER_BASE_PORT", workers.to_string())
        .env("ROUTER_PORT", router.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let child = cmd.spawn().expect("bash runs scripts/ops/fleet.sh");
    let mut fleet = Fleet { child, env: HashMap::new(), _dir: dir };
    let env_file = fleet._dir.path().join("fleet.env");
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        let text = std::fs::read_to_string(&env_file).unwrap_or_default();
        if text.lines().any(|l| l == "READY=1") {
            fleet.env = text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect();
            return fleet;
        }
        if let Ok(Some(status)) = fleet.child.try_wait() {
            panic!("scripts/ops/fleet.sh exited before the fleet was ready: {status}");
        }
        assert!(Instant::now() < deadline, "the fleet was not ready in 900 s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// GET `path` on `127.0.0.1:port`; the body.
fn http_get(port: u16, path: &str) -> String {
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(c, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").expect("write");
    let mut s = String::new();
    c.read_to_string(&mut s).expect("read");
    s.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default()
}

/// A counter's value in a Prometheus text page.
fn counter(page: &str, name: &str) -> f64 {
    page.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{page}"))
}

/// (prompt tokens, cached tokens, requests) of each worker.
fn worker_counts(f: &Fleet) -> Vec<(f64, f64, f64)> {
    f.worker_ports()
        .iter()
        .map(|&p| {
            let m = http_get(p, "/metrics");
            (
                counter(&m, "sglang:prompt_tokens_total"),
                counter(&m, "sglang:cached_tokens_total"),
                counter(&m, "sglang:num_requests_total"),
            )
        })
        .collect()
}

struct BenchRun {
    code: i32,
    result: Value,
    stdout: String,
}

/// `sparrow bench` of a generated-shared-prefix workload through `router`; its result line.
fn bench(router: &str, out: &Path, flags: &[impl AsRef<std::ffi::OsStr>]) -> BenchRun {
    let o = Command::new(env!("CARGO_BIN_EXE_sparrow"))
        .args(["bench", "--base-url", router, "--backend", "sglang"])
        .args([
            "--dataset-name",
            "generated-shared-prefix",
            "--disable-tqdm",
            "--warmup-requests",
            "0",
            "--strict-json",
        ])
        .args(["--output-file", out.to_str().expect("utf8")])
        .args(flags)
        .output()
        .expect("sparrow bench runs");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let line = std::fs::read_to_string(out).unwrap_or_else(|e| panic!("no result line ({e}):\n{stdout}"));
    let result: Value = serde_json::from_str(line.lines().last().expect("a line")).expect("result json");
    BenchRun { code: o.status.code().unwrap_or(-1), result, stdout }
}

/// 12 system prompts of 128 tokens, 4 questions of 8 tokens each, 4 output tokens.
const SHARED_PREFIX: &[&str] = &[
    "--gsp-num-groups",
    "12",
    "--gsp-prompts-per-group",
    "4",
    "--gsp-system-prompt-len",
    "128",
    "--gsp-question-len",
    "8",
    "--gsp-output-len",
    "4",
    "--max-concurrency",
    "2",
];

/// Runs the shared-prefix workload on a fresh fleet with `policy`; the fleet's hit rate.
fn hit_rate(policy: &str, out: PathBuf) -> f64 {
    let fleet = start_fleet(&["--policy", policy]);
    let before = worker_counts(&fleet);
    let run = bench(fleet.var("ROUTER_URL"), &out, SHARED_PREFIX);
    assert_eq!(run.code, 0, "{policy}: {}", run.result);
    assert_eq!(run.result["completed"], 48, "{policy}: every request succeeds: {}", run.result);
    let after = worker_counts(&fleet);
    let served: Vec<f64> = before.iter().zip(&after).map(|(b, a)| a.2 - b.2).collect();
    assert!(served.iter().all(|&n| n > 0.0), "{policy}: both workers served traffic: {served:?}");
    let prompt: f64 = before.iter().zip(&after).map(|(b, a)| a.0 - b.0).sum();
    let cached: f64 = before.iter().zip(&after).map(|(b, a)| a.1 - b.1).sum();
    eprintln!("{policy}: requests per worker {served:?}, {cached} of {prompt} prompt tokens cached");
    cached / prompt
}

#[test]
fn two_workers_behind_sglang_router() {
    let dir = tempfile::tempdir().expect("tempdir");

    // 1 and 2: cache-aware routing keeps each prefix group on one worker.
    let aware = hit_rate("cache_aware", dir.path().join("aware.jsonl"));
    let rr = hit_rate("round_robin", dir.path().join("rr.jsonl"));
    eprintln!("fleet radix hit rate: cache_aware {aware:.3}, round_robin {rr:.3}");
    // 48 prompts of 136 tokens in 12 groups: one miss of the 128-token prefix per group and
    // worker it reaches. cache_aware: 12 misses (hit rate ≈ 0.71, less a few overlaps);
    // round_robin spreads a group over both workers (≈ 23 misses, ≈ 0.48).
    assert!(aware > 0.55, "cache_aware hit rate {aware}");
    assert!(aware > rr + 0.1, "cache_aware {aware} is not clearly above round_robin {rr}");

    // 3: a worker dies mid-run.
    let interval = 2u64;
    let fleet = start_fleet(&[
        "--policy",
        "cache_aware",
        "--health-check-interval-secs",
        &interval.to_string(),
        "--health-failure-threshold",
        "1",
    ]);
    let ports = fleet.worker_ports();
    let pids = [0, 1].map(|i| fleet.var(&format!("WORKER{i}_PID")).parse::<i32>().expect("pid"));
    let out = dir.path().join("kill.jsonl");
    let flags: Vec<String> = [
        "--gsp-num-groups",
        "6",
        "--gsp-prompts-per-group",
        "8",
        "--gsp-system-prompt-len",
        "64",
        "--gsp-question-len",
        "8",
        "--gsp-output-len",
        "24",
        "--request-rate",
        "4",
        "--read-timeout",
        "60",
    ]
    .map(String::from)
    .into();
    // The bench's clock starts at --start-at, so the kill is placed on its time line whatever
    // its set-up takes.
    let start_at = unix_now() + 10.0;
    let bench_thread = {
        let out = out.clone();
        let router = fleet.var("ROUTER_URL").to_owned();
        let mut flags = flags;
        flags.extend(["--start-at".to_owned(), format!("{start_at:.3}")]);
        std::thread::spawn(move || bench(&router, &out, &flags))
    };
    // Kill a worker while it is running requests (so some are cut mid-stream), 2 s or more
    // into the run.
    std::thread::sleep(Duration::from_secs_f64((start_at + 2.0 - unix_now()).max(0.0)));
    let deadline = Instant::now() + Duration::from_secs(30);
    let victim = loop {
        let busy = (0..2).find(|&i| {
            let load: Value = serde_json::from_str(&http_get(ports[i], "/get_load")).unwrap_or(Value::Null);
            load[0]["num_reqs"].as_u64().unwrap_or(0) > 0
        });
        if let Some(i) = busy {
            break i;
        }
        assert!(Instant::now() < deadline, "no worker was ever busy");
        std::thread::sleep(Duration::from_millis(20));
    };
    kill(Pid::from_raw(pids[victim]), Signal::SIGKILL).expect("SIGKILL the worker");
    let killed_at = unix_now() - start_at;
    let survivor = ports[1 - victim];
    let survivor_before = counter(&http_get(survivor, "/metrics"), "sglang:num_requests_total");
    let run = bench_thread.join().expect("bench thread");
    let elapsed = unix_now() - start_at;
    let result = run.result;
    eprintln!("killed worker {victim} at {killed_at:.1} s; bench: {}", run.stdout);

    let failed = result["failed"].as_u64().expect("failed");
    let by_cause: u64 =
        result["errors_by_cause"].as_object().expect("by cause").values().filter_map(Value::as_u64).sum();
    assert!(failed >= 1, "requests running on the killed worker fail: {result}");
    assert_eq!(by_cause, failed, "every failure is counted under a cause: {result}");
    assert_eq!(run.code, 1, "failures above --max-failure-rate 0 exit 1");
    assert_eq!(result["completed"].as_u64().expect("completed") + failed, 48);
    // Requests sent after the health check has had one interval (plus its timeout) to see
    // the dead worker all succeed: the router sends them to the survivor.
    let details = std::fs::read_to_string(dir.path().join("kill.requests.jsonl")).expect("records");
    let records: Vec<Value> = details.lines().map(|l| serde_json::from_str(l).expect("record")).collect();
    let settled = killed_at + interval as f64 + 1.0;
    let late: Vec<&Value> = records.iter().filter(|r| r["sent_s"].as_f64().expect("sent") > settled).collect();
    assert!(!late.is_empty(), "the run went on past the health check");
    for r in &late {
        assert!(r["failure"].is_null(), "a request sent {settled:.1} s after the kill failed: {r}");
    }
    let survivor_after = counter(&http_get(survivor, "/metrics"), "sglang:num_requests_total");
    assert!(survivor_after > survivor_before, "the surviving worker kept serving");
    // On time: 48 arrivals at 4/s take about 12 s; the cut streams must not hang the run.
    let last_due = records.iter().filter_map(|r| r["scheduled_s"].as_f64()).fold(0.0, f64::max);
    assert!(elapsed < last_due + 90.0, "the run took {elapsed:.0} s for arrivals over {last_due:.0} s");
    drop(fleet);
}
