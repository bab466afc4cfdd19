//! The prompts of a run, built from the flags: which dataset loader gets which flags, where
//! the ShareGPT and Mooncake files are, and the routing-key prefix of
//! `--gsp-send-routing-key`. The loaders themselves live in [`crate::dataset`]; this is only
//! the mapping from a [`BenchConfig`] to them, so that the sweep and tests build exactly the
//! prompts a run would send.

use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::SeedableRng;
use sparrow_tokenizer::Tokenizer;

use super::output::civil_from_days;
use super::BenchError;
use crate::args::{BenchConfig, DatasetName, GroupDistribution};
use crate::dataset::{self, DatasetRow, GspSpec, MooncakeSpec, RandomSpec, ShareGptSpec};

fn sharegpt_path(cfg: &BenchConfig) -> Result<PathBuf, BenchError> {
    if cfg.args.dataset_path.is_empty() {
        sparrow_assets::ensure(sparrow_assets::SHAREGPT_JSON)
            .map_err(|e| BenchError::Setup(format!("ShareGPT dataset: {e}")))
    } else {
        Ok(PathBuf::from(&cfg.args.dataset_path))
    }
}

/// Builds every prompt of the run.
///
/// # Errors
/// [`BenchError::Dataset`] or [`BenchError::Setup`] when the dataset cannot be built.
pub fn build_dataset(cfg: &BenchConfig, tok: &Tokenizer) -> Result<Vec<DatasetRow>, BenchError> {
    let a = &cfg.args;
    let mut rng = StdRng::seed_from_u64(a.seed);
    let rspec = RandomSpec {
        num_prompts: a.num_prompts,
        input_len: a.random_input_len,
        output_len: a.random_output_len,
        range_ratio: a.random_range_ratio,
    };
    Ok(match a.dataset_name {
        DatasetName::Random => {
            // Check the flags before the (slow) dataset load.
            dataset::check_room(tok, rspec.input_len)?;
            let mut pairs = dataset::load_sharegpt(&sharegpt_path(cfg)?)?;
            dataset::rotate(&mut pairs, a.dataset_offset);
            dataset::random(tok, &pairs, rspec, &mut rng)?
        }
        DatasetName::RandomIds => dataset::random_ids(tok, rspec, &mut rng)?,
        DatasetName::ShareGpt => {
            let mut pairs = dataset::load_sharegpt(&sharegpt_path(cfg)?)?;
            dataset::rotate(&mut pairs, a.dataset_offset);
            let spec = ShareGptSpec {
                num_prompts: a.num_prompts,
                output_len: a.sharegpt_output_len,
                context_len: a.sharegpt_context_len,
                apply_chat_template: a.apply_chat_template,
            };
            dataset::sharegpt(tok, &pairs, spec, &mut rng)?
        }
        DatasetName::GeneratedSharedPrefix => {
            let spec = GspSpec {
                num_groups: a.gsp_num_groups,
                prompts_per_group: a.gsp_prompts_per_group,
                system_prompt_len: a.gsp_system_prompt_len,
                question_len: a.gsp_question_len,
                output_len: a.gsp_output_len,
                range_ratio: a.gsp_range_ratio,
                num_turns: a.gsp_num_turns,
                ordered: a.gsp_ordered,
                zipf_alpha: a.gsp_zipf_alpha.filter(|_| a.gsp_group_distribution == GroupDistribution::Zipf),
                fast_prepare: a.gsp_fast_prepare,
                routing_key_prefix: a.gsp_send_routing_key.then(routing_key_prefix),
                seed: a.seed,
            };
            dataset::generated_shared_prefix(tok, spec, &mut rng)?
        }
        DatasetName::Custom => dataset::custom(
            tok,
            Path::new(&a.dataset_path),
            a.num_prompts,
            a.sharegpt_output_len,
            a.apply_chat_template,
            a.dataset_offset,
        )?,
        DatasetName::OpenAi => {
            dataset::openai(tok, Path::new(&a.dataset_path), a.num_prompts, a.sharegpt_output_len, a.dataset_offset)?
        }
        DatasetName::Mooncake => {
            let path = mooncake_path(cfg)?;
            let spec = MooncakeSpec {
                num_sessions: a.num_prompts,
                num_rounds: a.mooncake_num_rounds,
                slowdown: a.mooncake_slowdown_factor,
                offset: a.dataset_offset,
            };
            dataset::mooncake(tok, &path, spec)?
        }
        other => {
            return Err(BenchError::Setup(format!("--dataset-name {} is not supported by sparrow bench", other.name())))
        }
    })
}

/// The trace file of a `mooncake` run: `--dataset-path`, else SGLang's download location
/// `/tmp/<workload>_trace.jsonl` (sparrow bench does not download it).
pub(super) fn mooncake_path(cfg: &BenchConfig) -> Result<PathBuf, BenchError> {
    let a = &cfg.args;
    let path = if a.dataset_path.is_empty() {
        PathBuf::from(format!("/tmp/{}_trace.jsonl", a.mooncake_workload.name()))
    } else {
        PathBuf::from(&a.dataset_path)
    };
    if !path.exists() {
        return Err(BenchError::Setup(format!(
            "mooncake trace {} not found: pass --dataset-path, or save the {} trace of the Mooncake \
             repository (FAST25-release/traces) there",
            path.display(),
            a.mooncake_workload.name()
        )));
    }
    Ok(path)
}

/// The run's routing-key prefix, `<8 hex digits>_<UTC yyyymmddHHMMSS>`, as SGLang builds it
/// (it uses local time) so keys differ between runs.
fn routing_key_prefix() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = now.as_secs() as i64;
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let tod = secs.rem_euclid(86_400);
    let r: u32 = rand::random();
    format!("{r:08x}_{y:04}{mo:02}{d:02}{:02}{:02}{:02}", tod / 3600, tod % 3600 / 60, tod % 60)
}
