//! The files a run writes: SGLang's default result file name, the details file beside it and
//! its one line per finished request, and the result line appended at the end (with
//! `--output-details`' per-request lists). Names and line formats are what scripts written
//! for SGLang read, so they live together and change together.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::BenchError;
use crate::args::{BenchConfig, DatasetName};
use crate::metrics::BenchmarkMetrics;
use crate::record::RequestRecord;
use crate::report::{self, RunSummary};

/// SGLang's default output file name: `{backend}_{MMDD}_{n}_{in}_{out}.jsonl` for the random
/// datasets, else `{backend}_{MMDD}_{n}_{dataset}.jsonl` (date in UTC); one client of
/// several writes `<that stem>.client{i}of{K}.jsonl`.
pub fn default_output_file(cfg: &BenchConfig) -> PathBuf {
    let days =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() / 86_400) as i64;
    let (_, m, d) = civil_from_days(days);
    let a = &cfg.args;
    let b = a.backend.name();
    let stem = match a.dataset_name {
        DatasetName::Random | DatasetName::RandomIds => {
            format!("{b}_{m:02}{d:02}_{}_{}_{}", a.num_prompts, a.random_input_len, a.random_output_len)
        }
        other => format!("{b}_{m:02}{d:02}_{}_{}", a.num_prompts, other.name()),
    };
    // Clients of one run started in one directory must not append to one file.
    PathBuf::from(if a.client_count > 1 {
        format!("{stem}.client{}of{}.jsonl", a.client_index, a.client_count)
    } else {
        format!("{stem}.jsonl")
    })
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (H. Hinnant, "chrono-Compatible
/// Low-Level Date Algorithms", `civil_from_days`).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Unix time in seconds (`--start-at`, `--print-requests` lines).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The details file beside `output`: `x.jsonl` → `x.requests.jsonl`.
pub fn default_details_file(output: &Path) -> PathBuf {
    let stem = output.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    output.with_file_name(format!("{stem}.requests.jsonl"))
}

/// One details-file line: the record plus its derived latencies, serialized straight from the
/// record (no `Value` tree: this runs once per finished request while the run goes on).
pub(crate) fn details_line(r: &RequestRecord) -> String {
    #[derive(serde::Serialize)]
    struct Line<'a> {
        #[serde(flatten)]
        record: &'a RequestRecord,
        success: bool,
        ttft: Option<f64>,
        e2e: f64,
        itl: Vec<f64>,
    }
    let line = Line { record: r, success: r.success(), ttft: r.ttft(), e2e: r.e2e(), itl: r.itl().0 };
    serde_json::to_string(&line).unwrap_or_default()
}

/// Appends the run's result line (SGLang's JSONL keys; with `output_details`, the per-request
/// lists too) to `output_file`.
///
/// # Errors
/// [`BenchError::Io`] when the file cannot be opened or written.
pub(crate) fn append_result_line(
    summary: &RunSummary,
    metrics: &BenchmarkMetrics,
    records: &[RequestRecord],
    output_details: bool,
    strict_json: bool,
    output_file: &Path,
) -> Result<(), BenchError> {
    let mut pairs = report::result_pairs(summary, metrics);
    if output_details {
        use serde_json::json;
        let d = |f: &dyn Fn(&RequestRecord) -> Value| -> report::JVal {
            Value::Array(records.iter().map(f).collect()).into()
        };
        pairs.push(("input_lens".into(), d(&|r| json!(r.prompt_len))));
        pairs.push(("output_lens".into(), d(&|r| json!(r.output_tokens))));
        pairs.push(("ttfts".into(), d(&|r| json!(r.ttft().unwrap_or(0.0)))));
        pairs.push(("itls".into(), d(&|r| json!(r.itl().0))));
        pairs.push(("generated_texts".into(), d(&|r| json!(r.text))));
        pairs.push((
            "errors".into(),
            d(&|r| json!(r.failure.as_ref().map_or(String::new(), |f| format!("{}: {}", f.kind.label(), f.message)))),
        ));
    }
    let line = report::to_json_line(&pairs, strict_json);
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(output_file)
        .and_then(|mut f| writeln!(f, "{line}"))
        .map_err(|source| BenchError::Io { path: output_file.to_path_buf(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_786), (2026, 11, 29));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn details_file_beside_output() {
        assert_eq!(default_details_file(Path::new("out/x.jsonl")), PathBuf::from("out/x.requests.jsonl"));
    }
}
