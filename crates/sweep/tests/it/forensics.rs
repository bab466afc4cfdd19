//! Crash classifiers on crash logs in the shapes real servers write them (the origin story's
//! SGLang scheduler exception, PyTorch's CUDA OOM message, a segfaulting llama-server), each
//! wrapped as the sweep writes server logs (timestamp prefix per line), with the exit status
//! the server ended with. End-to-end crashes of real processes are in `crates/sparrow/tests/it/sweep.rs`.

use std::path::Path;

use sparrow_sweep::forensics::{classify_death, VerdictKind};
use sparrow_sweep::monitor::MemEvidence;
use sparrow_sweep::server::ExitInfo;

/// The fixture as `server-<n>.log` holds it: a header line, then prefixed lines.
fn as_sweep_log(name: &str) -> String {
    let raw = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name))
        .expect("fixture");
    let mut out = String::from("# sparrow sweep: server 1, launched 2026-11-28T14:00:00.000Z with: sh -c \"x\"\n");
    for (i, l) in raw.lines().enumerate() {
        out.push_str(&format!("2026-11-28T14:02:{:02}.000Z +{}.000s err| {l}\n", i % 60, 120 + i));
    }
    out
}

fn mem_24g(peak: u64) -> MemEvidence {
    MemEvidence {
        samples: 60,
        peak_rss: peak,
        mem_total: Some(24 << 30),
        min_available: Some(18 << 30),
        oom_kills_before: Some(0),
        oom_kills_after: Some(0),
        owned: true,
        ..Default::default()
    }
}

fn line_of(log: &str, needle: &str) -> usize {
    log.lines().position(|l| l.ends_with(needle)).expect("needle in log") + 1
}

#[test]
fn origin_story_traceback_is_a_defect_not_memory() {
    let log = as_sweep_log("sglang_prefill_metadata.log");
    // SGLang's parent kills its own process tree with SIGKILL after the child's exception.
    let v = classify_death(&log, 1, ExitInfo { code: None, signal: Some(9) }, &mem_24g(4_402_341_888));
    assert_eq!(v.kind, VerdictKind::Defect, "{v:?}");
    let exc = "AttributeError: 'PrefillMetadata' object has no attribute 'page_table_1_flattened'";
    let q = v.quote.as_ref().expect("quoted line");
    assert_eq!(q.text, exc);
    assert_eq!(q.line, line_of(&log, exc));
    assert_eq!(v.error_type.as_deref(), Some("AttributeError"));
    assert_eq!(
        v.location.as_deref(),
        Some("/sgl-workspace/sglang/python/sglang/srt/layers/attention/nsa_backend.py:455 in init_forward_metadata")
    );
    assert!(v.evidence.contains("peak RSS 4.1 GiB of 24.0 GiB (MemTotal)"), "{}", v.evidence);
    assert!(v.evidence.contains("not memory"), "{}", v.evidence);
    assert!(v.evidence.contains("killed by SIGKILL"), "{}", v.evidence);
    // The innermost frame is quoted with its own line number.
    let frame = v.context.iter().find(|c| c.text.contains("nsa_backend.py")).expect("innermost frame");
    assert_eq!(frame.line, line_of(&log, &frame.text));
}

#[test]
fn torch_cuda_oom_is_out_of_memory() {
    let log = as_sweep_log("torch_cuda_oom.log");
    let mem = MemEvidence { gpu_peak_mib: Some((142_100, 143_155)), ..mem_24g(9 << 30) };
    let v = classify_death(&log, 1, ExitInfo { code: None, signal: Some(9) }, &mem);
    assert_eq!(v.kind, VerdictKind::OutOfMemory, "{v:?}");
    let q = v.quote.expect("quote");
    assert!(q.text.starts_with("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB"), "{}", q.text);
    assert_eq!(q.line, line_of(&log, &q.text));
    assert!(v.evidence.contains("GPU memory peak 142100 of 143155 MiB"), "{}", v.evidence);
}

