//! `sparrow bench merge`: one report from the records files of a multi-client run.
//!
//! K clients started with the same flags, `--client-index 0..K`, `--client-count K` and one
//! `--start-at` send disjoint shares of one dataset on one arrival schedule, and their record
//! times all count from `--start-at`. Their records, put back together in dataset order, are
//! the records one client would have written; the merged figures are computed from them by
//! the same [`metrics::calculate`] a single run uses (every percentile over every request,
//! never an average of per-client averages). The run's duration is the longest client's.
//!
//! Each records file is read leniently at its end: a last line cut short by a killed client
//! (no newline, not valid JSON) is reported and skipped; any other bad line is an error.
//! Run-level facts (backend, dataset, rate, `--max-concurrency`, SLOs, the tokenizer the
//! outputs are re-tokenized with) come from each client's result line, the last line of
//! `<stem>.jsonl` beside `<stem>.requests.jsonl`, when it is there and describes that file's
//! records (its `completed + failed` equals their number). A client killed before its end
//! wrote none, or left an older run's line there: its records still count, and the merge says
//! what it could not take from it.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::args::{parse_slo, SloMetric};
use crate::metrics::{self, BenchmarkMetrics};
use crate::record::RequestRecord;
use crate::report::{self, ClientInfo, RunSummary, ServerDown};
use sparrow_tokenizer::Tokenizer;

/// Flags of `sparrow bench merge`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "sparrow bench merge",
    about = "Merge the per-request records files of a multi-client `sparrow bench` run into one report"
)]
pub struct MergeArgs {
    /// The clients' records files (`*.requests.jsonl`), one per client.
    #[arg(required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,
    /// JSONL file the merged result line is appended to (default: beside the first file,
    /// `<stem>.merged.jsonl` with its `.client{i}of{K}` dropped).
    #[arg(long)]
    pub output_file: Option<PathBuf>,
    /// Add per-request lists to the result line, as `sparrow bench --output-details`.
    #[arg(long)]
    pub output_details: bool,
    /// Write `null` instead of Python's `Infinity`/`NaN`.
    #[arg(long)]
    pub strict_json: bool,
    /// Tokenizer for the re-tokenized output count (a tokenizer.json, a directory holding one,
    /// or a GGUF file); default: the one the clients' result lines name.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Exit 1 when more than this fraction of the merged requests failed.
    #[arg(long, default_value_t = 0.0)]
    pub max_failure_rate: f64,
}

/// Why a merge could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A line other than a torn last one is not a record.
    #[error("{path}:{line}: not a request record: {message}")]
    BadLine {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The parser's message.
        message: String,
    },
    /// The files do not belong to one run.
    #[error("{0}")]
    Mismatch(String),
}

/// The records of one file, and whether its last line was torn.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordsFile {
    /// Complete records, in file order.
    pub records: Vec<RequestRecord>,
    /// 1-based number of a torn last line that was skipped.
    pub torn_line: Option<usize>,
}

/// Reads a records file (`sparrow bench --details-file`), skipping a torn last line: one
/// without its newline that does not parse (the writer was killed mid-line).
///
/// # Errors
/// [`MergeError::Io`] when the file cannot be read; [`MergeError::BadLine`] for any other
/// line that is not a record.
pub fn read_records(path: &Path) -> Result<RecordsFile, MergeError> {
    let text = std::fs::read(path).map_err(|source| MergeError::Io { path: path.into(), source })?;
    let complete = text.ends_with(b"\n");
    let lines: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
    // `split` yields an empty tail after a final newline.
    let n = if complete { lines.len() - 1 } else { lines.len() };
    let mut out = RecordsFile { records: Vec::with_capacity(n), torn_line: None };
    for (i, line) in lines[..n].iter().enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<RequestRecord>(line) {
            Ok(r) => out.records.push(r),
            Err(_) if i + 1 == n && !complete => out.torn_line = Some(i + 1),
            Err(e) => {
                return Err(MergeError::BadLine { path: path.into(), line: i + 1, message: e.to_string() });
            }
        }
    }
    Ok(out)
}

