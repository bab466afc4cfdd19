#!/usr/bin/env bash
# Gemma 3 270M Q4_K_M: llama-server (built by ../shared/peers/setup.sh) and `sparrow serve` on
# the same GGUF, the same client (`sparrow bench`, /v1/completions + SSE, ignore_eos), the same
# prompts (random, same seed per round), servers alternating within each round, ROUNDS rounds.
#
#   scripts/bench/gemma3_side_by_side.sh SPARROW_BIN OUTDIR
# env: ROUNDS (3)  CONCS ("1 16")  ISL OSL (256 128)  THREADS (nproc)
# Writes OUTDIR/summary.tsv: server, round, concurrency, output tok/s, median TPOT and TTFT.
set -uo pipefail
BIN=${1:?sparrow binary}; OUT=${2:?outdir}
ROUNDS=${ROUNDS:-3}; CONCS=${CONCS:-1 16}; ISL=${ISL:-256}; OSL=${OSL:-128}; THREADS=${THREADS:-$(nproc)}
PEERS=${PEERS:-${XDG_CACHE_HOME:-$HOME/.cache}/sparrow-peers}
LLAMA=${LLAMA_SERVER:-$PEERS/build/llama.cpp/bin/llama-server}
[ -x "$LLAMA" ] || { echo "no $LLAMA: run ../shared/peers/setup.sh" >&2; exit 1; }
mkdir -p "$OUT"
# The short name fetches and assembles the file; print its path from the start-up line.
"$BIN" serve --model-path gemma3-270m --host 127.0.0.1 --port 18091 --threads "$THREADS" >"$OUT/sparrow-server.log" 2>&1 &
SPID=$!
trap 'kill $SPID $LPID 2>/dev/null' EXIT
for _ in $(seq 600); do curl -sf http://127.0.0.1:18091/health >/dev/null && break; sleep 0.5; done
MODEL=$(sed -n 's/^sparrow serve: model \([^ ]*\) .*/\1/p' "$OUT/sparrow-server.log" | head -1)
[ -f "$MODEL" ] || { echo "no model path in $OUT/sparrow-server.log" >&2; exit 1; }
"$LLAMA" -m "$MODEL" --alias gemma3 --host 127.0.0.1 --port 18081 -np 16 -c 16384 -t "$THREADS" -tb "$THREADS" \
  --no-webui >"$OUT/llama-server.log" 2>&1 &
LPID=$!
for _ in $(seq 240); do curl -sf http://127.0.0.1:18081/health >/dev/null && break; sleep 0.5; done
printf 'server\tround\tconc\tout_tok_s\ttpot_med_ms\tttft_med_ms\n' >"$OUT/summary.tsv"
for r in $(seq "$ROUNDS"); do
  for c in $CONCS; do
    n=$(( c * 4 )); [ $n -lt 8 ] && n=8
    seed=$(( 1000 * r + c ))
    for s in llama sparrow; do
      port=18081; [ $s = sparrow ] && port=18091
      "$BIN" bench --backend vllm --base-url "http://127.0.0.1:$port" --model gemma3 --tokenizer "$MODEL" \
        --dataset-name random --random-input-len "$ISL" --random-output-len "$OSL" --random-range-ratio 1.0 \
        --num-prompts "$n" --request-rate inf --max-concurrency "$c" --seed "$seed" --disable-tqdm \
        --output-file "$OUT/$s-r$r-c$c.jsonl" >"$OUT/$s-r$r-c$c.txt" 2>&1
      python3 - "$OUT/$s-r$r-c$c.jsonl" "$s" "$r" "$c" >>"$OUT/summary.tsv" <<'PY'
import json, sys
p, s, r, c = sys.argv[1:]
try:
    d = json.loads(open(p).read().strip().splitlines()[-1])
    print(f"{s}\t{r}\t{c}\t{d['output_throughput']:.1f}\t{d['median_tpot_ms']:.2f}\t{d['median_ttft_ms']:.1f}")
except Exception as e:
    print(f"{s}\t{r}\t{c}\tFAILED ({e})")
PY
      tail -1 "$OUT/summary.tsv"
    done
  done
done
