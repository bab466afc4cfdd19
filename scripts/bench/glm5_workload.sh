#!/usr/bin/env bash
# The origin-story workload on glm5-tiny (GLM-5 architecture, NVFP4 experts): for each
# concurrency, a fresh `sparrow serve` on the toy checkpoint, `sparrow bench` (random, input 256,
# output 128, 256 prompts, rate inf), then the server's counters from /metrics: prefill chunks,
# retractions, radix-cache hit tokens, and whether the server is still alive.
#
#   scripts/bench/glm5_workload.sh                 # concurrencies 1 64 256 512
#   CONCURRENCY="256 512" scripts/bench/glm5_workload.sh
#   SERVE_ARGS="--max-total-tokens 32768" scripts/bench/glm5_workload.sh   # extra serve flags
#
# MODEL_DIR (default $SPARROW_CACHE_DIR or ~/.cache/sparrow, /glm5-tiny) is generated with
# `sparrow gen-model glm5-tiny` if missing. The default serve flags keep the KV pool at 32768
# tokens so that 256+ concurrent requests of up to 384 tokens must be retracted.
set -euo pipefail
cd "$(dirname "$0")/../.."
PORT=${PORT:-30100}
CACHE=${SPARROW_CACHE_DIR:-$HOME/.cache/sparrow}
MODEL_DIR=${MODEL_DIR:-$CACHE/glm5-tiny}
CONCURRENCY=${CONCURRENCY:-1 64 256 512}
SERVE_ARGS=${SERVE_ARGS:---max-total-tokens 32768}
OUT=${OUTPUT_FILE:-/tmp/sparrow_glm5_workload.jsonl}
cargo build --release -q -p sparrow
BIN=target/release/sparrow
[ -f "$MODEL_DIR/config.json" ] || "$BIN" gen-model glm5-tiny --output "$MODEL_DIR"
for C in $CONCURRENCY; do
  if (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null; then
    echo "port $PORT is already in use; pick another with PORT=..." >&2
    exit 1
  fi
  # shellcheck disable=SC2086
  "$BIN" serve --model-path "$MODEL_DIR" --port "$PORT" $SERVE_ARGS 2> "/tmp/sparrow_glm5_serve_c$C.log" &
  SERVER=$!
  trap 'kill $SERVER 2>/dev/null || true' EXIT
  for _ in $(seq 600); do
    kill -0 $SERVER 2>/dev/null || { echo "sparrow serve exited during start-up" >&2; exit 1; }
    (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break
    sleep 0.5
  done
  echo "=== concurrency $C ==="
  "$BIN" bench --backend sglang-oai --host 127.0.0.1 --port "$PORT" \
    --dataset-name random --random-input-len 256 --random-output-len 128 --num-prompts 256 \
    --request-rate inf --max-concurrency "$C" --output-file "$OUT" || echo "bench exit status $?"
  exec 3<>/dev/tcp/127.0.0.1/$PORT
  printf 'GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n' >&3
  grep -E '^(sparrow:num_prefill_chunks_total|sparrow:num_retractions_total|sparrow:radix_hit_tokens_total|sglang:cache_hit_rate|sglang:generation_tokens_total) ' <&3 || true
  exec 3<&-
  if kill -0 $SERVER 2>/dev/null; then echo "server alive after the run"; else echo "SERVER DIED"; fi
  grep -E "model runner" "/tmp/sparrow_glm5_serve_c$C.log" | head -1 | cut -c1-400
  kill $SERVER; wait $SERVER 2>/dev/null || true
done