/// The result file a records file sits beside: `x.requests.jsonl` → `x.jsonl`.
pub fn result_file_of(records_file: &Path) -> Option<PathBuf> {
    let name = records_file.file_name()?.to_str()?;
    let stem = name.strip_suffix(".requests.jsonl")?;
    Some(records_file.with_file_name(format!("{stem}.jsonl")))
}

/// The last result line of `path` as JSON, with Python's `Infinity`/`NaN` values read as
/// `null`; `None` when there is no readable line.
pub fn read_result_line(path: &Path) -> Option<serde_json::Map<String, Value>> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
    let parsed = serde_json::from_str::<Value>(line).ok().or_else(|| {
        // `json.dumps` style: values follow `": "` or `, ` (in lists).
        let fixed = line
            .replace(": -Infinity", ": null")
            .replace(": Infinity", ": null")
            .replace(": NaN", ": null")
            .replace(", NaN", ", null");
        serde_json::from_str::<Value>(&fixed).ok()
    })?;
    match parsed {
        Value::Object(m) => Some(m),
        _ => None,
    }
}

/// A merged run.
#[derive(Debug)]
pub struct MergeOutcome {
    /// Every record of every file, in dataset order.
    pub records: Vec<RequestRecord>,
    /// The merged figures.
    pub metrics: BenchmarkMetrics,
    /// The merged run-level facts.
    pub summary: RunSummary,
    /// Things the user should know (torn lines, clients missing).
    pub warnings: Vec<String>,
}

