#!/usr/bin/env python3
"""Fair prefill, side by side: short requests arriving while a long prompt prefills.

Two `sparrow serve` instances of the same model run at once, one with fair prefill (the
default) and one with `--disable-fair-prefill`; scenarios alternate between them, one at a
time, so both see the same machine. A scenario sends a 4,000-token prompt (streamed, one
output token), waits one second, then sends 8 short prompts at once (a few tokens, 4 greedy
tokens each, streamed), and records every time to first token. Before the rounds, the long
prompt runs alone (its TTFT over its chunks is "one chunk's time") and each short prompt runs
alone (its greedy text is the reference the scenario's texts must equal). The radix cache is
flushed after every scenario.

    python3 scripts/bench/fair_prefill.py --fair 30001 --unfair 30002 --rounds 3

Prints one JSON object (per label: median and max short TTFT, long TTFT, texts equal alone).
Standard library only.
"""
import argparse
import json
import statistics
import threading
import time
import http.client
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from sse_client import stream_completion  # noqa: E402


def flush(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/flush_cache", "")
    c.getresponse().read()
    c.close()


def scenario(port, long_ids, shorts, gap):
    out = {}
    def long_run():
        out["long"] = stream_completion(port, long_ids, 1)[0]
    t = threading.Thread(target=long_run)
    t.start()
    time.sleep(gap)
    res = [None] * len(shorts)
    def short_run(i):
        res[i] = stream_completion(port, shorts[i], 4)
    ts = [threading.Thread(target=short_run, args=(i,)) for i in range(len(shorts))]
    for x in ts:
        x.start()
    for x in ts + [t]:
        x.join()
    flush(port)
    return out["long"], res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fair", type=int, required=True, help="port of the server with fair prefill")
    ap.add_argument("--unfair", type=int, required=True, help="port of the server with --disable-fair-prefill")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--long-tokens", type=int, default=4000)
    ap.add_argument("--chunk", type=int, default=512, help="the servers' --chunked-prefill-size")
    ap.add_argument("--gap", type=float, default=1.0, help="seconds between the long prompt and the short ones")
    a = ap.parse_args()
    long_ids = [100 + (i * 7919) % 40000 for i in range(a.long_tokens)]
    shorts = [[200 + 17 * i + j for j in range(5)] for i in range(8)]
    ports = {"fair": a.fair, "unfair": a.unfair}
    alone = {}
    for label, port in ports.items():
        ttft, _ = stream_completion(port, long_ids, 1)
        flush(port)
        alone[label] = {"long_ttft_s": ttft, "texts": [stream_completion(port, s, 4)[1] for s in shorts]}
        flush(port)
    runs = {k: {"long": [], "short": [], "texts_equal": True} for k in ports}
    for r in range(a.rounds):
        order = list(ports.items()) if r % 2 == 0 else list(reversed(ports.items()))
        for label, port in order:
            long_ttft, res = scenario(port, long_ids, shorts, a.gap)
            runs[label]["long"].append(long_ttft)
            runs[label]["short"].extend(t for t, _ in res)
            runs[label]["texts_equal"] &= [x for _, x in res] == alone[label]["texts"]
    chunks = -(-a.long_tokens // a.chunk)
    report = {}
    for label in ports:
        x = runs[label]
        chunk_s = alone[label]["long_ttft_s"] / chunks
        report[label] = {
            "one_chunk_s": round(chunk_s, 3),
            "long_alone_ttft_s": round(alone[label]["long_ttft_s"], 3),
            "long_ttft_median_s": round(statistics.median(x["long"]), 3),
            "short_ttft_median_s": round(statistics.median(x["short"]), 3),
            "short_ttft_max_s": round(max(x["short"]), 3),
            "short_ttft_max_over_chunk": round(max(x["short"]) / chunk_s, 2),
            "short_texts_equal_alone": x["texts_equal"],
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
