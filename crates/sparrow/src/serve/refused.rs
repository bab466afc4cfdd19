//! The SGLang `launch_server` flags `sparrow serve` refuses, grouped by why, and the check of a
//! command line against them before clap sees it.
//!
//! SGLang 0.5.23 has 531 server flags (559 spellings, aliases and `--no-` forms included);
//! sparrow serve takes the few it implements and refuses every other one by name, so that an
//! SGLang command line never half-works: a refused flag is an error that says what the flag
//! is for, not clap's "unexpected argument". The check runs before clap because argparse
//! (which `launch_server` uses, with abbreviations allowed) resolves an abbreviated flag
//! against all of SGLang's flags: `--tp 2` means `--tp-size 2` there and is refused as such
//! here, and a prefix several flags share is "ambiguous" in both. The table is checked
//! against SGLang's parser, extracted into `tests/fixtures/sglang_server_args.json` by
//! `scripts/goldens/sglang_server_args.py`: every SGLang flag is taken or in it, and it holds only
//! SGLang flags.

use clap::{Args, Command};

use super::flags::ServeArgs;

/// SGLang `launch_server` flags sparrow serve refuses for one reason.
#[derive(Debug)]
pub struct RefusedGroup {
    /// What the flags are for, shown in the refusal.
    pub why: &'static str,
    /// Every spelling (aliases and `--no-` forms included).
    pub flags: &'static [&'static str],
}