/// Merges records files into one run, as described in the module docs; `tokenizer`
/// overrides the one the result lines name.
///
/// # Errors
/// [`MergeError`] when a file cannot be read, holds a bad line, or the files are not one
/// run (a request index twice, clients of different counts or start times), or the given
/// tokenizer cannot be loaded.
pub fn merge(files: &[PathBuf], tokenizer: Option<&Path>) -> Result<MergeOutcome, MergeError> {
    if files.is_empty() {
        return Err(MergeError::Mismatch("no records files to merge".into()));
    }
    let mut warnings = Vec::new();
    let mut by_index: BTreeMap<usize, (RequestRecord, usize)> = BTreeMap::new();
    let mut lines: Vec<serde_json::Map<String, Value>> = Vec::new();
    for (f, path) in files.iter().enumerate() {
        let rf = read_records(path)?;
        if let Some(l) = rf.torn_line {
            warnings.push(format!("{}: line {l} is torn (a client killed mid-write); skipped", path.display()));
        }
        let n_records = rf.records.len() as u64;
        for r in rf.records {
            if let Some((_, g)) = by_index.get(&r.index) {
                return Err(MergeError::Mismatch(format!(
                    "request {} is in both {} and {}: each client's file must be given once",
                    r.index,
                    files[*g].display(),
                    path.display()
                )));
            }
            by_index.insert(r.index, (r, f));
        }
        let Some(result_file) = result_file_of(path) else {
            warnings
                .push(format!("{}: not named <stem>.requests.jsonl, so no result line was looked for", path.display()));
            continue;
        };
        match read_result_line(&result_file) {
            None => warnings
                .push(format!("{}: no result line (the client was killed before its end?)", result_file.display())),
            Some(l) => {
                let described: u64 =
                    ["completed", "failed"].iter().filter_map(|k| l.get(*k).and_then(Value::as_u64)).sum();
                if described == n_records {
                    lines.push(l);
                } else {
                    warnings.push(format!(
                        "{}: its last result line counts {described} requests, the records file {n_records}: \
                         ignored (an earlier run's line, the client killed before writing its own?)",
                        result_file.display()
                    ));
                }
            }
        }
    }
    let records: Vec<RequestRecord> = by_index.into_values().map(|(r, _)| r).collect();

    let get_f = |l: &serde_json::Map<String, Value>, k: &str| l.get(k).and_then(Value::as_f64);
    let get_u = |l: &serde_json::Map<String, Value>, k: &str| l.get(k).and_then(Value::as_u64);
    let first = lines.first().cloned().unwrap_or_default();
    let counts: Vec<u64> = lines.iter().filter_map(|l| get_u(l, "client_count")).collect();
    if counts.windows(2).any(|w| w[0] != w[1]) {
        return Err(MergeError::Mismatch(format!("the clients disagree on --client-count: {counts:?}")));
    }
    let starts: Vec<f64> = lines.iter().filter_map(|l| get_f(l, "start_at")).collect();
    if starts.windows(2).any(|w| w[0] != w[1]) {
        return Err(MergeError::Mismatch(format!(
            "the clients disagree on --start-at ({starts:?}): their times do not share a clock"
        )));
    }
    let mut indices: Vec<u64> = lines.iter().filter_map(|l| get_u(l, "client_index")).collect();
    indices.sort_unstable();
    if let Some(w) = indices.windows(2).find(|w| w[0] == w[1]) {
        return Err(MergeError::Mismatch(format!("two result lines are client {}'s", w[0])));
    }
    if let Some(&count) = counts.first() {
        if (files.len() as u64) < count {
            warnings
                .push(format!("merging {} files of a {count}-client run: the report covers only them", files.len()));
        }
    }
    let tok_path: Option<PathBuf> = tokenizer.map(Path::to_path_buf).or_else(|| {
        lines.iter().filter_map(|l| l.get("tokenizer").and_then(Value::as_str).map(PathBuf::from)).find(|p| p.exists())
    });
    let tok = match &tok_path {
        Some(p) => {
            Some(Tokenizer::load(p).map_err(|e| MergeError::Mismatch(format!("--tokenizer {}: {e}", p.display())))?)
        }
        None => {
            warnings.push("no tokenizer (pass --tokenizer): the retokenized output count is 0".to_owned());
            None
        }
    };

    let last_end = records.iter().map(|r| r.end_s).fold(0.0, f64::max);
    let duration_s = lines.iter().filter_map(|l| get_f(l, "duration")).fold(last_end, f64::max);
    let metrics =
        metrics::calculate(&records, duration_s, |t| tok.as_ref().map_or(0, |tok| crate::run::retokenized_len(tok, t)));
    let slos: Vec<(SloMetric, f64)> = first
        .get("goodput_slos_ms")
        .and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| parse_slo(&format!("{k}:{}", v.as_f64()?)).ok()).collect::<Vec<_>>())
        .unwrap_or_default();
    let downs: Vec<&serde_json::Map<String, Value>> =
        lines.iter().filter(|l| get_f(l, "server_down_at_s").is_some()).collect();
    let server_down = (!downs.is_empty()).then(|| ServerDown {
        at_s: downs.iter().filter_map(|l| get_f(l, "server_down_at_s")).fold(f64::INFINITY, f64::min),
        in_flight: downs.iter().filter_map(|l| get_u(l, "in_flight_at_server_down")).sum::<u64>() as usize,
        not_sent: records
            .iter()
            .filter(|r| r.failure.as_ref().is_some_and(|f| f.kind == crate::record::FailureKind::NotSent))
            .count(),
        reason: downs.iter().find_map(|l| l.get("server_down_reason").and_then(Value::as_str)).unwrap_or("").to_owned(),
    });
    let rate = first.get("request_rate");
    let summary = RunSummary {
        backend: first.get("backend").and_then(Value::as_str).unwrap_or("unknown").into(),
        dataset_name: first.get("dataset_name").and_then(Value::as_str).unwrap_or("unknown").into(),
        request_rate: rate.and_then(Value::as_f64).unwrap_or(f64::INFINITY),
        request_rate_trace: rate.and_then(Value::as_str) == Some("trace"),
        goodput: (!slos.is_empty()).then(|| metrics::goodput(&records, &slos, duration_s)),
        // The run-wide flag: every client's line carries it as given.
        max_concurrency: get_u(&first, "max_concurrency").map(|c| c as usize),
        sharegpt_output_len: get_u(&first, "sharegpt_output_len"),
        random_input_len: get_u(&first, "random_input_len").unwrap_or(0),
        random_output_len: get_u(&first, "random_output_len").unwrap_or(0),
        random_range_ratio: get_f(&first, "random_range_ratio").unwrap_or(0.0),
        tag: first.get("tag").and_then(Value::as_str).map(str::to_owned),
        duration_s,
        server_info: first.get("server_info").filter(|v| !v.is_null()).cloned(),
        server_down,
        interrupted: lines.iter().find_map(|l| l.get("interrupted").and_then(Value::as_str)).map(str::to_owned),
        client: Some(ClientInfo {
            index: None,
            count: files.len(),
            start_at: starts.first().copied(),
            max_concurrency: None,
            tokenizer: tok_path,
        }),
    };
    Ok(MergeOutcome { records, metrics, summary, warnings })
}

