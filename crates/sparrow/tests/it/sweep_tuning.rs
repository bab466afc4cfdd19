//! `sparrow sweep` as a tuning loop over scripted `sparrow mock-server`s: a grid of server
//! configurations × workloads (`--serve-params`, `--bench-params`), where a configuration that
//! dies (each `--die-how`, a real death of a real process) gets its verdict, its log and its
//! partial block while the grid goes on, and a sweep killed mid-grid resumes without losing a
//! finished step; and the SLO search (`--slo`) for the highest load a server meets its SLOs at.

use std::path::Path;

use serde_json::Value;

use crate::common::free_port;
use crate::sweep::{run, show, sigkill_when, steps, summary, sweep_args, SPARROW};

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("params file");
    p.to_str().expect("utf8").to_owned()
}

#[test]
fn grid_goes_on_past_every_kind_of_death() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = tempfile::tempdir().expect("files");
    let port = free_port();
    // Request 12 is the 5th of step 2 (8 prompts per step): each dying configuration dies
    // mid-step. The address-space limit lets `--die-how alloc` fail its allocation.
    let serve = write(
        files.path(),
        "serve.json",
        r#"{"healthy": {"max_running": 4},
            "cut": {"die_after": 12},
            "panic": {"die_after": 12, "die_how": "panic"},
            "segv": {"die_after": 12, "die_how": "segv"},
            "alloc": {"die_after": 12, "die_how": "alloc"},
            "hang": {"die_after": 12, "die_how": "hang"},
            "last": {"max_running": 2}}"#,
    );
    let template =
        format!("ulimit -v 3000000; exec '{SPARROW}' mock-server --listen 127.0.0.1:{port} --chunk-delay-ms 10");
    let mut a = sweep_args(dir.path(), port);
    a.extend(["--server-cmd".into(), template, "--serve-params".into(), serve]);
    a.extend(["--concurrency", "1,4", "--hang-timeout", "3"].map(String::from));
    let o = run(&a);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let st = steps(dir.path());
    let rows: Vec<(&str, &str)> =
        st.iter().map(|s| (s["config"].as_str().unwrap_or(""), s["status"].as_str().unwrap_or(""))).collect();
    let mut want = vec![("healthy", "ok"), ("healthy", "ok")];
    for c in ["cut", "panic", "segv", "alloc", "hang"] {
        want.extend([(c, "ok"), (c, "crashed")]);
    }
    want.extend([("last", "ok"), ("last", "ok")]);
    assert_eq!(rows, want, "{}", show(&o));
    let mut logs = std::collections::HashSet::new();
    for (c, verdict) in
        [("cut", "exited"), ("panic", "defect"), ("segv", "defect"), ("alloc", "out-of-memory"), ("hang", "hang")]
    {
        let s = st.iter().find(|s| s["config"] == c && s["status"] == "crashed").expect("crashed step");
        assert_eq!(s["verdict"], verdict, "{c}: {s}");
        assert_eq!(s["concurrency"], 4);
        assert!(s["completed"].as_u64().expect("completed") < 8, "{c}: partial: {s}");
        let block = std::fs::read_to_string(dir.path().join(s["block_file"].as_str().expect("block"))).expect("block");
        assert!(block.contains("Successful requests:"), "{c}: {block}");
        let log = s["server_log"].as_str().expect("log").to_owned();
        let text = std::fs::read_to_string(dir.path().join(&log)).expect("log file");
        assert!(text.contains("--die-after 12") || text.contains("mock"), "{c}: {text}");
        assert!(logs.insert(log), "{c}: each configuration has a server log of its own");
    }
    let grid = &summary(dir.path())["grid"];
    let cells = grid["cells"].as_array().expect("cells");
    assert_eq!(cells.len(), 7);
    assert!(cells[0]["trouble"].is_null() && cells[6]["trouble"].is_null());
    assert!(cells[2]["trouble"].as_str().expect("trouble").starts_with("crashed at 4: defect"), "{}", cells[2]);
    assert_eq!(grid["configurations"][1]["server_cmd"].as_str().map(|c| c.ends_with("--die-after 12")), Some(true));
    // The baseline (the first configuration) against the rest, in words.
    let words = grid["against_baseline"].as_array().expect("words");
    let panic = words.iter().filter_map(Value::as_str).find(|w| w.starts_with("panic")).expect("panic vs healthy");
    assert!(panic.contains("`--die-after 12 --die-how panic without --max-running 4`"), "{panic}");
    assert!(panic.contains("crashed at 4 (defect) where healthy ran"), "{panic}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("Grid: 7 configuration(s) x 1 workload(s)") && stdout.contains("Pareto front"), "{stdout}");
    let html = std::fs::read_to_string(dir.path().join("report.html")).expect("report");
    assert!(html.contains("<table id=\"grid\">") && html.contains("id=\"plot-pareto\""), "the grid and its front");
}