/// Every SGLang 0.5.23 `launch_server` flag sparrow serve refuses, by reason.
#[rustfmt::skip]
pub const REFUSED_GROUPS: &[RefusedGroup] = &[
    RefusedGroup {
        why: "the GPU memory fraction; sparrow sizes its KV pool with --kv-cache-gb or --max-total-tokens",
        flags: &[
            "--mem-fraction-static",
        ],
    },
    RefusedGroup {
        why: "LoRA adapters",
        flags: &[
            "--enable-lora", "--enable-lora-overlap-loading", "--max-lora-rank", "--lora-target-modules",
            "--lora-paths", "--max-loaded-loras", "--max-loras-per-batch", "--lora-eviction-policy", "--lora-backend",
            "--max-lora-chunk-size", "--experts-shared-outer-loras", "--no-experts-shared-outer-loras",
            "--lora-use-virtual-experts", "--lora-strict-loading", "--no-lora-strict-loading",
            "--lora-drain-wait-threshold", "--uno-lora-path",
        ],
    },
    RefusedGroup {
        why: "speculative decoding options beyond NGRAM and STANDALONE's (sparrow verifies one draft chain, \
              with --speculative-num-draft-tokens, --speculative-num-steps, --speculative-eagle-topk 1 and \
              --speculative-ngram-max-trie-depth)",
        flags: &[
            "--speculative-draft-model-revision", "--speculative-draft-load-format", "--speculative-dflash-block-size",
            "--speculative-domino-candidate-pool-size", "--speculative-dspark-block-size",
            "--speculative-dspark-sps-table-path", "--speculative-dspark-confidence-sts-path",
            "--speculative-dspark-align-verify-tokens-to-graph-tier", "--speculative-accept-threshold-single",
            "--speculative-accept-threshold-acc", "--speculative-use-rejection-sampling",
            "--speculative-use-block-verification", "--speculative-token-map", "--speculative-attention-mode",
            "--speculative-draft-attention-backend", "--speculative-dsa-topk-backend",
            "--speculative-draft-kv-cache-dtype", "--speculative-draft-window-size", "--speculative-draft-sink-size",
            "--speculative-moe-runner-backend", "--speculative-moe-a2a-backend",
            "--speculative-enable-w4a4-mxfp4-megamoe", "--no-speculative-enable-w4a4-mxfp4-megamoe",
            "--speculative-draft-model-quantization", "--enable-multi-layer-eagle", "--speculative-adaptive",
            "--speculative-adaptive-config", "--spec-trace-dir", "--speculative-ngram-min-bfs-breadth",
            "--speculative-ngram-max-bfs-breadth", "--speculative-ngram-match-type",
            "--speculative-ngram-capacity",
            "--speculative-ngram-external-corpus-path", "--speculative-ngram-external-sam-budget",
            "--speculative-ngram-external-corpus-max-tokens",
        ],
    },
    RefusedGroup {
        why: "prefill/decode and encoder disaggregation, and PD multiplexing",
        flags: &[
            "--decoupled-spec-bind-endpoint", "--decoupled-spec-connect-endpoints", "--decoupled-spec-rank",
            "--decoupled-spec-role", "--disaggregation-mode", "--disaggregation-decode-allocation-policy",
            "--disaggregation-transfer-backend", "--disaggregation-enable-kv-checksum",
            "--disaggregation-bootstrap-port", "--disaggregation-ib-device",
            "--disaggregation-decode-enable-radix-cache", "--disaggregation-decode-enable-offload-kvcache",
            "--disaggregation-decode-retraction-backup", "--num-reserved-decode-tokens",
            "--disaggregation-decode-extra-slots", "--disaggregation-decode-polling-interval",
            "--enable-pd-role-switch", "--optimistic-prefill-attempts", "--encoder-only", "--language-only",
            "--language-model-only", "--encoder-transfer-backend", "--encoder-urls", "--encoder-bootstrap-port",
            "--encoder-register-urls", "--enable-adaptive-dispatch-to-encoder", "--enable-pdmux",
            "--pdmux-config-path", "--sm-group-num", "--disaggregation-decode-host-receive-threshold",
        ],
    },
    RefusedGroup {
        why: "multimodal inputs; sparrow serves text-only models",
        flags: &[
            "--enable-precise-embedding-interpolation", "--enable-multimodal", "--mm-attention-backend",
            "--enable-broadcast-mm-inputs-process", "--enable-prefix-mm-cache", "--mm-enable-dp-encoder",
            "--no-mm-enable-dp-encoder", "--mm-process-config", "--mm-processor-worker-num", "--mm-io-worker-num",
            "--allowed-media-domains", "--media-url-max-file-size-mb", "--mm-preprocess-cache-size-mb",
            "--trust-mm-content-hashes", "--limit-mm-data-per-request", "--enable-mm-global-cache",
            "--image-processor-backend", "--mm-global-cache-backend", "--disable-fast-image-processor",
            "--mm-feature-transport",
        ],
    },
    RefusedGroup {
        why: "CUDA graphs and torch.compile; sparrow captures no graphs, and takes --disable-cuda-graph as a no-op",
        flags: &[
            "--startup-weight-load-mode", "--cuda-graph-config", "--cuda-graph-backend-decode",
            "--cuda-graph-backend-prefill", "--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill",
            "--cuda-graph-max-seq-len-prefill", "--cuda-graph-bs-decode", "--cuda-graph-bs-prefill",
            "--cuda-graph-prefill-max-context", "--context-bucket", "--disable-prefill-cuda-graph",
            "--disable-decode-cuda-graph", "--disable-cuda-graph-padding", "--enable-profile-cuda-graph",
            "--enable-cudagraph-gc", "--debug-cuda-graph", "--enable-torch-compile",
            "--enable-torch-compile-debug-mode", "--torch-compile-max-bs",
        ],
    },
    RefusedGroup {
        why: "parallelism across GPUs and nodes, and its collectives; sparrow is one process on the CPU, sized with \
             --threads",
        flags: &[
            "--enable-two-batch-overlap", "--enable-single-batch-overlap", "--tbo-token-distribution-threshold",
            "--enable-fused-moe-sum-all-reduce", "--enable-nccl-nvls", "--enable-symm-mem",
            "--disable-custom-all-reduce", "--enable-mscclpp", "--enable-torch-symm-mem", "--enable-scattered-sconv",
            "--pre-warm-nccl", "--boundary-reduction", "--enable-quant-communications",
            "--enforce-disable-flashinfer-allreduce-fusion", "--flashinfer-allreduce-fusion-backend",
            "--enable-aiter-allreduce-fusion", "--disable-aiter-allreduce-fusion-in-prefill",
            "--disable-aiter-allreduce-fusion-in-decode", "--use-ray", "--nccl-port", "--dist-timeout",
            "--dist-init-addr", "--nccl-init-addr", "--gated-launch-port", "--nnodes", "--node-rank", "--tp-size",
            "--tensor-parallel-size", "--dcp-size", "--decode-context-parallel-size", "--pp-size",
            "--pipeline-parallel-size", "--pp-max-micro-batch-size", "--pp-async-batch-depth", "--dp-size",
            "--data-parallel-size", "--attn-dp-size", "--attention-data-parallel-size", "--load-balance-method",
            "--attn-cp-size", "--attention-context-parallel-size", "--moe-dp-size", "--moe-data-parallel-size",
            "--dwdp-size", "--dcp-comm-backend", "--dcp-replicate-q-proj", "--no-dcp-replicate-q-proj",
            "--enable-prefill-cp", "--cp-strategy", "--enable-dsa-cache-layer-split", "--enable-cp-decode-attn-tp",
            "--enable-kv-cache-sharding", "--enable-dp-attention-local-control-broadcast", "--enable-dp-lm-head",
            "--enable-tp-lm-head-all-to-all", "--no-enable-tp-lm-head-all-to-all", "--enable-attn-tp-input-scattered",
            "--enable-shared-experts-attn-tp", "--shared-experts-tp-size", "--enable-dense-mlp-attn-tp",
            "--enable-layernorm-sp", "--enable-megamoe-for-layernorm-sp", "--disable-attn-tp-gather",
            "--enable-p2p-check", "--ep-size", "--expert-parallel-size", "--ep", "--moe-dense-tp-size",
            "--elastic-ep-join-rank-offset", "--elastic-ep-initial-size", "--max-ep-size", "--enable-dp-attention",
            "--enable-flashinfer-allreduce-fusion",
        ],
    },
    RefusedGroup {
        why: "expert parallelism and GPU MoE kernels; sparrow's MoE implementation is chosen with --moe-runner-backend",
        flags: &[
            "--moe-a2a-backend", "--enable-w4a4-mxfp4-megamoe", "--deepep-v2-mode",
            "--flashinfer-mxfp4-moe-precision", "--deepep-mode", "--fuseep-mode", "--deepep-dispatcher-output-dtype",
            "--flashinfer-a2a-dispatch-type", "--ep-num-redundant-experts", "--ep-dispatch-algorithm",
            "--init-expert-location", "--enable-eplb", "--eplb-algorithm", "--eplb-rebalance-num-iterations",
            "--eplb-rebalance-layers-per-chunk", "--eplb-min-rebalancing-utilization-threshold",
            "--expert-distribution-recorder-mode", "--expert-distribution-recorder-buffer-size",
            "--expert-balancedness-report-mode", "--deepep-config", "--elastic-ep-backend",
            "--enable-elastic-expert-backup", "--mooncake-ib-device", "--enable-waterfill", "--elastic-ep-join-mode",
            "--elastic-ep-scale-timeout", "--disable-flashinfer-cutlass-moe-fp4-allgather",
            "--disable-shared-experts-fusion", "--enforce-shared-experts-fusion", "--enable-paged-experts",
            "--paged-experts-num-resident", "--kt-weight-path", "--kt-method", "--kt-cpuinfer",
            "--kt-threadpool-count", "--kt-num-gpu-experts", "--kt-max-deferred-experts-per-token",
        ],
    },
    RefusedGroup {
        why: "GPU kernel selection; sparrow picks its CPU kernels by ISA at start-up, its attention with \
             --attention-backend and --nsa-prefill-backend/--nsa-decode-backend",
        flags: &[
            "--mamba-backend", "--linear-attn-backend", "--linear-attn-decode-backend",
            "--linear-attn-prefill-backend", "--linear-attn-verify-backend", "--enable-linear-replayssm",
            "--linear-replayssm-cache-len", "--enable-linear-replayssm-spec", "--decode-attention-backend",
            "--enable-lean-attention", "--enable-nvidia-megakernel", "--enable-amd-monokernel",
            "--prefill-attention-backend", "--prefill-kv-cache-dequant-dtype", "--fp8-gemm-backend",
            "--fp4-gemm-backend", "--bf16-gemm-backend", "--dsa-prefill-backend", "--dsv4-prefill-backend",
            "--dsa-triton-union", "--dsa-decode-backend", "--dsv4-attn-backend", "--dsa-paged-mqa-logits-backend",
            "--dsa-topk-backend", "--disable-flashinfer-autotune", "--flashinfer-autotune-skip-ops",
            "--triton-attention-reduce-in-fp32", "--triton-attention-num-kv-splits",
            "--triton-attention-split-tile-size", "--flashinfer-mla-disable-ragged", "--enable-fused-qk-norm-rope",
            "--no-enable-fused-qk-norm-rope", "--enable-deepseek-v4-fp4-indexer", "--enable-dsa-fused-indexer",
            "--no-enable-dsa-fused-indexer", "--mlx-enable-sampling", "--enable-fp32-lm-head", "--enable-tf32-matmul",
            "--no-enable-tf32-matmul", "--sampling-backend", "--monokernel-backend",
        ],
    },
    RefusedGroup {
        why: "CPU offload and GPU memory saving; sparrow's weights and KV cache live in host memory already",
        flags: &[
            "--cpu-offload-gb", "--offload-group-size", "--offload-num-in-group", "--offload-prefetch-step",
            "--offload-mode", "--ple-offload-embedding", "--no-ple-offload-embedding", "--ple-offload-backend",
            "--ple-offload-dir", "--enable-unified-memory", "--enable-memory-saver", "--enable-weights-cpu-backup",
            "--enable-draft-weights-cpu-backup",
        ],
    },
    RefusedGroup {
        why: "GPU device placement and process supervision",
        flags: &[
            "--device", "--base-gpu-id", "--gpu-id-step", "--watchdog-timeout", "--soft-watchdog-timeout",
            "--sleep-on-idle", "--numa-node", "--gc-threshold",
        ],
    },
    RefusedGroup {
        why: "KV cache tiers beyond the file tier, external KV stores and eviction policies; sparrow has a radix \
             cache with LRU eviction and one file tier (--enable-hierarchical-cache)",
        flags: &[
            "--radix-eviction-policy", "--radix-eviction-policy-config", "--enable-page-major-kv-layout",
            "--enable-session-radix-cache", "--radix-cache-backend",
            "--enable-hicache", "--hicache-host-memory-mode",
            "--hicache-host-memory-fraction", "--hicache-io-backend",
            "--hicache-mem-layout", "--hicache-storage-prefetch-policy",
            "--hicache-storage-prefetch-retry-poll-interval",
            "--hicache-storage-prefetch-retry-max-attempts", "--enable-unified-cache-external-linker",
            "--unified-cache-external-linker-backend", "--unified-cache-external-linker-config",
            "--enable-linker-mla-dedup", "--enable-hisparse", "--hisparse-config",
            "--hierarchical-sparse-attention-extra-config", "--enable-lmcache", "--lmcache-config-file",
            "--enable-flexkv", "--flexkv-config-file", "--strip-thinking-cache",
        ],
    },
    RefusedGroup {
        why: "hybrid-attention models (Mamba, sliding-window, linear attention), which sparrow does not run",
        flags: &[
            "--mamba-ssm-dtype", "--mamba-max-states-per-path", "--enable-mamba-cache-stochastic-rounding",
            "--mamba-cache-philox-rounds", "--mamba-radix-cache-strategy", "--mamba-track-interval",
            "--enable-int8-mamba-checkpoint", "--int8-mamba-ckpt-size", "--c128-page-size", "--swa-full-tokens-ratio",
            "--swa-prefix-tails", "--disable-hybrid-swa-memory", "--max-mamba-cache-size",
            "--mamba-full-memory-ratio", "--enable-encoder-swa-bounded-replay", "--enable-decoder-swa-bounded-replay",
            "--no-enable-decoder-swa-bounded-replay",
        ],
    },
    RefusedGroup {
        why: "dtypes and quantization chosen at load time; sparrow runs GGUF or safetensors weights as stored, \
             quantized offline by `sparrow quantize`",
        flags: &[
            "--dtype", "--quantization", "--quantization-param-path", "--qsa-indexer-dtype",
            "--modelopt-quant", "--modelopt-checkpoint-restore-path", "--modelopt-checkpoint-save-path",
            "--modelopt-export-path", "--quantize-and-serve", "--rl-quant-profile",
        ],
    },
    RefusedGroup {
        why: "weight sources and loaders other than a local GGUF file or checkpoint directory: hub downloads, remote \
             or encrypted weights",
        flags: &[
            "--load-format", "--model-loader-extra-config", "--trust-remote-code", "--revision", "--model-impl",
            "--model-config-parser", "--json-model-override-args", "--custom-weight-loader",
            "--weight-loader-disable-mmap", "--weight-loader-prefetch-checkpoints",
            "--weight-loader-prefetch-num-threads", "--weight-loader-drop-cache-after-load",
            "--remote-instance-weight-loader-seed-instance-ip",
            "--remote-instance-weight-loader-seed-instance-service-port",
            "--remote-instance-weight-loader-send-weights-group-ports", "--remote-instance-weight-loader-backend",
            "--remote-instance-weight-loader-start-seed-via-transfer-engine", "--engine-info-bootstrap-port",
            "--modelexpress-config", "--download-dir", "--model-checksum", "--delete-ckpt-after-loading",
            "--decrypted-config-file", "--decrypted-draft-config-file",
            "--checkpoint-engine-wait-weights-before-ready", "--weight-cache-mode", "--weight-cache-socket",
            "--weight-cache-timeout", "--weight-version",
        ],
    },
    RefusedGroup {
        why: "embedding and scoring models",
        flags: &[
            "--enable-mis",
        ],
    },
    RefusedGroup {
        why: "scheduler policies and tuning beyond sparrow's fcfs/lpm admission, priority scheduling, chunked and \
             fair prefill, mixed batches, retraction and the queue limit",
        flags: &[
            "--prefill-decode-interval", "--prefill-decode-interval-min-bs",
            "--enable-dynamic-chunking", "--prefill-max-requests", "--abort-on-priority-when-disabled",
            "--retraction-policy", "--schedule-conservativeness", "--prefill-only-disable-kv-cache",
            "--disable-chunked-prefix-cache", "--disable-overlap-schedule", "--num-continuous-decode-steps",
            "--scheduler-recv-interval", "--enable-mixed-chunk", "--enable-prefill-delayer",
            "--prefill-delayer-max-delay-passes", "--prefill-delayer-token-usage-low-watermark",
            "--prefill-delayer-forward-passes-buckets", "--prefill-delayer-wait-seconds-buckets",
            "--prefill-delayer-queue-min-ratio", "--prefill-delayer-max-delay-ms", "--min-free-slots-delay",
        ],
    },
    RefusedGroup {
        why: "logging, metrics, tracing and debug dumps; sparrow logs start-up to stderr and always serves /metrics",
        flags: &[
            "--enable-layerwise-nvtx-marker", "--log-level", "--log-level-http",
            "--log-requests-format", "--log-requests-target",
            "--uvicorn-access-log-exclude-prefixes", "--crash-dump-folder", "--show-time-cost", "--enable-metrics",
            "--smg-http-sidecar-port", "--grpc-http-sidecar-port", "--enable-mfu-metrics",
            "--enable-metrics-for-all-schedulers", "--load-snapshot-publish-interval",
            "--tokenizer-metrics-custom-labels-header", "--tokenizer-metrics-allowed-custom-labels",
            "--extra-metric-labels", "--bucket-time-to-first-token", "--bucket-inter-token-latency",
            "--bucket-e2e-request-latency", "--prompt-tokens-buckets", "--generation-tokens-buckets",
            "--gc-warning-threshold-secs", "--decode-log-interval", "--enable-request-time-stats-logging",
            "--kv-events-config", "--load-publish-endpoint", "--enable-forward-pass-metrics",
            "--forward-pass-metrics-worker-id", "--forward-pass-metrics-ipc-name", "--enable-trace",
            "--trace-modules", "--otlp-traces-endpoint", "--otlp-service-name", "--export-metrics-to-file",
            "--export-metrics-to-file-dir", "--kv-canary", "--kv-canary-sweep-interval",
            "--debug-tensor-dump-output-folder", "--debug-tensor-dump-layers", "--debug-tensor-dump-input-file",
            "--forward-hooks", "--msprobe-dump-config", "--kv-canary-real-data",
        ],
    },
    RefusedGroup {
        why: "TLS, HTTP/2, gRPC, sidecars and admin keys; sparrow serves plain HTTP/1.1 (with --api-key only)",
        flags: &[
            "--fastapi-root-path", "--enable-http-worker-reuseport", "--smg-grpc-mode", "--grpc-mode", "--grpc-port",
            "--grpc-response-timeout-secs", "--sidecar", "--sidecar-args", "--enable-http2",
            "--http2-max-concurrent-streams", "--http2-initial-connection-window-size", "--ssl-keyfile",
            "--ssl-certfile", "--ssl-ca-certs", "--ssl-keyfile-password", "--enable-ssl-refresh",
            "--admin-api-key",
        ],
    },
    RefusedGroup {
        why: "tokenizer and detokenizer process options; sparrow tokenizes in the server process",
        flags: &[
            "--tokenizer-mode", "--tokenizer-backend", "--tokenizer-worker-num", "--detokenizer-worker-num",
            "--skip-tokenizer-init", "--enable-dynamic-batch-tokenizer", "--dynamic-batch-tokenizer-batch-size",
            "--dynamic-batch-tokenizer-batch-timeout", "--enable-tokenizer-batch-encode",
            "--disable-tokenizer-batch-decode",
        ],
    },
    RefusedGroup {
        why: "chat template choices; sparrow applies the model's own chat template",
        flags: &[
            "--chat-template", "--trust-request-chat-template", "--hf-chat-template-name", "--completion-template",
            "--default-chat-template-kwargs", "--enable-strict-thinking", "--tool-server",
        ],
    },
    RefusedGroup {
        why: "constrained decoding and custom logit processing",
        flags: &[
            "--enable-custom-logit-processor", "--sampling-mask-max-tokens",
            "--disable-outlines-disk-cache", "--constrained-json-whitespace-pattern",
            "--constrained-json-disable-any-whitespace", "--constrained-json-max-whitespace-cnt",
        ],
    },
    RefusedGroup {
        why: "extra outputs and response features: hidden states, routed experts, cache reports, token ids, stored \
             responses, watermarks, sessions, ASR",
        flags: &[
            "--enable-watermark", "--watermark-config", "--enable-return-hidden-states",
            "--return-hidden-states-mode", "--enable-return-aux-hidden-states", "--return-aux-hidden-state-layer-ids",
            "--enable-return-routed-experts", "--enable-return-indexer-topk", "--enable-response-store",
            "--file-storage-path", "--enable-cache-report", "--return-input-ids", "--return-output-ids",
            "--sampling-defaults", "--asr-max-buffer-seconds", "--asr-max-concurrent-sessions",
            "--allow-auto-truncate", "--stream-interval", "--batch-notify-size",
            "--stream-response-default-include-usage", "--incremental-streaming-output", "--enable-streaming-session",
        ],
    },
    RefusedGroup {
        why: "start-up warmup requests; sparrow sends none",
        flags: &[
            "--skip-server-warmup", "--warmups",
        ],
    },
    RefusedGroup {
        why: "deterministic inference, RL and diffusion-LLM modes",
        flags: &[
            "--enable-deterministic-inference", "--rl-on-policy-target", "--dllm-algorithm",
            "--dllm-algorithm-config", "--dllm-fdfo", "--no-dllm-fdfo",
        ],
    },
    RefusedGroup {
        why: "a server-wide random seed; sparrow seeds sampling per request, from its `seed` field",
        flags: &[
            "--random-seed",
        ],
    },
    RefusedGroup {
        why: "configuration files; pass the flags on the command line",
        flags: &[
            "--config",
        ],
    },
];

