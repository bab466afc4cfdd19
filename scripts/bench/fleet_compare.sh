#!/usr/bin/env bash
# One worker with all the cores against N workers with a share each behind sglang-router,
# on the same workloads, alternating within each round (the machine is shared and noisy).
#
#   scripts/bench/fleet_compare.sh [OUT_DIR]   # ROUNDS=2 N=2 POLICY=cache_aware WORKLOADS="random shared"
#
# Workloads (both through `sparrow bench --backend sglang`, seed fixed):
#   random: 48 prompts of 256 tokens, 64 output tokens, --max-concurrency 16;
#   shared: generated-shared-prefix, 16 groups x 4 prompts, 256-token system prompt,
#           32-token question, 32 output tokens, --max-concurrency 8.
# Every run starts fresh servers, so each radix cache starts empty. Prints one row per run:
# output tok/s, request throughput, median TTFT and the fleet's radix hit rate (cached prompt
# tokens over prompt tokens, summed over the workers' /metrics). Files go to OUT_DIR.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-/tmp/sparrow-fleet-compare}
ROUNDS=${ROUNDS:-2}
N=${N:-2}
POLICY=${POLICY:-cache_aware}
read -ra WORKLOADS <<<"${WORKLOADS:-random shared}"
SPARROW=${SPARROW:-$ROOT/target/release/sparrow}
export SPARROW
mkdir -p "$OUT"
[[ -x "$SPARROW" ]] || (cd "$ROOT" && cargo build --release -p sparrow)
cores=$(nproc)
SERVE=(--disable-autotune --max-running-requests 32)
PORT=${PORT:-31000}

workload() { # name -> bench flags
    case $1 in
    random) echo --dataset-name random --random-input-len 256 --random-output-len 64 --random-range-ratio 1 \
        --num-prompts 48 --max-concurrency 16 ;;
    shared) echo --dataset-name generated-shared-prefix --gsp-num-groups 16 --gsp-prompts-per-group 4 \
        --gsp-system-prompt-len 256 --gsp-question-len 32 --gsp-output-len 32 --max-concurrency 8 ;;
    *) echo "unknown workload $1 (random, shared)" >&2; exit 2 ;;
    esac
}

# Sums sglang:prompt_tokens_total and sglang:cached_tokens_total over the given ports.
hit_rate() {
    python3 - "$@" <<'EOF'
import sys, urllib.request
p = c = 0.0
for port in sys.argv[1:]:
    for line in urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode().splitlines():
        if line.startswith("sglang:prompt_tokens_total "): p += float(line.split()[1])
        if line.startswith("sglang:cached_tokens_total "): c += float(line.split()[1])
print(f"{c / p:.3f}" if p else "nan")
EOF
}

row() { # label file hit
    python3 - "$1" "$2" "$3" <<'EOF'
import json, sys
label, path, hit = sys.argv[1:]
r = json.loads(open(path).read().splitlines()[-1])
print(f"{label:<28} out {r['output_throughput']:8.1f} tok/s  req {r['request_throughput']:6.2f}/s  "
      f"median TTFT {r['median_ttft_ms'] or float('nan'):8.0f} ms  failed {r['failed']}  hit {hit}")
EOF
}

wait_ready() { # url pid
    for _ in $(seq 600); do
        curl -sf -o /dev/null --max-time 2 "$1/health" && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.5
    done
    return 1
}

pid=""
fpid=""
cleanup() {
    [[ -n "$pid" ]] && kill "$pid" 2>/dev/null
    [[ -n "$fpid" ]] && kill -TERM "$fpid" 2>/dev/null
    wait 2>/dev/null || true
}
trap cleanup EXIT
for w in "${WORKLOADS[@]}"; do workload "$w" >/dev/null || exit 2; done

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $cores cores" | tee "$OUT/summary.txt"
for ((r = 1; r <= ROUNDS; r++)); do
    for w in "${WORKLOADS[@]}"; do
        read -ra FLAGS <<<"$(workload $w)"
        # A: one worker, every core.
        "$SPARROW" serve --host 127.0.0.1 --port "$PORT" --threads "$cores" "${SERVE[@]}" >"$OUT/one_${w}_r$r.log" 2>&1 &
        pid=$!
        wait_ready "http://127.0.0.1:$PORT" "$pid"
        "$SPARROW" bench --base-url "http://127.0.0.1:$PORT" --backend sglang "${FLAGS[@]}" --strict-json \
            --max-failure-rate 1 --disable-tqdm --output-file "$OUT/one_${w}_r$r.jsonl" >/dev/null
        hit=$(hit_rate "$PORT")
        kill "$pid"
        wait "$pid" 2>/dev/null || true
        pid=""
        row "r$r $w 1x${cores}t" "$OUT/one_${w}_r$r.jsonl" "$hit" | tee -a "$OUT/summary.txt"

        # B: N workers behind the router.
        dir="$OUT/fleet_${w}_r$r"
        rm -rf "$dir"
        FLEET_DIR="$dir" WORKER_BASE_PORT=$((PORT + 1)) ROUTER_PORT="$PORT" \
            "$ROOT/scripts/ops/fleet.sh" "$N" "${SERVE[@]}" -- --policy "$POLICY" --log-level warn \
            >"$dir.out" 2>&1 &
        fpid=$!
        until grep -qs READY=1 "$dir/fleet.env"; do
            kill -0 "$fpid" 2>/dev/null || { cat "$dir.out"; exit 1; }
            sleep 0.5
        done
        "$SPARROW" bench --base-url "http://127.0.0.1:$PORT" --backend sglang "${FLAGS[@]}" --strict-json \
            --max-failure-rate 1 --disable-tqdm --output-file "$OUT/fleet_${w}_r$r.jsonl" >/dev/null
        ports=()
        for ((i = 0; i < N; i++)); do ports+=($((PORT + 1 + i))); done
        hit=$(hit_rate "${ports[@]}")
        kill -TERM "$fpid"
        wait "$fpid" 2>/dev/null || true
        fpid=""
        row "r$r $w ${N}x$((cores / N))t $POLICY" "$OUT/fleet_${w}_r$r.jsonl" "$hit" | tee -a "$OUT/summary.txt"
    done
done
