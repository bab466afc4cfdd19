#!/usr/bin/env bash
# Tunes a real `sparrow serve` (the default model, SmolLM2-135M) the way the origin story did
# by hand: a grid of 2 x 2 server configurations (--max-running-requests 4 / 16, radix cache
# on / off) x 2 workloads (random prompts, and prompts sharing a long system prefix, where the
# radix cache matters) x concurrency 1, 4, 16, with TTFT/TPOT SLOs; then checks the report in
# a headless browser (scripts/ops/sweep_report_check.sh). About 10 minutes on 2 cores.
#
#   scripts/ops/sweep_grid_check.sh [OUT_DIR]     # default: a new temporary folder
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q -p sparrow
bin=$PWD/target/release/sparrow
out=${1:-$(mktemp -d)/grid}
port=${PORT:-31800}
params=$(mktemp -d)
cat > "$params/serve.json" <<'EOF'
{"mrr4": {"max_running_requests": 4},
 "mrr4-noradix": {"max_running_requests": 4, "disable_radix_cache": true},
 "mrr16": {"max_running_requests": 16},
 "mrr16-noradix": {"max_running_requests": 16, "disable_radix_cache": true}}
EOF
cat > "$params/bench.json" <<'EOF'
{"random": {"dataset_name": "random", "random_input_len": 128, "random_output_len": 32, "random_range_ratio": 1},
 "shared-prefix": {"dataset_name": "generated-shared-prefix", "gsp_num_groups": 2, "gsp_prompts_per_group": 16,
                   "gsp_system_prompt_len": 512, "gsp_question_len": 32, "gsp_output_len": 32}}
EOF
# No batch cap timed at start-up (--disable-autotune): each configuration starts in seconds.
"$bin" sweep --server-cmd "$bin serve --port $port --disable-autotune --max-total-tokens 16384" \
  --host 127.0.0.1 --port "$port" --backend sglang-oai \
  --serve-params "$params/serve.json" --bench-params "$params/bench.json" \
  --concurrency 1,4,16 --num-prompts-per-step 32 --slo-ttft-ms 2000 --slo-tpot-ms 150 \
  --disable-tqdm --output-dir "$out"
scripts/ops/sweep_report_check.sh "$out"