#[test]
fn segfault_line_and_signal() {
    let log = as_sweep_log("llama_server_segv.log");
    let v = classify_death(&log, 1, ExitInfo { code: None, signal: Some(11) }, &mem_24g(1 << 30));
    assert_eq!(v.kind, VerdictKind::Defect);
    assert_eq!(v.quote.as_ref().map(|q| q.text.as_str()), Some("Segmentation fault (core dumped)"));
    assert!(v.evidence.contains("killed by SIGSEGV"), "{}", v.evidence);
    // The same death with a log that says nothing is still a defect, by the signal.
    let quiet = "# header\n2026-11-28T14:02:00.000Z +1.000s out| listening\n";
    let v = classify_death(quiet, 1, ExitInfo { code: Some(139), signal: None }, &mem_24g(1 << 30));
    assert_eq!(v.kind, VerdictKind::Defect);
    assert_eq!(v.error_type.as_deref(), Some("SIGSEGV"));
}

#[test]
fn sigkill_is_oom_only_with_evidence() {
    let quiet = "# header\n2026-11-28T14:02:00.000Z +1.000s out| decode batch\n";
    let kill = ExitInfo { code: None, signal: Some(9) };
    let v = classify_death(quiet, 1, kill, &mem_24g(2 << 30));
    assert_eq!(v.kind, VerdictKind::Exited, "{v:?}");
    assert!(v.evidence.contains("no OOM record"), "{}", v.evidence);
    let recorded = MemEvidence { oom_kills_after: Some(1), ..mem_24g(2 << 30) };
    let v = classify_death(quiet, 1, kill, &recorded);
    assert_eq!(v.kind, VerdictKind::OomKilled);
    assert!(v.evidence.contains("memory.events oom_kill 0 -> 1"), "{}", v.evidence);
    let at_limit = MemEvidence { cgroup_max: Some(8 << 30), ..mem_24g(8 << 30) };
    assert_eq!(classify_death(quiet, 1, kill, &at_limit).kind, VerdictKind::OomKilled);
    let exit1 = classify_death(quiet, 1, ExitInfo { code: Some(1), signal: None }, &mem_24g(1 << 30));
    assert_eq!(exit1.kind, VerdictKind::Exited);
    assert!(exit1.evidence.starts_with("exit status 1"), "{}", exit1.evidence);
    // A server that refuses its flags says why before it exits: quoted, still `exited`.
    let usage =
        "# h\nt +0.1s err| error: unexpected argument '--tp' found\nt +0.1s err| Usage: sparrow serve [OPTIONS]\n";
    let v = classify_death(usage, 1, ExitInfo { code: Some(2), signal: None }, &mem_24g(1 << 20));
    assert_eq!(v.kind, VerdictKind::Exited);
    assert_eq!(v.quote.map(|q| (q.line, q.text)), Some((2, "error: unexpected argument '--tp' found".into())));
    // A command the shell cannot find.
    let sh = "# h\nt +0.0s err| sh: 1: sglang-serve: not found\n";
    let v = classify_death(sh, 1, ExitInfo { code: Some(127), signal: None }, &mem_24g(0));
    assert_eq!(v.kind, VerdictKind::Exited);
    assert!(v.evidence.starts_with("exit status 127 (command not found)"), "{}", v.evidence);
    assert_eq!(v.quote.map(|q| q.text), Some("sh: 1: sglang-serve: not found".into()));
}

#[test]
fn the_crashed_steps_lines_are_searched_first() {
    // A contained panic from an earlier step, then the real death later.
    let log = "# h\n\
        t +1s err| thread 'engine' panicked at crates/engine/src/sampler.rs:40:9:\n\
        t +1s err| contained\n\
        t +9s err| memory allocation of 67108864 bytes failed\n";
    let v = classify_death(log, 4, ExitInfo { code: None, signal: Some(6) }, &mem_24g(1 << 30));
    assert_eq!(v.kind, VerdictKind::OutOfMemory);
    assert_eq!(v.quote.map(|q| q.line), Some(4));
    let v = classify_death(log, 1, ExitInfo { code: None, signal: Some(6) }, &mem_24g(1 << 30));
    assert_eq!(v.kind, VerdictKind::Defect);
    assert_eq!(v.location.as_deref(), Some("crates/engine/src/sampler.rs:40:9"));
    assert_eq!(v.context.first().map(|c| c.text.as_str()), Some("contained"));
}
