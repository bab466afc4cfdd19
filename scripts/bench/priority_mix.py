#!/usr/bin/env python3
"""Priority scheduling under saturation, side by side.

Two `sparrow serve` instances of the same model and a small KV pool run at once, one with
`--enable-priority-scheduling --schedule-low-priority-values-first` and one without (where the
`priority` field is ignored); runs alternate between them, one at a time. A run sends
`--requests` streamed greedy completions from `--concurrency` client threads; every eighth has
`priority: 0`, the others `priority: 20`. Reported per server: the median TTFT of each class,
their ratio, and whether every text equals the other server's for the same prompt (a
preempted request recomputes exactly).

    python3 scripts/bench/priority_mix.py --on 30031 --off 30032

Standard library only.
"""
import argparse
import http.client
import os
import sys
import json
import queue
import random
import statistics
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from sse_client import stream_completion  # noqa: E402


def run(port, work, concurrency):
    q = queue.Queue()
    for w in work:
        q.put(w)
    out = {}
    def worker():
        while True:
            try:
                i, ids, n, prio = q.get_nowait()
            except queue.Empty:
                return
            out[i] = (prio,) + stream_completion(port, ids, n, prio)
    ts = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def metric(port, name):
    m = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    m.request("GET", "/metrics")
    for line in m.getresponse().read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--on", type=int, required=True, help="port of the server with priority scheduling")
    ap.add_argument("--off", type=int, required=True, help="port of the server without it")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    rnd = random.Random(7)
    work = []
    for i in range(a.requests):
        ids = [rnd.randrange(100, 40000) for _ in range(rnd.randrange(200, 400))]
        work.append((i, ids, 32, 0 if i % 8 == 0 else 20))
    ports = {"on": a.on, "off": a.off}
    res = {k: {"urgent": [], "other": []} for k in ports}
    texts = {}
    for r in range(a.rounds):
        for label in (["on", "off"] if r % 2 == 0 else ["off", "on"]):
            out = run(ports[label], work, a.concurrency)
            for i, (prio, ttft, text) in out.items():
                res[label]["urgent" if prio == 0 else "other"].append(ttft)
                texts.setdefault(label, {})[i] = text
    report = {"outputs_identical": texts["on"] == texts["off"]}
    for label in ports:
        u, o = statistics.median(res[label]["urgent"]), statistics.median(res[label]["other"])
        report[label] = {"ttft_median_priority0_s": round(u, 3), "ttft_median_priority20_s": round(o, 3),
                         "ratio": round(u / o, 3),
                         "preemptions": metric(ports[label], "sparrow:priority_preemptions_total"),
                         "retractions": metric(ports[label], "sparrow:num_retractions_total")}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
