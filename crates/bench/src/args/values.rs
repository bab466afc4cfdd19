//! The value enums of `sparrow bench`'s flags, with SGLang's spellings. SGLang names that
//! sparrow bench does not implement are hidden variants, so that using one is refused by
//! name at validation instead of failing as an unknown value.

use clap::ValueEnum;

/// Dataset choices (`--dataset-name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DatasetName {
    /// ShareGPT conversations: first human turn as prompt.
    #[value(name = "sharegpt")]
    ShareGpt,
    /// ShareGPT text repeated or cut to drawn token lengths.
    #[value(name = "random")]
    Random,
    /// Consecutive vocabulary ids to drawn token lengths.
    #[value(name = "random-ids")]
    RandomIds,
    /// Groups sharing a random system prompt (`--gsp-*`).
    #[value(name = "generated-shared-prefix")]
    GeneratedSharedPrefix,
    /// A JSONL file given by `--dataset-path`.
    #[value(name = "custom")]
    Custom,
    /// OpenAI chat requests, one JSON object per line (`messages`, `max_tokens`, and any
    /// other field passed through to the request), from `--dataset-path`.
    #[value(name = "openai")]
    OpenAi,
    /// A Mooncake trace (`timestamp` ms, `hash_ids`, `output_length` per line) replayed at
    /// its own timestamps.
    #[value(name = "mooncake")]
    Mooncake,
    // SGLang's dataset names that sparrow bench refuses by name.
    /// Refused by name.
    #[value(name = "agentic-trace", hide = true)]
    AgenticTrace,
    /// Refused by name.
    #[value(name = "mmmu", hide = true)]
    Mmmu,
    /// Refused by name.
    #[value(name = "image", hide = true)]
    Image,
    /// Refused by name.
    #[value(name = "longbench_v2", hide = true)]
    LongBenchV2,
    /// Refused by name.
    #[value(name = "speed-bench", hide = true)]
    SpeedBench,
    /// `mooncake` with `--mooncake-workload mooncake` (the spelling in SGLang's docs).
    #[value(name = "mooncake-mooncake", hide = true)]
    MooncakeMooncake,
    /// `mooncake` with `--mooncake-workload conversation`.
    #[value(name = "mooncake-conversation", hide = true)]
    MooncakeConversation,
    /// `mooncake` with `--mooncake-workload synthetic`.
    #[value(name = "mooncake-synthetic", hide = true)]
    MooncakeSynthetic,
    /// `mooncake` with `--mooncake-workload toolagent`.
    #[value(name = "mooncake-toolagent", hide = true)]
    MooncakeToolagent,
}

impl DatasetName {
    /// The name as spelled on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DatasetName::ShareGpt => "sharegpt",
            DatasetName::Random => "random",
            DatasetName::RandomIds => "random-ids",
            DatasetName::GeneratedSharedPrefix => "generated-shared-prefix",
            DatasetName::Custom => "custom",
            DatasetName::OpenAi => "openai",
            DatasetName::Mooncake => "mooncake",
            DatasetName::AgenticTrace => "agentic-trace",
            DatasetName::Mmmu => "mmmu",
            DatasetName::Image => "image",
            DatasetName::LongBenchV2 => "longbench_v2",
            DatasetName::SpeedBench => "speed-bench",
            DatasetName::MooncakeMooncake => "mooncake-mooncake",
            DatasetName::MooncakeConversation => "mooncake-conversation",
            DatasetName::MooncakeSynthetic => "mooncake-synthetic",
            DatasetName::MooncakeToolagent => "mooncake-toolagent",
        }
    }

    /// The workload a `mooncake-<workload>` spelling names.
    pub(super) fn mooncake_alias(self) -> Option<MooncakeWorkload> {
        match self {
            DatasetName::MooncakeMooncake => Some(MooncakeWorkload::Mooncake),
            DatasetName::MooncakeConversation => Some(MooncakeWorkload::Conversation),
            DatasetName::MooncakeSynthetic => Some(MooncakeWorkload::Synthetic),
            DatasetName::MooncakeToolagent => Some(MooncakeWorkload::ToolAgent),
            _ => None,
        }
    }

    /// Whether sparrow bench implements the dataset (the others are SGLang names it refuses).
    pub fn supported(self) -> bool {
        !matches!(
            self,
            DatasetName::AgenticTrace
                | DatasetName::Mmmu
                | DatasetName::Image
                | DatasetName::LongBenchV2
                | DatasetName::SpeedBench
        )
    }
}

/// `--gsp-group-distribution`: how requests are spread over the prefix groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GroupDistribution {
    /// Every group gets `--gsp-prompts-per-group` requests.
    #[value(name = "uniform")]
    Uniform,
    /// Each request's group is drawn by rank with p(rank) ∝ 1/rank^alpha (group 0 hottest).
    #[value(name = "zipf")]
    Zipf,
}

/// `--mooncake-workload`: which of Mooncake's published traces the default file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MooncakeWorkload {
    /// `mooncake_trace.jsonl` (the arXiv trace).
    #[value(name = "mooncake")]
    Mooncake,
    /// `conversation_trace.jsonl`.
    #[value(name = "conversation")]
    Conversation,
    /// `synthetic_trace.jsonl`.
    #[value(name = "synthetic")]
    Synthetic,
    /// `toolagent_trace.jsonl`.
    #[value(name = "toolagent")]
    ToolAgent,
}

impl MooncakeWorkload {
    /// The name as spelled on the command line.
    pub fn name(self) -> &'static str {
        match self {
            MooncakeWorkload::Mooncake => "mooncake",
            MooncakeWorkload::Conversation => "conversation",
            MooncakeWorkload::Synthetic => "synthetic",
            MooncakeWorkload::ToolAgent => "toolagent",
        }
    }
}

/// One `--goodput` SLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SloMetric {
    /// Time to first token.
    Ttft,
    /// Time per output token after the first.
    Tpot,
    /// End-to-end latency.
    E2el,
}

impl SloMetric {
    /// SGLang's key (`ttft`, `tpot`, `e2el`).
    pub fn name(self) -> &'static str {
        match self {
            SloMetric::Ttft => "ttft",
            SloMetric::Tpot => "tpot",
            SloMetric::E2el => "e2el",
        }
    }
}
