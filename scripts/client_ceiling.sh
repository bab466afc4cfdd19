#!/usr/bin/env bash
# Benchmark (not a test) of sparrow bench's own ceiling: against the mock server answering
# instantly (one token per SSE chunk, no delays), (a) the most streamed output tokens/s one
# client process sustains, (b) its send lag at --request-rate 2000. Both processes share this
# machine's cores, so the figures are a floor for the client alone.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p sparrow
BIN=target/release/sparrow
PORT=${PORT:-30123}
TOK=crates/bench/tests/fixtures/words.tokenizer.json
OUT=$(mktemp -d)
"$BIN" mock-server --listen "127.0.0.1:$PORT" 2>/dev/null &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; rm -rf "$OUT"' EXIT
for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
common=(--backend sglang-oai --host 127.0.0.1 --port "$PORT" --tokenizer "$TOK" --dataset-name random-ids
        --random-range-ratio 1 --random-input-len 16 --disable-tqdm --health-interval 0)
echo "== (a) streamed tokens/s, rate inf, concurrency ${CONC:-256}"
"$BIN" bench "${common[@]}" --num-prompts "${N_A:-2000}" --random-output-len 128 --max-concurrency "${CONC:-256}" \
  --output-file "$OUT/a.jsonl" | grep -E 'Successful|Failed|duration|Output token throughput|Peak output|Concurrency:'
echo "== (b) send lag at --request-rate 2000"
"$BIN" bench "${common[@]}" --num-prompts "${N_B:-6000}" --random-output-len 16 --request-rate 2000 \
  --output-file "$OUT/b.jsonl" | grep -E 'Successful|Failed|duration|Request throughput|Output token throughput'
python3 - "$OUT/b.jsonl" <<'PY'
import json, sys
line = open(sys.argv[1]).read().strip().splitlines()[-1].replace("Infinity", "null")
r = json.loads(line)
print(f"send lag p50 {r['send_lag_ms_p50']:.3f} ms, p99 {r['send_lag_ms_p99']:.3f} ms, max {r['send_lag_ms_max']:.3f} ms")
PY
