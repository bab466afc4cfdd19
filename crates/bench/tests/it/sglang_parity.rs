//! `sparrow bench` against SGLang 0.5.23's `bench_serving` command line: every flag, backend
//! and dataset name in SGLang's source (fixture made by `scripts/goldens/sglang_bench_flags.py`) is
//! either handled or refused with its name, and every command line of SGLang's benchmark
//! guide (fixture made by `scripts/goldens/sglang_docs_commands.py`) that uses a dataset and backend
//! we support parses unchanged.

use clap::Parser;
use serde_json::Value;
use sparrow_bench::args::{BenchArgs, BenchConfig, REFUSED_FLAGS};

fn fixture(name: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn parse(argv: &[String]) -> Result<BenchConfig, String> {
    let mut full = vec!["bench".to_owned()];
    full.extend_from_slice(argv);
    BenchArgs::try_parse_from(&full).map_err(|e| e.to_string())?.validate().map_err(|e| e.0)
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

/// A value SGLang would accept for the flag, and flags it needs beside it.
fn sample(flag: &Value) -> (Vec<String>, Vec<String>) {
    let name = flag["flag"].as_str().expect("flag");
    let companions = match name {
        "--gsp-zipf-alpha" => "--gsp-group-distribution zipf",
        "--use-trace-timestamps" | "--mooncake-workload" => "--dataset-name mooncake",
        "--rust-worker-threads" => "--rust-client",
        _ => "",
    };
    let value = match (name, flag["takes"].as_str()) {
        (_, Some("none")) => "",
        ("--goodput", _) => "ttft:500 tpot:50",
        ("--header", _) => "A=1 B=2",
        ("--extra-request-body", _) => "{}",
        ("--backend", _) => "sglang",
        ("--dataset-name", _) => "sharegpt",
        ("--gsp-zipf-alpha", _) => "1.2",
        _ => match (&flag["choices"], flag["type"].as_str()) {
            (Value::Array(c), _) => c[0].as_str().expect("choice"),
            (_, Some("int")) => "2",
            (_, Some("float")) | (_, Some("_finite_positive_float")) => "0.5",
            _ => "x",
        },
    };
    let mut argv = vec![name.to_owned()];
    argv.extend(words(value));
    (argv, words(companions))
}

/// The flags the issue asks sparrow bench to support; each must parse and validate.
const MUST_SUPPORT: &[&str] = &[
    "--goodput",
    "--temperature",
    "--top-p",
    "--dataset-offset",
    "--ready-check-timeout-sec",
    "--flush-cache-timeout",
    "--print-requests",
    "--gsp-num-turns",
    "--gsp-ordered",
    "--gsp-group-distribution",
    "--gsp-zipf-alpha",
    "--gsp-fast-prepare",
    "--gsp-send-routing-key",
    "--use-trace-timestamps",
    "--mooncake-workload",
    "--mooncake-slowdown-factor",
    "--mooncake-num-rounds",
];

#[test]
fn every_sglang_flag_is_handled_or_refused_by_name() {
    let doc: Value = serde_json::from_str(&fixture("sglang_bench_flags.json")).expect("fixture");
    let flags = doc["flags"].as_array().expect("flags");
    assert_eq!(flags.len(), 87, "SGLang 0.5.23 has 87 bench_serving flags");
    let (mut handled, mut refused) = (Vec::new(), Vec::new());
    for f in flags {
        let name = f["flag"].as_str().expect("flag");
        let (mut argv, companions) = sample(f);
        argv.extend(companions);
        match parse(&argv) {
            Ok(_) => handled.push(name),
            Err(e) => {
                assert!(
                    e.contains(&format!("{name} is an SGLang bench_serving flag that sparrow bench does not support")),
                    "{name} ({argv:?}) is neither handled nor refused by name: {e}"
                );
                refused.push(name);
            }
        }
    }
    for m in MUST_SUPPORT {
        assert!(handled.contains(m), "{m} must be supported");
    }
    // The refusals are exactly the documented table, and that table holds only SGLang flags.
    let mut table: Vec<&str> = REFUSED_FLAGS.iter().map(|(f, _)| *f).collect();
    table.sort_unstable();
    refused.sort_unstable();
    assert_eq!(refused, table);
    assert_eq!(handled.len() + refused.len(), 87);
}

#[test]
fn every_sglang_backend_and_dataset_is_handled_or_refused_by_name() {
    let doc: Value = serde_json::from_str(&fixture("sglang_bench_flags.json")).expect("fixture");
    for b in doc["backends"].as_array().expect("backends") {
        let b = b.as_str().expect("name");
        match parse(&words(&format!("--backend {b} --model m"))) {
            Ok(c) => assert_eq!(c.args.backend.name(), b),
            Err(e) => assert!(e.contains(&format!("--backend {b} is an SGLang")), "{b}: {e}"),
        }
    }
    for d in doc["datasets"].as_array().expect("datasets") {
        let d = d.as_str().expect("name");
        let argv = match d {
            "custom" => format!("--dataset-name {d} --dataset-path x.jsonl"),
            "openai" => format!("--dataset-name {d} --dataset-path x.jsonl --backend sglang-oai-chat"),
            _ => format!("--dataset-name {d}"),
        };
        match parse(&words(&argv)) {
            Ok(c) => assert_eq!(c.args.dataset_name.name(), d),
            Err(e) => assert!(e.contains(&format!("--dataset-name {d} is an SGLang")), "{d}: {e}"),
        }
    }
}

#[test]
fn sglang_docs_command_lines_parse_unchanged() {
    let text = fixture("sglang_docs_commands.txt");
    let mut ran = 0;
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let argv = words(line);
        let refused_dataset = line.contains("--dataset-name image");
        let refused_backend = false;
        match parse(&argv) {
            Ok(c) => {
                assert!(!refused_dataset && !refused_backend, "{line}: should have been refused");
                ran += 1;
                // Spot checks that the values landed where SGLang puts them.
                if line.contains("--random-input 1024") {
                    assert_eq!(c.args.random_input_len, 1024, "argparse-style abbreviation");
                    assert_eq!(c.args.random_output_len, 1024);
                }
                if line.contains("mooncake-conversation") {
                    assert_eq!(c.args.dataset_name.name(), "mooncake");
                    assert_eq!(c.args.mooncake_workload.name(), "conversation");
                    assert_eq!(c.args.mooncake_num_rounds, 1000);
                    assert_eq!(c.args.use_trace_timestamps, Some(true));
                }
                if line.contains("--tokenize-prompt") {
                    assert!(c.args.tokenize_prompt);
                }
            }
            Err(e) => {
                assert!(refused_dataset || refused_backend, "{line}: {e}");
                assert!(e.contains("is an SGLang bench_serving"), "{line}: refused, but not by name: {e}");
            }
        }
    }
    assert_eq!(ran, 11, "the guide's commands on supported datasets and backends");
}

#[test]
fn values_reach_the_config() {
    let c = parse(&words(
        "--goodput ttft:500 tpot:50 ttft:400 --temperature 0.7 --top-p 0.9 --dataset-offset 3 \
         --ready-check-timeout-sec 0 --flush-cache-timeout 5 --header A=1 B=2 --header C=3",
    ))
    .expect("parses");
    use sparrow_bench::args::SloMetric;
    assert_eq!(c.goodput, vec![(SloMetric::Ttft, 500.0), (SloMetric::Tpot, 50.0), (SloMetric::Ttft, 400.0)]);
    assert_eq!(c.args.temperature, 0.7);
    assert_eq!(c.args.top_p, 0.9);
    assert_eq!(c.args.dataset_offset, 3);
    assert!(c.ready_check.is_none(), "0 skips the ready check");
    assert_eq!(c.flush_cache_timeout.as_secs(), 5);
    assert_eq!(c.headers.len(), 3);
    assert_eq!(c.args.seed, 42, "SGLang 0.5.23's default seed");
    for bad in ["--goodput ttft", "--goodput itl:5", "--goodput ttft:-1", "--goodput ttft:inf"] {
        let e = parse(&words(bad)).expect_err(bad);
        assert!(e.contains("--goodput"), "{bad}: {e}");
    }
    let e = parse(&words("--gsp-group-distribution zipf")).expect_err("zipf needs alpha");
    assert!(e.contains("--gsp-zipf-alpha"), "{e}");
    let e = parse(&words("--dataset-name generated-shared-prefix --gsp-num-turns 2")).expect_err("needs chat");
    assert!(e.contains("chat backend"), "{e}");
    let e = parse(&words("--rust-worker-threads 2")).expect_err("needs --rust-client");
    assert!(e.contains("--rust-client"), "{e}");
    let e = parse(&words("--use-trace-timestamps")).expect_err("mooncake only");
    assert!(e.contains("mooncake"), "{e}");
    let e = parse(&words("--backend sglang-oai --tokenize-prompt")).expect_err("ids need /generate");
    assert!(e.contains("--tokenize-prompt"), "{e}");
}
