#!/usr/bin/env python3
"""The same GGUF on `sparrow serve` and llama-server, side by side in one interleaved run.

    scripts/bench/real_side_by_side.py --model ~/.cache/sparrow/synth/llama-3.2-1b-Q4_K_M.gguf \\
        --sparrow target/release/sparrow --out /tmp/sbs-1b [--concs 1,4,16,64] [--prefills 512,4000]

Needs the peers: run ../shared/peers/setup.sh once (it builds llama-server into $PEERS, default
~/.cache/sparrow-peers); make the GGUF with scripts/bench/synth_gguf.py.

Both servers run on every core (`--threads`/`-t -tb` = nproc) and stay up for the whole run;
each measurement runs one server while the other idles, the two alternating within a round
(rounds: `--rounds`, default 2), with the same client (`sparrow bench`, `/v1/completions` +
SSE, ignore_eos) and the same prompts (random token ids, fixed lengths: `--random-range-ratio
1`; the seed changes per round and concurrency, so no prompt cache on either side holds them):

- one row per concurrency of `--concs`: random 256 in / 128 out (`--isl`, `--osl`), `max(2c, 4)`
  prompts at `--max-concurrency c`: output tok/s, median TTFT and TPOT;
- one row per length of `--prefills`: two requests one after the other, each of that many
  prompt tokens and one output token: median TTFT, and prefill tok/s = length / TTFT.

No warm-up requests (`--warmup-requests 0`): a warm-up would send, and so cache, the first
prompt before the clock starts.

Cores used: each server's CPU seconds (`/proc/PID/stat`) over the measurement's wall time.
Output: `OUT/summary.tsv` (every measurement), and a printed table of medians over the rounds
with the ratio sparrow / llama-server, the cores each used, the CPU model and ISA flags, and
the kernel path sparrow printed at start-up.

llama-server: `--llama-server` (default the peers build, `$PEERS/build/llama.cpp/bin`), with
`--llama-args` added (default none). ik_llama.cpp's llama-server joins the rotation as a third
server when `--ik-server` names it (default: the peers build `$PEERS/build/ik_llama.cpp/bin`
when it exists; `--ik-server none` leaves it out), with `--ik-args`; the table then has its
column and the ratio sparrow / ik_llama.cpp beside llama-server's. ik_llama.cpp gets `-c` × slots
(it has no unified KV cache), and a peer that crashed is started again before the next
measurement (its row reads FAILED); the client's health probes are off, since ik_llama.cpp's
`/health` does not answer while a batch runs. On a CPU with AMX the peers build's AMX matmul segfaults
on K-quant files (llama.cpp at the vendored commit; seen on this project's machines), so when
llama-server does not come up the run retries it once with `--no-repack` and says so.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PEERS = Path(os.environ.get("PEERS", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sparrow-peers"))


def cpu_seconds(pid):
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def healthy(port, proc, timeout):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            return False
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
            return True
        except Exception:
            time.sleep(1)
    return False


def start(cmd, log, port, timeout=900, cwd=None):
    p = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd)
    return p, healthy(port, p, timeout)


def stop(p):
    if p and p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def bench(a, port, pid, tag, isl, osl, n, conc, seed):
    out = a.out / f"{tag}.jsonl"
    cmd = [a.sparrow, "bench", "--backend", "vllm", "--base-url", f"http://127.0.0.1:{port}", "--model", "m",
           "--tokenizer", str(a.model), "--dataset-name", "random", "--random-input-len", str(isl),
           "--random-output-len", str(osl), "--random-range-ratio", "1.0", "--num-prompts", str(n),
           "--request-rate", "inf", "--max-concurrency", str(conc), "--seed", str(seed), "--disable-tqdm",
           # No warm-up request: it would send (and so cache) the first prompt before the clock.
           "--warmup-requests", "0",
           # No health probes: ik_llama.cpp's /health does not answer while a batch runs, and a
           # probe left unanswered would end the run as "server down".
           "--health-interval", "0",
           "--output-file", str(out)]
    c0, t0 = cpu_seconds(pid), time.time()
    r = subprocess.run(cmd, stdout=open(a.out / f"{tag}.txt", "w"), stderr=subprocess.STDOUT)
    wall, cpu = time.time() - t0, cpu_seconds(pid) - c0
    try:
        d = json.loads(out.read_text().strip().splitlines()[-1].replace("Infinity", "1e309"))
    except Exception:
        return None
    if r.returncode != 0 or d.get("completed", 0) < n:
        return None
    return {"out_tok_s": d["output_throughput"], "ttft_ms": d["median_ttft_ms"], "tpot_ms": d["median_tpot_ms"],
            "dur_s": d["duration"], "cores": cpu / wall}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--sparrow", default="target/release/sparrow")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--concs", default="1,4,16,64")
    ap.add_argument("--prefills", default="512,4000")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--isl", type=int, default=256)
    ap.add_argument("--osl", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--llama-server", default=str(PEERS / "build/llama.cpp/bin/llama-server"))
    ap.add_argument("--llama-args", default="")
    ik_default = PEERS / "build/ik_llama.cpp/bin/llama-server"
    ap.add_argument("--ik-server", default=str(ik_default) if ik_default.exists() else "none")
    ap.add_argument("--ik-args", default="")
    ap.add_argument("--sparrow-args", default="")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    concs = [int(c) for c in a.concs.split(",") if c]
    prefills = [int(p) for p in a.prefills.split(",") if p]
    slots = max(concs + [1])
    ctx = max(slots * (a.isl + a.osl + 64), max(prefills + [0]) + 64)
    sp, lp = 18191, 18181
    sparrow_cmd = [a.sparrow, "serve", "--model-path", str(a.model), "--host", "127.0.0.1", "--port", str(sp),
                   "--threads", str(a.threads), "--max-running-requests", str(max(slots, 8)), "--context-length",
                   str(max(ctx, 8192))] + a.sparrow_args.split()
    llama_cmd = [a.llama_server, "-m", str(a.model), "--host", "127.0.0.1", "--port", str(lp), "-np", str(slots), "-c",
                 str(ctx), "--kv-unified", "-t", str(a.threads), "-tb", str(a.threads), "--no-webui"] + a.llama_args.split()
    S, ok = start(sparrow_cmd, a.out / "sparrow-server.log", sp)
    if not ok:
        sys.exit(f"sparrow serve did not come up: {a.out / 'sparrow-server.log'}")
    L, ok = start(llama_cmd, a.out / "llama-server.log", lp)
    note = ""
    if not ok:
        stop(L)
        llama_cmd.append("--no-repack")
        note = "llama-server crashed at start-up (its AMX matmul); retried with --no-repack"
        print(note, flush=True)
        L, ok = start(llama_cmd, a.out / "llama-server.log", lp)
        if not ok:
            stop(S)
            sys.exit(f"llama-server did not come up: {a.out / 'llama-server.log'}")
    ik_port, I, ik_cmd = 18171, None, None
    if a.ik_server != "none":
        # ik_llama.cpp has no unified KV cache: `-c` is split over the slots, so each gets `ctx`.
        # Run from the output folder: ik_llama.cpp writes a `llama.log` where it starts.
        ik_cmd = [a.ik_server, "-m", str(a.model.resolve()), "--host", "127.0.0.1", "--port", str(ik_port), "-np", str(slots),
                  "-c", str(ctx * slots), "-t", str(a.threads), "-tb", str(a.threads)] + a.ik_args.split()
        I, ok = start(ik_cmd, a.out / "ik-server.log", ik_port, cwd=a.out)
        if not ok:
            stop(S)
            stop(L)
            stop(I)
            sys.exit(f"ik_llama.cpp's llama-server did not come up: {a.out / 'ik-server.log'}")
    try:
        head = (a.out / "sparrow-server.log").read_text()
        kernels = re.search(r"kernels ([\w-]+)", head)
        tsv = open(a.out / "summary.tsv", "w")
        tsv.write("round\tkind\tsize\tserver\tout_tok_s\tttft_ms\ttpot_ms\tprefill_tok_s\tcores\n")
        results = {}
        seed = int(time.time()) % 100000
        for rnd in range(a.rounds):
            plan = [("conc", c) for c in concs] + [("prefill", p) for p in prefills]
            for kind, size in plan:
                seed += 1
                # Alternate which server goes first, so drift hits both alike.
                # A peer that crashed (ik_llama.cpp aborts on some batches) is started again,
                # so one failure costs one row, not the rest of the run.
                if I and I.poll() is not None:
                    print(f"ik_llama.cpp's llama-server exited ({I.returncode}); restarting it", flush=True)
                    I, _ = start(ik_cmd, a.out / f"ik-server-{kind}{size}.log", ik_port, cwd=a.out)
                if L.poll() is not None:
                    print(f"llama-server exited ({L.returncode}); restarting it", flush=True)
                    L, _ = start(llama_cmd, a.out / f"llama-server-{kind}{size}.log", lp)
                order = [("llama", lp, L.pid), ("sparrow", sp, S.pid)] + ([("ik", ik_port, I.pid)] if I else [])
                if rnd % 2:
                    order.reverse()
                for name, port, pid in order:
                    if kind == "conc":
                        r = bench(a, port, pid, f"{name}-r{rnd}-c{size}", a.isl, a.osl, max(2 * size, 4), size, seed)
                    else:
                        r = bench(a, port, pid, f"{name}-r{rnd}-p{size}", size, 1, 2, 1, seed)
                        if r:
                            r["prefill_tok_s"] = size / (r["ttft_ms"] / 1e3)
                    results.setdefault((kind, size, name), []).append(r)
                    line = [rnd, kind, size, name] + (["FAILED"] if r is None else
                            [f"{r['out_tok_s']:.2f}", f"{r['ttft_ms']:.1f}", f"{r['tpot_ms']:.2f}",
                             f"{r.get('prefill_tok_s', 0):.1f}", f"{r['cores']:.2f}"])
                    tsv.write("\t".join(map(str, line)) + "\n")
                    tsv.flush()
                    print("\t".join(map(str, line)), flush=True)
    finally:
        stop(S)
        stop(L)
        stop(I)
    flags = sorted(set(open("/proc/cpuinfo").read().split()) & {"avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "amx_tile"})
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"\nmodel {a.model.name}; CPU {cpu}, {a.threads} threads each; flags {' '.join(flags)}; "
          f"sparrow kernels {kernels.group(1) if kernels else '?'}; llama-server flags added: "
          f"{' '.join(a.llama_args.split() + (['--no-repack'] if note else [])) or 'none'}")
    if note:
        print(note)
    if I:
        print(f"ik_llama.cpp: {a.ik_server} {a.ik_args}".rstrip())
        print("| measurement | llama-server | ik_llama.cpp | sparrow | ratio vs llama-server | ratio vs ik_llama.cpp | "
              "cores llama / ik / sparrow |")
        print("|---|---|---|---|---|---|---|")
    else:
        print("| measurement | llama-server | sparrow | ratio | cores llama / sparrow |")
        print("|---|---|---|---|---|")
    med = lambda xs, k: statistics.median([x[k] for x in xs if x]) if any(xs) else float("nan")
    for kind, size in [("conc", c) for c in concs] + [("prefill", p) for p in prefills]:
        lr, sr = results.get((kind, size, "llama"), []), results.get((kind, size, "sparrow"), [])
        key, unit = ("out_tok_s", "output tok/s") if kind == "conc" else ("prefill_tok_s", "prefill tok/s")
        lv, sv = med(lr, key), med(sr, key)
        label = f"c={size}, {a.isl} in / {a.osl} out" if kind == "conc" else f"prefill {size} tokens"
        if I:
            ir = results.get((kind, size, "ik"), [])
            iv = med(ir, key)
            print(f"| {label} ({unit}) | {lv:.2f} | {iv:.2f} | {sv:.2f} | {sv / lv:.2f}x | {sv / iv:.2f}x | "
                  f"{med(lr, 'cores'):.2f} / {med(ir, 'cores'):.2f} / {med(sr, 'cores'):.2f} |")
        else:
            print(f"| {label} ({unit}) | {lv:.2f} | {sv:.2f} | {sv / lv:.2f}x | {med(lr, 'cores'):.2f} / {med(sr, 'cores'):.2f} |")


if __name__ == "__main__":
    main()
