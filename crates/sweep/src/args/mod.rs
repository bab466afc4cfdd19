//! `sparrow sweep` flags: the sweep's own, split from the `sparrow bench` flags they are mixed
//! with, and validated into an immutable [`SweepConfig`].
//!
//! Every flag that is not the sweep's goes to `sparrow bench`'s parser unchanged, so it keeps
//! its meaning (and a typo is refused by name, as by `sparrow bench`). `--request-rate`,
//! `--max-concurrency`, `--base-url`, `--num-prompts` and `--output-file` are taken by the sweep,
//! which sets them per step.
//!
//! - `flags`: the raw clap struct [`SweepArgs`] and its value enums ([`Restart`], [`OnCrash`]);
//! - `split`: which flags are the sweep's and which the bench's ([`split_args`]), and the bench
//!   flags the sweep sets per step and so refuses;
//! - `config`: the validated [`SweepConfig`] ([`Axis`], [`Side`]) and what a step asks of it;
//! - `validate`: [`parse`]: the checks that turn both sets of flags into a [`SweepConfig`].

mod config;
mod flags;
mod split;
mod validate;

pub use config::{Axis, Side, SweepConfig, SEARCH_STRIDE, WORKLOAD_STRIDE};
pub use flags::{OnCrash, Restart, SweepArgs};
pub use split::split_args;
pub use validate::{parse, FlagError, ParseError};

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<SweepConfig, String> {
        let raw: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        parse(&raw).map_err(|e| e.to_string())
    }

    #[test]
    fn sweep_and_bench_flags_are_split() {
        let c = p(&[
            "--concurrency",
            "1,64,256",
            "--dataset-name",
            "random",
            "--random-input-len=256",
            "--resume",
            "--output-dir",
            "x",
        ])
        .expect("parses");
        assert_eq!(c.axis, Axis::Concurrency(vec![1, 64, 256]));
        assert_eq!(c.bench_argv, vec!["--dataset-name", "random", "--random-input-len=256"]);
        assert_eq!(c.bench.args.random_input_len, 256);
        assert!(c.args.resume);
        assert_eq!(c.num_prompts(0, 0), 64);
        assert_eq!(c.num_prompts(0, 2), 1024);
        assert!(c.request_rate(1).is_infinite());
        assert_eq!(c.sides.len(), 1);
        assert_eq!(c.sides[0].base_url, "http://0.0.0.0:30000");
    }

    #[test]
    fn rate_axis_with_one_concurrency() {
        let c = p(&["--request-rate", "1,4,inf", "--max-concurrency", "8", "--seed", "10"]).expect("parses");
        assert_eq!(c.axis, Axis::RequestRate(vec![1.0, 4.0, f64::INFINITY]));
        assert_eq!(c.concurrency(2), Some(8));
        assert_eq!(c.seed(0, 0, 0), 10);
        assert_eq!(c.seed(0, 2, 1), 15);
    }

    #[test]
    fn ab_sides_pair_in_order() {
        let c = p(&["--concurrency", "1,2", "--server-cmd", "a", "--server-cmd", "b", "--port", "31000"]).expect("ab");
        assert_eq!(c.sides.len(), 2);
        assert_eq!((c.sides[0].label.as_str(), c.sides[1].label.as_str()), ("A", "B"));
        assert_eq!(c.sides[1].server_cmd.as_deref(), Some("b"));
        assert_eq!(c.sides[0].base_url, c.sides[1].base_url);
        let c = p(&[
            "--concurrency",
            "1",
            "--base-url",
            "http://h:1/",
            "--base-url",
            "http://h:2",
            "--label",
            "x",
            "--label",
            "y",
        ])
        .expect("urls");
        assert_eq!(c.sides[0].base_url, "http://h:1");
        assert_eq!(c.sides[1].label, "y");
    }

    #[test]
    fn bad_flags_are_refused_by_name() {
        assert!(p(&["--concurrency", "1,2", "--request-rate", "1,2"]).expect_err("two lists").contains("both lists"));
        assert!(p(&[]).expect_err("no steps").contains("--concurrency"));
        assert!(p(&["--concurrency", "0"]).expect_err("zero").contains("--concurrency"));
        assert!(p(&["--concurrency", "1", "--details-file", "x"]).expect_err("details").contains("--details-file"));
        assert!(p(&["--concurrency", "1", "--client-count", "2"]).expect_err("clients").contains("--client-count"));
        assert!(p(&["--concurrency", "1", "--resume"]).expect_err("resume").contains("--output-dir"));
        assert!(p(&["--concurrency", "1", "--no-such-flag"]).expect_err("typo").contains("--no-such-flag"));
        assert!(p(&["--concurrency", "1", "--label", "a", "--label", "a"]).expect_err("same").contains("--label"));
        assert!(matches!(parse(&["--help".to_owned()]), Err(ParseError::Help(_))));
        assert!(p(&["--concurrency", "64,1"]).expect_err("order").contains("increase"));
        assert!(p(&["--request-rate", "1,inf,4"]).expect_err("order").contains("--request-rate"));
        assert!(p(&["--concurrency", "4,4"]).expect_err("dup").contains("increase"));
    }

    fn files(serve: &str, bench: &str) -> (tempfile::TempDir, String, String) {
        let d = tempfile::tempdir().expect("tempdir");
        let (sp, bp) = (d.path().join("serve.json"), d.path().join("bench.json"));
        std::fs::write(&sp, serve).expect("serve");
        std::fs::write(&bp, bench).expect("bench");
        let s = |p: std::path::PathBuf| p.to_str().expect("utf8").to_owned();
        (d, s(sp), s(bp))
    }

    #[test]
    fn grid_sides_are_configurations_times_workloads() {
        let (_d, sp, bp) = files(
            r#"{"small": {"max_running_requests": 8}, "big": {"max_running_requests": 64, "disable_radix_cache": true}}"#,
            r#"{"short": {"random_input_len": 16}, "long": {"random_input_len": 512, "dataset_name": "random"}}"#,
        );
        let c = p(&[
            "--concurrency",
            "1,8,64",
            "--server-cmd",
            "srv --port 30000",
            "--serve-params",
            &sp,
            "--bench-params",
            &bp,
        ])
        .expect("grid");
        let labels: Vec<&str> = c.sides.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["small:short", "small:long", "big:short", "big:long"]);
        assert_eq!(
            c.sides[2].server_cmd.as_deref(),
            Some("srv --port 30000 --max-running-requests 64 --disable-radix-cache")
        );
        assert_eq!((c.sides[0].server, c.sides[1].server, c.sides[2].server), (0, 0, 1));
        assert_eq!(c.sides[1].bench.args.random_input_len, 512);
        assert_eq!(c.sides[0].bench.args.random_input_len, 16);
        assert_eq!(c.sides[3].steps, [0, 1, 2]);
        assert_eq!(c.baseline.as_deref(), Some("small"));
        assert!(c.grid && c.is_grid() && !c.is_ab());
        // Linked to the step axis, each configuration runs at its own cap only.
        let c = p(&[
            "--concurrency",
            "1,8,64",
            "--server-cmd",
            "srv",
            "--serve-params",
            &sp,
            "--link-vars",
            "max_running_requests=max_concurrency",
        ])
        .expect("linked");
        assert_eq!((c.sides[0].steps.as_slice(), c.sides[1].steps.as_slice()), (&[1][..], &[2][..]));
    }

    #[test]
    fn linked_bench_values_are_carried_or_filter_pairs() {
        let (_d, sp, bp) = files(
            r#"[{"context_length": 256}, {"context_length": 512}]"#,
            r#"[{"random_input_len": 256}, {"random_output_len": 7}]"#,
        );
        let c = p(&[
            "--concurrency",
            "1",
            "--server-cmd",
            "srv",
            "--serve-params",
            &sp,
            "--bench-params",
            &bp,
            "--link-vars",
            "context_length=random_input_len",
        ])
        .expect("linked");
        // (256, input 256) kept; (512, input 256) dropped; the second workload takes each value.
        let got: Vec<(String, u64)> =
            c.sides.iter().map(|s| (s.label.clone(), s.bench.args.random_input_len)).collect();
        assert_eq!(
            got,
            [
                ("context-length=256:random-input-len=256".to_owned(), 256),
                ("context-length=256:random-output-len=7".to_owned(), 256),
                ("context-length=512:random-output-len=7".to_owned(), 512),
            ]
        );
        assert_eq!(c.sides[2].bench_extra, ["--random-output-len", "7", "--random-input-len", "512"]);
    }

    #[test]
    fn grid_flags_are_refused_by_name() {
        let (_d, sp, bp) = files(r#"[{"a": 1}]"#, r#"[{"max_concurrency": 4}]"#);
        let e = |args: &[&str]| p(args).expect_err("refused");
        assert!(e(&["--concurrency", "1", "--serve-params", &sp]).contains("one --server-cmd"));
        assert!(e(&["--concurrency", "1", "--server-cmd", "a", "--server-cmd", "b", "--serve-params", &sp])
            .contains("one --server-cmd"));
        assert!(e(&["--concurrency", "1", "--server-cmd", "a", "--serve-params", &sp, "--label", "x"])
            .contains("no --label"));
        assert!(e(&["--concurrency", "1", "--server-cmd", "a", "--bench-params", &bp])
            .contains("--max-concurrency is set by the sweep"));
        assert!(e(&["--concurrency", "1", "--link-vars", "a=b"]).contains("give --serve-params"));
        assert!(e(&["--concurrency", "1", "--server-cmd", "a", "--serve-params", &sp, "--baseline", "zz"])
            .contains("--baseline \"zz\""));
        assert!(e(&["--concurrency", "1", "--server-cmd", "a", "--serve-params", "/nonexistent.json"])
            .contains("--serve-params /nonexistent.json"));
        let (_d2, sp2, bp2) = files(r#"[{"a": 1}]"#, r#"[{"random_input_len": "many"}]"#);
        assert!(e(&["--concurrency", "1", "--server-cmd", "a", "--serve-params", &sp2, "--bench-params", &bp2])
            .contains("--bench-params random-input-len=many"));
        assert!(e(&[
            "--concurrency",
            "2",
            "--server-cmd",
            "a",
            "--serve-params",
            &sp2,
            "--link-vars",
            "a=max_concurrency"
        ])
        .contains("a=1, which is not among the steps (2)"));
        assert!(e(&["--concurrency", "2", "--server-cmd", "srv --a 3", "--serve-params", &sp2])
            .contains("--a is in --server-cmd as well"));
    }
}
