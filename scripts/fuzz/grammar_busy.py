#!/usr/bin/env python3
"""Is `sparrow serve` responsive while grammars compile?

Starts the release `sparrow serve` (SmolLM2-135M by default), then for --seconds: C clients post
JSON schemas at llguidance's limits (an `enum` of --enum-size strings: ~0.3-0.4 s to compile and
refused with a 400 past the lexer fuel, or compiled below it) back to back, while one prober
sends `GET /health` and a 1-token completion every 100 ms. Prints the probes' latencies
(median, p99, max) idle and under the compile load, and the compile requests' statuses.

    scripts/fuzz/grammar_busy.py [--model-path GGUF] [--clients 4] [--seconds 20]

Standard library only.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def call(url, body=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        e.read()
        status = e.code
    return status, time.perf_counter() - t


def summary(xs):
    if not xs:
        return "none"
    xs = sorted(xs)
    p99 = xs[min(len(xs) - 1, int(0.99 * len(xs)))]
    return f"n={len(xs)} median {statistics.median(xs) * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, max {xs[-1] * 1e3:.1f} ms"


def probe(base, stop, health, small):
    while not stop.is_set():
        health.append(call(base + "/health")[1])
        small.append(call(base + "/v1/completions", {"prompt": "Hi", "max_tokens": 1, "temperature": 0})[1])
        time.sleep(0.1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--enum-size", type=int, default=100_000)
    a = ap.parse_args()
    binary = os.path.join(ROOT, "target", "release", "sparrow")
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "sparrow", "--bin", "sparrow"], cwd=ROOT, check=True)
    port = free_port()
    cmd = [binary, "serve", "--port", str(port), "--disable-autotune"]
    if a.model_path:
        cmd += ["--model-path", a.model_path]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if call(base + "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            sys.exit("server did not start")
        schema = {"enum": [f"v{i}" for i in range(a.enum_size)]}
        body = {"prompt": "x", "max_tokens": 8,
                "response_format": {"type": "json_schema", "json_schema": {"name": "e", "schema": schema}}}
        print(f"cpu: {os.cpu_count()} cores; schema enum of {a.enum_size} ({len(json.dumps(body)) / 1e6:.1f} MB body)")
        idle_h, idle_s = [], []
        stop = threading.Event()
        t = threading.Thread(target=probe, args=(base, stop, idle_h, idle_s))
        t.start()
        time.sleep(min(5.0, a.seconds / 4))
        stop.set()
        t.join()
        busy_h, busy_s, statuses, compile_t = [], [], {}, []
        stop = threading.Event()
        lock = threading.Lock()

        def hammer():
            while not stop.is_set():
                st, dt = call(base + "/v1/completions", body)
                with lock:
                    statuses[st] = statuses.get(st, 0) + 1
                    compile_t.append(dt)

        workers = [threading.Thread(target=hammer) for _ in range(a.clients)]
        for w in workers:
            w.start()
        time.sleep(1.0)
        p = threading.Thread(target=probe, args=(base, stop, busy_h, busy_s))
        p.start()
        time.sleep(a.seconds)
        stop.set()
        p.join()
        for w in workers:
            w.join()
        print(f"idle:  /health {summary(idle_h)}; 1-token completion {summary(idle_s)}")
        print(f"busy:  /health {summary(busy_h)}; 1-token completion {summary(busy_s)}")
        print(f"schema requests: statuses {statuses}; latency {summary(compile_t)}")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