/// Two configurations linked to the step axis (each runs at its own cap) × two workloads;
/// the sweep is SIGKILLed during the second configuration and `--resume` keeps the first
/// configuration's steps, stops the orphaned server and runs the rest.
#[test]
fn linked_grid_of_workloads_resumes_after_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = tempfile::tempdir().expect("files");
    let port = free_port();
    let serve = write(files.path(), "serve.json", r#"[{"max_running": 1}, {"max_running": 2}]"#);
    let bench = write(files.path(), "bench.json", r#"{"short": {}, "long": {"random_output_len": 9}}"#);
    let mut a = sweep_args(dir.path(), port);
    a.extend([
        "--server-cmd".into(),
        format!("'{SPARROW}' mock-server --listen 127.0.0.1:{port} --chunk-delay-ms 40 --log-requests"),
        "--serve-params".into(),
        serve,
        "--bench-params".into(),
        bench,
    ]);
    a.extend(
        ["--concurrency", "1,2", "--link-vars", "max_running=max_concurrency", "--num-prompts-per-step", "12"]
            .map(String::from),
    );
    sigkill_when(&a, &dir.path().join("steps/03-max-running=2:short-c2.requests.jsonl"), 3, 90);
    let lines = std::fs::read_to_string(dir.path().join("steps.jsonl")).expect("steps.jsonl");
    assert_eq!(lines.lines().count(), 2, "the first configuration's two steps: {lines}");

    let mut again = a.clone();
    again.push("--resume".into());
    let o = run(&again);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("step 1/4 (max-running=1:short) already measured: kept"), "{err}");
    assert!(err.contains("step 2/4 (max-running=1:long) already measured: kept"), "{err}");
    assert!(err.contains("left running by sweep pid"), "the orphan is stopped: {err}");
    let st = steps(dir.path());
    let got: Vec<(&str, u64, u64)> = st
        .iter()
        .map(|s| {
            (
                s["label"].as_str().unwrap_or(""),
                s["concurrency"].as_u64().unwrap_or(0),
                s["total_output_tokens"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("max-running=1:short", 1, 60),
            ("max-running=1:long", 1, 108),
            ("max-running=2:short", 2, 60),
            ("max-running=2:long", 2, 108)
        ],
        "each configuration at its linked cap; the long workload's 9 output tokens"
    );
    assert!(st.iter().all(|s| s["status"] == "ok" && s["completed"] == 12), "{st:?}");
    // The second configuration ran on a fresh server after the resume: its own log.
    assert_eq!(st[2]["server_log"], st[3]["server_log"]);
    assert_ne!(st[0]["server_log"], st[2]["server_log"]);
    assert!(dir.path().join("steps/03-max-running=2:short-c2.earlier1.requests.jsonl").exists());
}

/// A server that answers at most `cap` requests at once keeps TTFT near 1 ms up to
/// concurrency `cap` and queues a request behind a whole answer (5 chunks of 20 ms) beyond it,
/// for about one request in `cap + 1`: with `ttft_p95<=30` the search brackets the cap with
/// the listed 1, 2, 16 and bisects to it exactly, per configuration.
#[test]
fn slo_search_finds_each_configurations_cap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = tempfile::tempdir().expect("files");
    let port = free_port();
    let serve = write(files.path(), "serve.json", r#"{"cap3": {"max_running": 3}, "cap6": {"max_running": 6}}"#);
    let mut a = sweep_args(dir.path(), port);
    a.extend([
        "--server-cmd".into(),
        format!("'{SPARROW}' mock-server --listen 127.0.0.1:{port} --chunk-delay-ms 20"),
        "--serve-params".into(),
        serve,
    ]);
    a.extend(
        [
            "--concurrency",
            "1,2,16",
            "--num-prompts-per-step",
            "42",
            "--slo",
            "ttft_p95<=30",
            "--scrape-interval",
            "0.1",
        ]
        .map(String::from),
    );
    let o = run(&a);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let s = summary(dir.path());
    let rows = s["slo"]["rows"].as_array().expect("SLO rows");
    for (row, cap) in rows.iter().zip([3, 6]) {
        assert_eq!(row["highest_met"], cap, "{row}");
        assert_eq!(row["lowest_missed"], cap + 1, "{row}");
        let probes: Vec<u64> =
            row["probes"].as_array().expect("probes").iter().map(|p| p["value"].as_u64().unwrap_or(0)).collect();
        assert_eq!(&probes[..3], [1, 2, 16], "bracketing first: {row}");
        assert!(probes.len() <= 3 + 4, "bisection from 2..16 takes at most 4 probes: {row}");
        let miss =
            row["probes"].as_array().expect("probes").iter().find(|p| p["value"] == cap + 1).expect("the missed probe");
        assert!(miss["missed_terms"][0].as_str().expect("why").starts_with("TTFT p95 <= 30 ms:"), "{miss}");
        // Why: the scraped metrics show the cap, named by the server's own max_running_requests.
        let limit = format!("limit: the server runs at most {cap} at once (max_running_requests)");
        assert!(miss["missed_terms"][1].as_str().expect("limit").starts_with(&limit), "{miss}");
        assert!(row["goodput"].as_f64().expect("goodput") > 0.0);
    }
    // Each configuration's steps carry their judgement; the search adds the bisected values.
    let st = steps(dir.path());
    assert!(st.iter().all(|s| s["slo_met"].is_boolean()), "{st:?}");
    assert!(st.iter().any(|s| s["concurrency"] == 7));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("cap3: highest met 3") && stdout.contains("lowest missed 4"), "{stdout}");
    // Each step past the cap carries the limit its series shows.
    let at16 = st.iter().find(|s| s["config"] == "cap3" && s["concurrency"] == 16).expect("cap3 at 16");
    assert!(at16["limit"].as_str().expect("limit").contains("the server runs at most 3 at once"), "{at16}");
    let series: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join(st[2]["series_file"].as_str().expect("series"))).expect("series file"),
    )
    .expect("series JSON");
    assert!(series.iter().any(|x| x["queued"].as_f64().unwrap_or(0.0) >= 1.0), "queued at 16 on cap 3: {series:?}");
    assert!(series.iter().all(|x| x["running"].as_f64().unwrap_or(9.0) <= 3.0));
    let html = std::fs::read_to_string(dir.path().join("report.html")).expect("report");
    assert!(html.contains("<table id=\"slo\">") && html.contains("<table id=\"series\">"), "the SLO and series tables");
}