/// Why sparrow serve refuses the SGLang flag `flag` (spelled out in full), if it does.
pub fn refused_why(flag: &str) -> Option<&'static str> {
    REFUSED_GROUPS.iter().find(|g| g.flags.contains(&flag)).map(|g| g.why)
}

/// The refusal of `flag`, in the bench's form (`sparrow bench` refuses bench_serving's flags
/// the same way).
pub fn refusal(flag: &str, why: &str) -> String {
    format!("{flag} is an SGLang launch_server flag that sparrow serve does not support ({why})")
}

/// The long flags `sparrow serve` takes, aliases included, spelled `--name`.
pub fn own_longs() -> Vec<String> {
    let cmd = ServeArgs::augment_args(Command::new("serve"));
    let mut longs = vec!["--help".to_owned()];
    for a in cmd.get_arguments() {
        longs.extend(a.get_long().map(|l| format!("--{l}")));
        longs.extend(a.get_all_aliases().unwrap_or_default().into_iter().map(|l| format!("--{l}")));
    }
    longs
}

/// Checks the words after `serve` as `launch_server`'s argparse would see them: a refused
/// SGLang flag, spelled out or abbreviated to a unique prefix, is refused by name; a prefix
/// that several flags (SGLang's or sparrow's) start with is ambiguous. The first such word
/// decides; anything else is left to clap.
///
/// # Errors
/// The message to print (exit status 2).
pub fn check_argv(argv: &[String]) -> Result<(), String> {
    let mut known = own_longs();
    known.extend(REFUSED_GROUPS.iter().flat_map(|g| g.flags.iter().map(|f| (*f).to_owned())));
    for w in argv {
        if w == "--" {
            break;
        }
        let name = w.split('=').next().unwrap_or(w);
        if !name.starts_with("--") || name.len() <= 2 {
            continue;
        }
        if let Some(e) = sparrow_bench::args::ambiguous_among(&known, std::slice::from_ref(w)) {
            return Err(e);
        }
        let full = if known.iter().any(|k| k == name) {
            name
        } else {
            match known.iter().find(|k| k.starts_with(name)) {
                Some(k) => k.as_str(),
                None => continue,
            }
        };
        if let Some(why) = refused_why(full) {
            return Err(refusal(full, why));
        }
    }
    Ok(())
}
