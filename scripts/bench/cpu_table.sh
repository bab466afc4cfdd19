#!/usr/bin/env bash
# Issue 12's table, kept: this machine's limits (`sparrow roofline`), then llama-server against
# `sparrow serve` on SmolLM2-135M Q4_1 at concurrency 1, 16, 64 and 256 with SGLang's
# bench_serving client, same prompts, interleaved per concurrency (../shared/peers/side_by_side.sh,
# which also reports the cores each server used), and the ratio table.
#
#   scripts/bench/cpu_table.sh [OUTDIR] [CONCS]
# env: SPARROW_ARGS (extra `sparrow serve` flags), and side_by_side.sh's ISL OSL RR LLAMA_NP.
# Needs ../shared/peers/setup.sh to have run once (llama-server and the client).
# The peers' scripts are read from ../shared/peers beside the repo (PEERS_DIR overrides it).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-/tmp/sparrow_cpu_table}; CONCS=${2:-1 16 64 256}
PEERS_DIR=${PEERS_DIR:-../shared/peers}
mkdir -p "$OUT"
cargo build --release -q -p sparrow
BIN=$PWD/target/release/sparrow
grep -o -w 'avx512_vnni\|avx_vnni\|avx512f\|avx2\|fma\|f16c' /proc/cpuinfo | sort -u | tr '\n' ' ' >"$OUT/isa.txt"
"$BIN" roofline --tokens 1,16,64 | tee "$OUT/roofline.txt"
bash "$PEERS_DIR/side_by_side.sh" "$BIN" "$OUT" "$CONCS" | tee "$OUT/side_by_side.txt"
python3 - "$OUT" <<'PY'
import csv, re, sys
out = sys.argv[1]
rows = list(csv.DictReader(open(f"{out}/summary.tsv"), delimiter="\t"))
by = {(r["server"], r["conc"]): r for r in rows}
def cpu(server, conc):
    # cpumon averages over the client's whole wall time, Python start-up and dataset
    # preparation included, when the server idles; the cores a server used while serving are its
    # CPU seconds over the benchmark's own duration (first request sent to last answer).
    try:
        text = open(f"{out}/{server}-c{conc}.txt").read()
        dur = float(by[(server, conc)]["dur_s"])
    except (OSError, KeyError, ValueError):
        return "?"
    m = re.search(r"wall=([0-9.]+)s.*server=([0-9.]+)", text)
    return f"{float(m.group(1)) * float(m.group(2)) / dur:.2f}" if m and dur > 0 else "?"
print("\n| concurrency | llama-server output tok/s | sparrow output tok/s | ratio | sparrow TPOT median ms | sparrow cores while serving | llama cores while serving |")
print("|---|---|---|---|---|---|---|")
for c in sorted({r["conc"] for r in rows}, key=int):
    l, s = by.get(("llama", c)), by.get(("sparrow", c))
    if not l or not s or "out_tok_s" not in s or not s.get("out_tok_s"):
        print(f"| {c} | failed |"); continue
    lo, so = float(l["out_tok_s"]), float(s["out_tok_s"])
    print(f"| {c} | {lo:.1f} | {so:.1f} | {so / lo:.2f}x | {s['tpot_med']} | {cpu('sparrow', c)} | {cpu('llama', c)} |")
print(f"\nISA flags: {open(f'{out}/isa.txt').read().strip()}")
PY
