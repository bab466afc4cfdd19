//! `sparrow bench` flags, spelled and defaulted as `python -m sglang.bench_serving` spells
//! them, and their validation into an immutable [`BenchConfig`].
//!
//! SGLang flags Sparrow does not implement are still declared (hidden) so that using one is
//! refused with a message that names it, instead of a generic parse error or, worse, silence.
//!
//! - `values`: the value enums of the flags (dataset names, workloads, SLO metrics);
//! - `flags`: the raw clap struct [`BenchArgs`];
//! - `refused`: the SGLang flags refused by name, and argparse's prefix rule;
//! - `validate`: the checks that turn [`BenchArgs`] into a [`BenchConfig`].

mod flags;
mod refused;
mod validate;
mod values;

pub use flags::BenchArgs;
pub use refused::{ambiguous_among, ambiguous_flag, REFUSED_FLAGS};
pub use validate::{parse_slo, secs, BenchConfig, FlagError};
pub use values::{DatasetName, GroupDistribution, MooncakeWorkload, SloMetric};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Backend;
    use clap::Parser;

    fn parse(extra: &[&str]) -> Result<BenchConfig, String> {
        let mut argv = vec!["bench"];
        argv.extend_from_slice(extra);
        BenchArgs::try_parse_from(argv).map_err(|e| e.to_string())?.validate().map_err(|e| e.0)
    }

    #[test]
    fn sglang_defaults() {
        let c = parse(&[]).expect("defaults parse");
        assert_eq!(c.base_url, "http://0.0.0.0:30000");
        assert_eq!(c.args.backend, Backend::Sglang);
        assert_eq!(c.args.dataset_name, DatasetName::ShareGpt);
        assert_eq!(c.args.num_prompts, 1000);
        assert_eq!(c.args.random_input_len, 1024);
        assert!(c.args.request_rate.is_infinite());
        assert_eq!(c.args.random_range_ratio, 0.0);
        assert_eq!(c.args.warmup_requests, 1);
        let v = parse(&["--backend", "vllm-chat", "--host", "127.0.0.1"]).expect("vllm");
        assert_eq!(v.base_url, "http://127.0.0.1:8000");
    }

    #[test]
    fn unsupported_flags_are_refused_by_name() {
        let e = parse(&["--profile-steps", "3"]).expect_err("refused");
        assert!(e.contains("--profile-steps"), "{e}");
        let e = parse(&["--lora-name", "a", "b"]).expect_err("refused");
        assert!(e.contains("--lora-name"), "{e}");
        let e = parse(&["--no-such-flag"]).expect_err("refused");
        assert!(e.contains("--no-such-flag"), "{e}");
    }

    #[test]
    fn ambiguous_abbreviations_name_every_match() {
        let argv = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        let e = ambiguous_flag(&argv("--host x --random 5")).expect("ambiguous");
        assert!(e.starts_with("ambiguous option: --random could match"), "{e}");
        for f in ["--random-input-len", "--random-output-len", "--random-range-ratio"] {
            assert!(e.contains(f), "{e}");
        }
        assert!(ambiguous_flag(&argv("--random-input 5 --num-prompt 3 --profile")).is_none());
        assert!(ambiguous_flag(&argv("--gsp-num=3")).is_some());
        let c = parse(&["--random-input", "5", "--num-prompt", "3"]).expect("unique prefixes");
        assert_eq!((c.args.random_input_len, c.args.num_prompts), (5, 3));
    }

    #[test]
    fn flags_the_dataset_ignores_are_named() {
        let c = parse(&["--dataset-name", "random", "--gsp-num-turns", "2", "--mooncake-num-rounds", "3"]).expect("ok");
        assert_eq!(
            c.warnings,
            vec![
                "--gsp-num-turns has no effect with --dataset-name random".to_owned(),
                "--mooncake-num-rounds has no effect with --dataset-name random".to_owned(),
            ]
        );
        assert!(parse(&["--dataset-name", "random"]).expect("ok").warnings.is_empty());
    }

    #[test]
    fn values_are_checked() {
        assert!(parse(&["--request-rate", "0"]).expect_err("rate").contains("--request-rate"));
        assert!(parse(&["--extra-request-body", "[1]"]).expect_err("body").contains("--extra-request-body"));
        assert!(parse(&["--header", "nokey"]).expect_err("header").contains("--header"));
        let c = parse(&["--header", "Authorization=Bearer x", "--request-rate", "16"]).expect("ok");
        assert_eq!(c.headers, vec![("Authorization".into(), "Bearer x".into())]);
        assert_eq!(c.args.request_rate, 16.0);
    }
}
