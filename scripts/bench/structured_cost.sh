#!/usr/bin/env bash
# Cost of structured output: output tok/s at concurrency 1 and 16, with and without a JSON
# schema, interleaved in one run against one `sparrow serve` (the machines are noisy: only
# ratios measured side by side mean anything).
#
#   scripts/bench/structured_cost.sh SPARROW_BIN OUTDIR
#
# env: REPS (rounds, default 3), OUT_LEN (tokens per request, default 192), PORT, SERVE_ARGS.
# Every request makes exactly OUT_LEN tokens both ways: the plain ones ignore EOS, the schema
# asks for far more items than OUT_LEN tokens hold, so both end at the length limit. Chat
# backend (`response_format` is a chat/completions field). Prints a markdown table of medians
# over the rounds; records go to OUTDIR. The radix cache is off (the two modes send the same
# prompts) and a warm-up run comes first; the order of the modes alternates between rounds.
set -euo pipefail
BIN=${1:?sparrow binary}; OUT=${2:?outdir}
REPS=${REPS:-3}; OUT_LEN=${OUT_LEN:-192}; PORT=${PORT:-18096}
mkdir -p "$OUT"
# shellcheck disable=SC2086
"$BIN" serve --host 127.0.0.1 --port "$PORT" --disable-radix-cache ${SERVE_ARGS:-} >"$OUT/server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.5; done
SCHEMA='{"response_format": {"type": "json_schema", "json_schema": {"name": "people", "schema":
  {"type": "array", "minItems": 100, "maxItems": 100, "items": {"type": "object", "properties":
   {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"type": "string", "enum": ["Paris", "Lyon", "Nice", "Rome", "Oslo"]}},
   "required": ["name", "age", "city"], "additionalProperties": false}}}}}'
"$BIN" bench --backend sglang-oai-chat --host 127.0.0.1 --port "$PORT" --dataset-name random \
  --random-input-len 128 --random-output-len 32 --num-prompts 16 --disable-tqdm \
  --output-file "$OUT/warmup.jsonl" >"$OUT/warmup.txt" 2>&1
for rep in $(seq "$REPS"); do
  order="plain schema"; [ $((rep % 2)) = 0 ] && order="schema plain"
  for c in 1 16; do
    n=$(( c == 1 ? 4 : 32 ))
    for mode in $order; do
      extra='{}'; [ "$mode" = schema ] && extra=$SCHEMA
      "$BIN" bench --backend sglang-oai-chat --host 127.0.0.1 --port "$PORT" --dataset-name random \
        --random-input-len 128 --random-output-len "$OUT_LEN" --random-range-ratio 1.0 --num-prompts "$n" \
        --max-concurrency "$c" --seed "$rep" --disable-tqdm --extra-request-body "$extra" \
        --output-file "$OUT/$mode-c$c-r$rep.jsonl" >"$OUT/$mode-c$c-r$rep.txt" 2>&1
    done
  done
done
python3 - "$OUT" "$REPS" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
def tps(mode, c, r):
    lines = open(f"{out}/{mode}-c{c}-r{r}.jsonl").read().strip().splitlines()
    d = json.loads(lines[-1])
    return d["output_throughput"], d["completed"], d.get("total_output_tokens") or d.get("total_output")
print("| concurrency | plain output tok/s | schema output tok/s | schema / plain (median of per-round ratios) |")
print("|---|---|---|---|")
for c in (1, 16):
    p = [tps("plain", c, r) for r in range(1, reps + 1)]
    s = [tps("schema", c, r) for r in range(1, reps + 1)]
    ratios = [b[0] / a[0] for a, b in zip(p, s)]
    print(f"| {c} | {statistics.median(x[0] for x in p):.1f} | {statistics.median(x[0] for x in s):.1f} | "
          f"{statistics.median(ratios):.3f} (rounds: {', '.join(f'{x:.3f}' for x in ratios)}) |")
PY