/// Default merged result file: beside the first input, its stem without `.requests` and
/// `.client{i}of{K}`, plus `.merged.jsonl`.
pub fn default_merged_file(first: &Path) -> PathBuf {
    let name = first.file_name().and_then(|n| n.to_str()).unwrap_or("bench");
    let stem = name.strip_suffix(".requests.jsonl").or_else(|| name.strip_suffix(".jsonl")).unwrap_or(name);
    let stem = match stem.rfind(".client") {
        Some(p)
            if stem[p + 7..]
                .split_once("of")
                .is_some_and(|(a, b)| a.parse::<usize>().is_ok() && b.parse::<usize>().is_ok()) =>
        {
            &stem[..p]
        }
        _ => stem,
    };
    first.with_file_name(format!("{stem}.merged.jsonl"))
}

/// The `sparrow bench merge` command: merges, prints the report block, appends the result
/// line to the output file and writes the merged records beside it. Returns the exit
/// status (0, or 1 above `--max-failure-rate`).
///
/// # Errors
/// [`MergeError`] from [`merge`], or when an output cannot be written.
pub fn run_merge(args: &MergeArgs) -> Result<i32, MergeError> {
    if !(0.0..=1.0).contains(&args.max_failure_rate) {
        return Err(MergeError::Mismatch(format!(
            "--max-failure-rate must be in [0, 1], got {}",
            args.max_failure_rate
        )));
    }
    let Some(first) = args.files.first() else {
        return Err(MergeError::Mismatch("no records files to merge".into()));
    };
    let output = args.output_file.clone().unwrap_or_else(|| default_merged_file(first));
    let details = crate::run::default_details_file(&output);
    // The merged files must not land on an input (its records would be overwritten).
    for f in &args.files {
        if *f == details || result_file_of(f).as_ref() == Some(&output) {
            return Err(MergeError::Mismatch(format!(
                "--output-file {} would overwrite the input {}",
                output.display(),
                f.display()
            )));
        }
    }
    let out = merge(&args.files, args.tokenizer.as_deref())?;
    for w in &out.warnings {
        crate::errln!("warning: {w}");
    }
    crate::out!("{}", report::render_block(&out.summary, &out.metrics));
    crate::run::append_result_line(
        &out.summary,
        &out.metrics,
        &out.records,
        args.output_details,
        args.strict_json,
        &output,
    )
    .map_err(|e| match e {
        crate::run::BenchError::Io { path, source } => MergeError::Io { path, source },
        other => MergeError::Mismatch(other.to_string()),
    })?;
    let write = || -> std::io::Result<()> {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&details)?);
        for r in &out.records {
            writeln!(w, "{}", crate::run::details_line(r))?;
        }
        w.flush()
    };
    write().map_err(|source| MergeError::Io { path: details.clone(), source })?;
    crate::outln!("Merged {} records into {} (records: {})", out.records.len(), output.display(), details.display());
    let failed = out.metrics.failed as f64 / out.records.len().max(1) as f64;
    Ok(if failed > args.max_failure_rate { 1 } else { 0 })
}
