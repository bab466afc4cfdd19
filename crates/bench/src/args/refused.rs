//! The SGLang `bench_serving` flags sparrow bench refuses, each with what it is for, and
//! argparse's rule for abbreviated long flags (an ambiguous prefix is an error naming every
//! match). The prefix rule is shared with `sparrow serve`, whose SGLang parser
//! (`launch_server`) abbreviates the same way.

use super::flags::BenchArgs;

/// SGLang `bench_serving` flags that sparrow bench refuses, with what they are for.
pub const REFUSED_FLAGS: &[(&str, &str)] = &[
    ("--image-count", "image datasets"),
    ("--image-resolution", "image datasets"),
    ("--random-image-count", "image datasets"),
    ("--image-format", "image datasets"),
    ("--image-content", "image datasets"),
    ("--agentic-max-turns", "the agentic-trace dataset"),
    ("--speed-bench-category", "the speed-bench dataset"),
    ("--speed-bench-output-len", "the speed-bench dataset"),
    ("--return-routed-experts", "MoE routing traces"),
    ("--cache-report", "cache hit reports"),
    ("--plot-throughput", "terminal plots"),
    ("--profile-activities", "profiler options beyond --profile"),
    ("--profile-start-step", "profiler options beyond --profile"),
    ("--profile-steps", "profiler options beyond --profile"),
    ("--profile-num-steps", "profiler options beyond --profile"),
    ("--profile-by-stage", "profiler options beyond --profile"),
    ("--profile-stages", "profiler options beyond --profile"),
    ("--profile-output-dir", "profiler options beyond --profile"),
    ("--profile-prefix", "profiler options beyond --profile"),
    ("--lora-name", "LoRA adapters"),
    ("--lora-request-distribution", "LoRA adapters"),
    ("--lora-zipf-alpha", "LoRA adapters"),
    ("--prompt-suffix", "prompt suffixes"),
    ("--pd-separated", "prefill/decode disaggregation"),
    ("--profile-prefill-url", "prefill/decode disaggregation"),
    ("--profile-decode-url", "prefill/decode disaggregation"),
    ("--fake-prefill", "prefill/decode disaggregation"),
];

/// argparse's answer to an abbreviated long flag that several flags start with
/// (`ambiguous option: --random could match --random-input-len, ...`); clap would name only
/// one of them. `None` when every flag of `argv` is exact or a unique prefix.
pub fn ambiguous_flag(argv: &[String]) -> Option<String> {
    use clap::CommandFactory;
    let cmd = BenchArgs::command();
    let longs: Vec<String> = cmd.get_arguments().filter_map(|a| a.get_long()).map(|l| format!("--{l}")).collect();
    ambiguous_among(&longs, argv)
}

/// [`ambiguous_flag`] against any set of long flags `longs` (each spelled `--name`): the
/// first word of `argv` (before `--`) that is not one of them but starts more than one.
pub fn ambiguous_among(longs: &[String], argv: &[String]) -> Option<String> {
    for w in argv {
        if w == "--" {
            break;
        }
        let name = w.split('=').next().unwrap_or(w);
        if !name.starts_with("--") || name.len() <= 2 || longs.iter().any(|l| l == name) {
            continue;
        }
        let hits: Vec<&str> = longs.iter().filter(|l| l.starts_with(name)).map(String::as_str).collect();
        if hits.len() > 1 {
            return Some(format!("ambiguous option: {name} could match {}", hits.join(", ")));
        }
    }
    None
}

impl BenchArgs {
    /// The refused SGLang flags this command line uses, in [`REFUSED_FLAGS`] order.
    pub(super) fn refused_used(&self) -> Vec<&'static str> {
        let used = [
            self.refused_image_count.is_some(),
            self.refused_image_resolution.is_some(),
            self.refused_random_image_count.is_some(),
            self.refused_image_format.is_some(),
            self.refused_image_content.is_some(),
            self.refused_agentic_max_turns.is_some(),
            self.refused_speed_bench_category.is_some(),
            self.refused_speed_bench_output_len.is_some(),
            self.refused_return_routed_experts.is_some(),
            self.refused_cache_report.is_some(),
            self.refused_plot_throughput.is_some(),
            self.refused_profile_activities.is_some(),
            self.refused_profile_start_step.is_some(),
            self.refused_profile_steps.is_some(),
            self.refused_profile_num_steps.is_some(),
            self.refused_profile_by_stage.is_some(),
            self.refused_profile_stages.is_some(),
            self.refused_profile_output_dir.is_some(),
            self.refused_profile_prefix.is_some(),
            self.refused_lora_name.is_some(),
            self.refused_lora_request_distribution.is_some(),
            self.refused_lora_zipf_alpha.is_some(),
            self.refused_prompt_suffix.is_some(),
            self.refused_pd_separated.is_some(),
            self.refused_profile_prefill_url.is_some(),
            self.refused_profile_decode_url.is_some(),
            self.refused_fake_prefill.is_some(),
        ];
        REFUSED_FLAGS.iter().zip(used).filter(|(_, u)| *u).map(|((f, _), _)| *f).collect()
    }
}
