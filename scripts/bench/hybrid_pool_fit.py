#!/usr/bin/env python3
"""Does a batch of 32 requests at 4k context fit the pools `sparrow serve` promised at start-up?
(the hybrid-models issue's memory check).

    scripts/bench/hybrid_pool_fit.py --model ~/.cache/sparrow/synth/qwen3.5-0.8b-Q4_K_M.gguf \\
        [--sparrow target/release/sparrow] [--requests 32] [--input 4000] [--output 400]

Starts `sparrow serve` with `--max-running-requests N` and the default `--kv-cache-gb`, prints
its start-up lines (weights, KV pool, state pool), then sends N requests of `--input` random
prompt tokens and `--output` output tokens all at once (`sparrow bench`, ignore_eos). The
output length keeps the first requests decoding while the last ones prefill (on a 2-core
machine each 4000-token prefill takes ~15 s), so all N hold their pages and states together.
Every 2 s it reads `/metrics` (running requests, KV pages in use, retractions) and the
server's resident memory; at the end it prints the peaks beside the promised sizes. The pool
fits when the peak of running requests reaches N with no retraction, and the resident memory
stays under weights + KV pool + state pool.
"""
import argparse
import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path


def metrics(port):
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except Exception:
        return {}
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([\w:]+)(?:\{[^}]*\})?\s+([-\d.e+]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def rss_gb(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--sparrow", default="target/release/sparrow")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--input", type=int, default=4000)
    ap.add_argument("--output", type=int, default=400)
    ap.add_argument("--port", type=int, default=18291)
    ap.add_argument("--out", type=Path, default=Path("/tmp/hybrid-pool-fit"))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    ctx = a.input + a.output + 64
    log = a.out / "server.log"
    srv = subprocess.Popen([a.sparrow, "serve", "--model-path", str(a.model), "--host", "127.0.0.1", "--port",
                            str(a.port), "--max-running-requests", str(a.requests), "--context-length", str(ctx)],
                           stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for _ in range(600):
            if srv.poll() is not None:
                sys.exit(f"sparrow serve exited: {log}")
            if metrics(a.port):
                break
            time.sleep(1)
        head = [l for l in log.read_text().splitlines() if re.match(r"(sparrow serve: model|KV cache|state pool|max_total)", l)]
        print("\n".join(head), flush=True)
        peak = {"running": 0.0, "usage": 0.0, "rss": 0.0}
        done = threading.Event()

        def poll():
            while not done.is_set():
                m = metrics(a.port)
                peak["running"] = max(peak["running"], m.get("sglang:num_running_reqs", 0))
                peak["usage"] = max(peak["usage"], m.get("sglang:token_usage", 0))
                peak["rss"] = max(peak["rss"], rss_gb(srv.pid))
                time.sleep(2)

        t = threading.Thread(target=poll, daemon=True)
        t.start()
        t0 = time.time()
        out = a.out / "bench.jsonl"
        r = subprocess.run([a.sparrow, "bench", "--backend", "vllm", "--base-url", f"http://127.0.0.1:{a.port}",
                            "--model", "m", "--tokenizer", str(a.model), "--dataset-name", "random",
                            "--random-input-len", str(a.input), "--random-output-len", str(a.output),
                            "--random-range-ratio", "1.0", "--num-prompts", str(a.requests), "--request-rate", "inf",
                            "--max-concurrency", str(a.requests), "--warmup-requests", "0", "--disable-tqdm",
                            # The last requests wait minutes for their turn to prefill.
                            "--read-timeout", "3600",
                            "--output-file", str(out)], stdout=open(a.out / "bench.txt", "w"), stderr=subprocess.STDOUT)
        done.set()
        t.join()
        m = metrics(a.port)
        d = json.loads(out.read_text().strip().splitlines()[-1].replace("Infinity", "1e309")) if out.exists() else {}
        print(f"bench exit {r.returncode}, {d.get('completed', 0)} of {a.requests} completed in {time.time() - t0:.0f} s")
        print(f"peak running requests {peak['running']:.0f} of {a.requests}; peak KV pages in use "
              f"{100 * peak['usage']:.1f} %; retractions {m.get('sparrow:num_retractions_total', float('nan')):.0f}; "
              f"peak resident memory {peak['rss']:.2f} GB")
    finally:
        if srv.poll() is None:
            srv.send_signal(signal.SIGTERM)
            try:
                srv.wait(30)
            except subprocess.TimeoutExpired:
                srv.kill()


if __name__ == "__main__":
    main()
