//! One step's result, as `summary.json` and `steps.jsonl` hold it.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::forensics::{LogQuote, VerdictKind};

/// What became of a step (`summary.json` `status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Ran; the server stayed up; failures within `--max-failure-rate`.
    Ok,
    /// The server died or hung during the step (or could not start for it).
    Crashed,
    /// Not run: the sweep stopped before it (`--on-crash stop`, or a signal).
    Skipped,
    /// Cut short by SIGINT/SIGTERM; `--resume` runs it again.
    Interrupted,
    /// Ran with the server up, but more requests failed than `--max-failure-rate` allows, or
    /// the bench could not set up.
    Failed,
}

impl Status {
    /// As written in `summary.json`: `ok`, `crashed`, `skipped`, `interrupted`, `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Crashed => "crashed",
            Status::Skipped => "skipped",
            Status::Interrupted => "interrupted",
            Status::Failed => "failed",
        }
    }
}

/// `f64` as a JSON number, or `"inf"` for infinity (JSON has no infinity).
pub mod rate_serde {
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `x` (`"inf"` when infinite).
    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        if x.is_infinite() {
            s.serialize_str("inf")
        } else {
            s.serialize_f64(*x)
        }
    }

    /// Reads a number or `"inf"`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum N {
            F(f64),
            S(String),
        }
        match N::deserialize(d)? {
            N::F(f) => Ok(f),
            N::S(s) if s == "inf" => Ok(f64::INFINITY),
            N::S(s) => Err(serde::de::Error::custom(format!("not a rate: {s}"))),
        }
    }
}

/// One step of a sweep.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StepResult {
    /// Position in the sweep (1-based, in run order, as on the terminal and in file names).
    pub step: usize,
    /// Resume key: label, step value, repeat and bench flags.
    pub key: String,
    /// The side's `--label` (in a grid, `configuration` or `configuration:workload`).
    pub label: String,
    /// The grid configuration (`--serve-params`), absent outside a grid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
    /// The workload (`--bench-params`), absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    /// Index of the step value on the axis.
    pub value_index: usize,
    /// Repeat number (0-based).
    pub repeat: usize,
    /// `--max-concurrency` of the step (`null`: unbounded).
    pub concurrency: Option<usize>,
    /// `--request-rate` of the step.
    #[serde(with = "rate_serde")]
    pub request_rate: f64,
    /// `--seed` of the step.
    pub seed: u64,
    /// Prompts sent.
    pub num_prompts: usize,
    /// What became of it.
    pub status: Status,
    /// The server's verdict (`null` for a skipped step).
    pub verdict: Option<VerdictKind>,
    /// The evidence: the figures, and the quoted log line when there is one.
    pub evidence: String,
    /// The first error line of the server log, with its line number.
    pub quote: Option<LogQuote>,
    /// Exception / panic / signal type.
    pub error_type: Option<String>,
    /// The source location the error names.
    pub location: Option<String>,
    /// Further quoted lines (innermost frame, panic message).
    pub context: Vec<LogQuote>,
    /// Successful requests.
    pub completed: usize,
    /// Failed requests.
    pub failed: usize,
    /// The server log (relative to the output folder), when the sweep launched the server.
    pub server_log: Option<String>,
    /// Largest RSS of the server's process tree during the step, bytes.
    pub peak_rss_bytes: Option<u64>,
    /// Requests meeting every SLO per second (with SLOs).
    pub goodput: Option<f64>,
    /// Fraction of the step's requests meeting every SLO (with SLOs).
    pub slo_attainment: Option<f64>,
    /// Whether the step met the SLOs (every term held; with SLOs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo_met: Option<bool>,
    /// The SLO terms the step missed, with what was measured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slo_missed: Vec<String>,
    /// The server's `/metrics`, CPU and RSS over the step, in a few figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_stats: Option<crate::scrape::Stats>,
    /// What the series says held the step's throughput: the batch cap, the KV pool, the CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    /// The series, one sample a second (relative path, JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub series_file: Option<String>,
    /// The printed block (relative path).
    pub block_file: Option<String>,
    /// The bench's JSONL keys for this step (its `concurrency`, Little's-law mean, is
    /// `mean_concurrency` here; `completed`, `failed` and `request_rate` are above).
    #[serde(flatten)]
    pub bench: Map<String, Value>,
}

impl StepResult {
    /// A bench figure by its JSONL key (`output_throughput`, `median_ttft_ms`, ...).
    pub fn metric(&self, key: &str) -> Option<f64> {
        self.bench.get(key).and_then(Value::as_f64)
    }
    /// The step value on `axis` ("concurrency" or "request_rate").
    pub fn value(&self, axis: &str) -> f64 {
        if axis == "concurrency" {
            self.concurrency.map_or(f64::INFINITY, |c| c as f64)
        } else {
            self.request_rate
        }
    }
    /// True when the step measured something usable for the curves.
    pub fn measured(&self) -> bool {
        self.status == Status::Ok && self.completed > 0
    }
}
