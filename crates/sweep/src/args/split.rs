//! Which flags are the sweep's: the rest of a `sparrow sweep` command line goes to
//! `sparrow bench`'s parser unchanged, except the bench flags the sweep sets per step
//! (`REFUSED`).

/// Flags that take no value.
const SWEEP_SWITCHES: &[&str] = &["resume"];
/// Flags (with a value) that belong to the sweep; the rest go to `sparrow bench`.
pub(super) const SWEEP_FLAGS: &[&str] = &[
    "concurrency",
    "max-concurrency",
    "request-rate",
    "num-prompts-per-step",
    "num-prompts",
    "server-cmd",
    "base-url",
    "label",
    "restart",
    "on-crash",
    "ready-path",
    "startup-timeout",
    "hang-timeout",
    "stop-grace",
    "knee-gain",
    "slo-ttft-ms",
    "slo-tpot-ms",
    "slo-e2e-ms",
    "slo-attainment",
    "slo",
    "slo-rate-tolerance",
    "repeat",
    "num-runs",
    "serve-params",
    "bench-params",
    "link-vars",
    "baseline",
    "output-dir",
    "output-file",
    "cgroup-dir",
    "scrape-interval",
];
/// Bench flags the sweep sets per step and so refuses.
pub(super) const REFUSED: &[(&str, &str)] = &[
    ("details-file", "each step writes its own details file under --output-dir"),
    ("client-index", "a sweep is one client; run `sparrow bench` per client and `sparrow bench merge`"),
    ("client-count", "a sweep is one client; run `sparrow bench` per client and `sparrow bench merge`"),
    ("start-at", "each step starts when the previous one ends"),
];

/// Splits raw arguments (without the program name) into the sweep's and the bench's.
///
/// `--help`/`-h` stays with the sweep's. `--flag=value` and `--flag value` are both read.
pub fn split_args(raw: &[String]) -> (Vec<String>, Vec<String>) {
    let (mut sweep, mut bench) = (vec!["sparrow sweep".to_owned()], vec!["sparrow bench".to_owned()]);
    let mut it = raw.iter().peekable();
    while let Some(a) = it.next() {
        let name = a.strip_prefix("--").map(|n| n.split_once('=').map_or(n, |(k, _)| k));
        let is = |set: &[&str]| name.is_some_and(|n| set.contains(&n));
        if a == "-h" || a == "--help" || is(SWEEP_SWITCHES) {
            sweep.push(a.clone());
        } else if is(SWEEP_FLAGS) {
            sweep.push(a.clone());
            if !a.contains('=') {
                if let Some(v) = it.next() {
                    sweep.push(v.clone());
                }
            }
        } else {
            bench.push(a.clone());
        }
    }
    (sweep, bench)
}
