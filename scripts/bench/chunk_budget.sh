#!/usr/bin/env bash
# Chunk budget under mixed load: one `sparrow serve` per `--chunked-prefill-size` value, the same
# Poisson workload each time (random-ids prompts of 1 .. 2000 tokens, 64 output tokens, same
# seed), and the TTFT / ITL / throughput each gives, so the default can be chosen by measurement.
#
#   scripts/bench/chunk_budget.sh SPARROW_BIN OUTDIR [SIZES]         (default sizes: 256 512 1024 2048)
#
# env: RATE (requests/s, default 0.4), N (prompts, default 24), SERVE_ARGS. The radix cache is
# off so every prompt is prefilled. Prints a markdown table; records go to OUTDIR/chunk-S.jsonl.
set -euo pipefail
BIN=${1:?sparrow binary}; OUT=${2:?outdir}; shift 2
SIZES=${*:-256 512 1024 2048}
RATE=${RATE:-0.4}; N=${N:-24}; PORT=${PORT:-18095}
mkdir -p "$OUT"
echo "| --chunked-prefill-size | TTFT median ms | TTFT p99 ms | ITL p99 ms | TPOT median ms | output tok/s |"
echo "|---|---|---|---|---|---|"
for c in $SIZES; do
  # shellcheck disable=SC2086
  "$BIN" serve --host 127.0.0.1 --port "$PORT" --chunked-prefill-size "$c" --disable-radix-cache \
    --context-length 4096 ${SERVE_ARGS:-} >"$OUT/server-$c.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.5; done
  "$BIN" bench --backend sglang --host 127.0.0.1 --port "$PORT" --dataset-name random-ids \
    --random-input-len 2000 --random-output-len 64 --random-range-ratio 0.0 --num-prompts "$N" \
    --request-rate "$RATE" --seed 7 --disable-tqdm --output-file "$OUT/chunk-$c.jsonl" >"$OUT/bench-$c.txt" 2>&1 || true
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
  python3 - "$OUT/chunk-$c.jsonl" "$c" <<'PY'
import json, sys
p, c = sys.argv[1:]
try:
    d = json.loads(open(p).read().strip().splitlines()[-1])
except Exception as e:
    print(f"| {c} | failed: {e} | | | | |"); sys.exit()
g = lambda k: d.get(k) or 0
print(f"| {c} | {g('median_ttft_ms'):.0f} | {g('p99_ttft_ms'):.0f} | {g('p99_itl_ms'):.0f} | {g('median_tpot_ms'):.0f} | {g('output_throughput'):.1f} |")
PY
done
