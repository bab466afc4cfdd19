//! `sparrow serve` against SGLang 0.5.23's `launch_server` command line: every flag of SGLang's
//! parser (fixture made by `scripts/goldens/sglang_server_args.py`) is either taken by `sparrow serve`
//! with a value SGLang takes, or refused by name; the refusals are exactly
//! [`REFUSED_GROUPS`](super::refused::REFUSED_GROUPS). Parse only: no server starts.

use std::collections::BTreeSet;

use serde_json::Value;

use super::flags::{AttentionBackendArg, MoeRunnerBackend, Policy, ServeArgs};
use super::refused::REFUSED_GROUPS;
use super::values::ChunkedPrefill;
use crate::{parse_cli, CliError, Command};

fn fixture() -> Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sglang_server_args.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).expect("fixture is JSON")
}

/// `sparrow serve ARGS` through the binary's own parser.
fn parse(args: &[String]) -> Result<ServeArgs, String> {
    let mut argv = vec!["sparrow".to_owned(), "serve".to_owned()];
    argv.extend_from_slice(args);
    match parse_cli(&argv) {
        Ok(cli) => match cli.command {
            Command::Serve(a) => Ok(*a),
            other => panic!("parsed as another command: {other:?}"),
        },
        Err(CliError::Refused(e)) => Err(e),
        Err(CliError::Clap(e)) => Err(e.to_string()),
    }
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

/// Values SGLang's parser takes for the flag, to try in turn: each of its choices, else its
/// default, else one of its type (a suffixed count for `human_readable_int`, as SGLang's docs
/// write them).
fn samples(flag: &Value) -> Vec<Vec<String>> {
    if let Some((_, v)) = CHECKED_LATER.iter().find(|(f, _)| flag["flag"] == *f) {
        return vec![vec![(*v).to_owned()]];
    }
    if flag["takes"] == "none" {
        return vec![Vec::new()];
    }
    if let Some(c) = flag["choices"].as_array().filter(|c| !c.is_empty()) {
        return c.iter().map(|c| vec![c.as_str().map_or_else(|| c.to_string(), str::to_owned)]).collect();
    }
    match &flag["default"] {
        Value::String(s) if !s.is_empty() => return vec![vec![s.clone()]],
        Value::Number(n) => return vec![vec![n.to_string()]],
        _ => {}
    }
    let v = match flag["type"].as_str() {
        Some("int") => "2",
        Some("human_readable_int") => "4k",
        Some("float") => "0.5",
        Some("json.loads") | Some("json_list_type") => "{}",
        _ => "x",
    };
    vec![vec![v.to_owned()]]
}

/// The SGLang flags sparrow serve takes (spellings included).
const TAKEN: &[&str] = &[
    "--max-queued-requests",
    "--enable-priority-scheduling",
    "--schedule-low-priority-values-first",
    "--priority-scheduling-preemption-threshold",
    "--disable-priority-preemption",
    "--default-priority-value",
    "--enable-hierarchical-cache",
    "--hicache-storage-backend",
    "--hicache-size",
    "--hicache-ratio",
    "--hicache-write-policy",
    "--hicache-storage-backend-extra-config",
    "--model-path",
    "--model",
    "--is-embedding",
    "--tokenizer-path",
    "--host",
    "--port",
    "--served-model-name",
    "--api-key",
    "--tool-call-parser",
    "--reasoning-parser",
    "--grammar-backend",
    "--max-running-requests",
    "--max-total-tokens",
    "--context-length",
    "--page-size",
    "--chunked-prefill-size",
    "--max-prefill-tokens",
    "--disable-radix-cache",
    "--schedule-policy",
    "--disable-cuda-graph",
    "--attention-backend",
    "--kv-cache-dtype",
    "--moe-runner-backend",
    "--speculative-algorithm",
    "--speculative-draft-model-path",
    "--speculative-draft-model",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    "--speculative-ngram-max-trie-depth",
    "--log-requests",
    "--log-requests-level",
    "--preferred-sampling-params",
];

/// Flags whose parser takes any string and whose values SGLang checks later (`ServerArgs`
/// post-init): the sample is one of the values it accepts there.
const CHECKED_LATER: &[(&str, &str)] =
    &[("--speculative-algorithm", "NGRAM"), ("--hicache-storage-backend-extra-config", r#"{"storage_dir": "/tmp/h"}"#)];

#[test]
fn every_sglang_flag_is_taken_or_refused_by_name() {
    let doc = fixture();
    assert_eq!(doc["allow_abbrev"], true, "launch_server's argparse takes abbreviations; the check assumes so");
    let flags = doc["flags"].as_array().expect("flags");
    assert_eq!(flags.len(), 531, "SGLang 0.5.23 has 531 launch_server flags");
    let (mut taken, mut refused) = (BTreeSet::new(), BTreeSet::new());
    for f in flags {
        let mut spellings = vec![f["flag"].as_str().expect("flag")];
        spellings.extend(f["aliases"].as_array().expect("aliases").iter().map(|a| a.as_str().expect("alias")));
        for name in spellings {
            // Taken when one of SGLang's values parses; else the refusal must name the flag.
            let tries: Vec<(Vec<String>, Result<ServeArgs, String>)> = samples(f)
                .into_iter()
                .map(|v| {
                    let argv: Vec<String> = std::iter::once(name.to_owned()).chain(v).collect();
                    let r = parse(&argv);
                    (argv, r)
                })
                .collect();
            if tries.iter().any(|(_, r)| r.is_ok()) {
                assert!(taken.insert(name), "{name} twice");
                continue;
            }
            let (argv, e) = &tries[0];
            let e = e.as_ref().expect_err("none parsed");
            assert!(
                e.starts_with(&format!("{name} is an SGLang launch_server flag that sparrow serve does not support (")),
                "{name} ({argv:?}) is neither taken nor refused by name: {e}"
            );
            assert!(refused.insert(name), "{name} twice");
        }
    }
    assert_eq!(taken, TAKEN.iter().copied().collect::<BTreeSet<_>>());
    // The refusals are exactly the table, and the table holds each flag once.
    let table: Vec<&str> = REFUSED_GROUPS.iter().flat_map(|g| g.flags.iter().copied()).collect();
    assert_eq!(table.len(), table.iter().collect::<BTreeSet<_>>().len(), "a flag is in two groups");
    assert_eq!(refused, table.into_iter().collect::<BTreeSet<_>>());
    assert_eq!(taken.len() + refused.len(), 559, "559 spellings");
}

#[test]
fn every_sglang_value_of_a_taken_flag_is_taken_or_refused_by_name() {
    let doc = fixture();
    for f in doc["flags"].as_array().expect("flags") {
        let name = f["flag"].as_str().expect("flag");
        let Some(choices) = f["choices"].as_array().filter(|_| TAKEN.contains(&name)) else { continue };
        for c in choices {
            // A choice is a string, or a number (`--log-requests-level`'s 0–3).
            let c = c.as_str().map_or_else(|| c.to_string(), str::to_owned);
            match parse(&words(&format!("{name} {c}"))) {
                Ok(_) => {}
                Err(e) => assert!(
                    e.starts_with(&format!("{name} {c} is an SGLang "))
                        && e.contains("that sparrow serve does not support"),
                    "{name} {c}: {e}"
                ),
            }
        }
    }
    // The shared values land where SGLang puts them.
    let a = parse(&words("--schedule-policy lpm --attention-backend dsa --moe-runner-backend auto")).expect("ok");
    assert_eq!(a.schedule_policy, Policy::Lpm);
    assert_eq!(a.attention_backend, AttentionBackendArg::Dsa);
    assert_eq!(a.attention_backend.engine(), Some(sparrow_engine::config::AttentionBackend::Dsa));
    assert_eq!(a.moe_runner_backend, MoeRunnerBackend::Auto);
    let e = parse(&words("--attention-backend fa3")).expect_err("GPU backend");
    assert!(e.starts_with("--attention-backend fa3 is an SGLang attention backend"), "{e}");
    let e = parse(&words("--schedule-policy random")).expect_err("policy");
    assert!(e.contains("(have: fcfs, lpm)"), "{e}");
}

#[test]
fn chunked_prefill_minus_one_is_off() {
    let a = parse(&words("--chunked-prefill-size -1")).expect("SGLang's way to turn it off");
    assert_eq!(a.chunked_prefill_size, ChunkedPrefill::Off);
    assert_eq!(a.chunked_prefill_size.engine_chunk(a.max_prefill_tokens), 16384, "the whole per-step budget");
    assert_eq!(a.chunked_prefill_size.sglang_value(), -1);
    let a = parse(&words("--chunked-prefill-size=-1")).expect("= form");
    assert_eq!(a.chunked_prefill_size, ChunkedPrefill::Off);
    assert_eq!(parse(&[]).expect("defaults").chunked_prefill_size, ChunkedPrefill::Tokens(512));
    let a = parse(&words("--chunked-prefill-size 256 --max-prefill-tokens 8k --context-length 2Ki")).expect("ok");
    assert_eq!(a.chunked_prefill_size, ChunkedPrefill::Tokens(256));
    assert_eq!((a.max_prefill_tokens, a.context_length), (8000, Some(2048)), "human_readable_int suffixes");
}

#[test]
fn abbreviations_resolve_as_argparse_does() {
    let a = parse(&words("--max-running 4 --disable-radix")).expect("unique prefixes of taken flags");
    assert_eq!(a.max_running_requests, Some(4));
    assert!(a.disable_radix_cache);
    let e = parse(&words("--tensor-parallel 2")).expect_err("refused through its prefix");
    assert!(e.starts_with("--tensor-parallel-size is an SGLang launch_server flag"), "{e}");
    let e = parse(&words("--tokenizer x")).expect_err("ambiguous");
    assert!(e.starts_with("ambiguous option: --tokenizer could match --tokenizer-path, "), "{e}");
    // The last of a repeated flag wins, as in argparse.
    assert_eq!(parse(&words("--port 1 --port 2")).expect("repeat").port, 2);
}
