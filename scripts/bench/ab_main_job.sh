#!/usr/bin/env bash
# The main job (scripts/main.sh's workload: 256 random prompts of 256 tokens, 128 output tokens,
# all at once) against two `sparrow` binaries, interleaved A, B, A, B ... on the same machine, so
# a refactor or a kernel change can be judged against noise. Prints one line per run and keeps
# each run's JSONL line in $OUT_DIR.
#
#   scripts/bench/ab_main_job.sh /tmp/sparrow-before target/release/sparrow [rounds]
set -euo pipefail
cd "$(dirname "$0")/../.."
A=${1:?binary A}; B=${2:?binary B}; ROUNDS=${3:-1}
PORT=${PORT:-30123}
OUT_DIR=${OUT_DIR:-/tmp/sparrow_ab_main_job}
mkdir -p "$OUT_DIR"
run_one() { # label binary round
  local label=$1 bin=$2 round=$3
  "$bin" serve --port "$PORT" ${SERVE_ARGS:-} >"$OUT_DIR/serve_${label}_$round.log" 2>&1 &
  local srv=$!
  for _ in $(seq 600); do
    (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break
    kill -0 $srv 2>/dev/null || { echo "$label: serve exited during start-up" >&2; return 1; }
    sleep 0.5
  done
  "$bin" bench --backend sglang-oai --host 127.0.0.1 --port "$PORT" \
    --dataset-name random --random-input-len 256 --random-output-len 128 --num-prompts 256 \
    --request-rate inf --output-file "$OUT_DIR/${label}_$round.jsonl" --disable-tqdm >/dev/null
  kill $srv; wait $srv 2>/dev/null || true
  python3 - "$OUT_DIR/${label}_$round.jsonl" "$label" "$round" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
print(f"{sys.argv[2]} round {sys.argv[3]}: output {r['output_throughput']:.1f} tok/s, total {r['total_throughput']:.1f} tok/s, "
      f"mean TTFT {r['mean_ttft_ms']:.0f} ms, mean TPOT {r['mean_tpot_ms']:.0f} ms, completed {r['completed']}")
PY
}
for round in $(seq "$ROUNDS"); do
  run_one A "$A" "$round"
  run_one B "$B" "$round"
done
