#!/usr/bin/env python3
"""Golden for sparrow bench's printed block (crates/bench/tests/fixtures/report_block.txt).

Computes the metrics of a fixed, hand-written request trace with numpy (np.mean, np.median,
np.std, np.percentile with its default linear method) and prints the result block with the
format strings of SGLang's python/sglang/benchmark/serving.py, plus the lines Sparrow adds
("Failed requests:", the "Failures" section). The trace below must match `fixed_trace()` in
crates/bench/tests/it/report.rs.

Run: python3 scripts/goldens/bench_block_golden.py > crates/bench/tests/fixtures/report_block.txt
"""
import numpy as np

DURATION = 10.0
# (sent, [(chunk time, tokens)], end, prompt_len, failed_cause)
TRACE = [
    (0.0, [(0.5, 1), (0.7, 1), (1.0, 1)], 1.1, 10, None),
    (1.0, [(1.2, 1), (1.6, 2)], 1.6, 20, None),
    (0.5, [], 0.6, 30, "HTTP 500"),
    (2.0, [(2.3, 1)], 2.4, 5, None),
]

ttfts, tpots, itls, e2es = [], [], [], []
total_in = total_out = completed = 0
buckets = {}
events = []
failures = {}
for sent, chunks, end, plen, fail in TRACE:
    if fail:
        failures[fail] = failures.get(fail, 0) + 1
        continue
    completed += 1
    out = sum(n for _, n in chunks)
    total_in += plen
    total_out += out
    ttft = chunks[0][0] - sent
    ttfts.append(ttft)
    e2e = end - sent
    e2es.append(e2e)
    if out > 1:
        tpots.append((e2e - ttft) / (out - 1))
    for (t0, _), (t1, n) in zip(chunks, chunks[1:]):
        itls += [(t1 - t0) / n] * n
    for t, n in chunks:
        buckets[int(t)] = buckets.get(int(t), 0) + n
    events += [(sent, 1), (end, -1)]

live = peak = 0
for _, d in sorted(events):
    live += d
    peak = max(peak, live)

ms = lambda xs: np.array(xs) * 1000.0
line_s = lambda label, v: print("{:<40} {:<10}".format(label, v))
line_f = lambda label, v: print("{:<40} {:<10.2f}".format(label, v))

print("\n{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
line_s("Backend:", "sglang")
line_s("Traffic request rate:", float("inf"))
line_s("Max request concurrency:", "not set")
line_s("Successful requests:", completed)
line_s("Failed requests:", sum(failures.values()))
line_f("Benchmark duration (s):", DURATION)
line_s("Total input tokens:", total_in)
line_s("Total input text tokens:", total_in)
line_s("Total generated tokens:", total_out)
line_s("Total generated tokens (retokenized):", total_out)
line_f("Request throughput (req/s):", completed / DURATION)
line_f("Input token throughput (tok/s):", total_in / DURATION)
line_f("Output token throughput (tok/s):", total_out / DURATION)
line_f("Peak output token throughput (tok/s):", float(max(buckets.values())))
line_s("Peak concurrent requests:", peak)
line_f("Total token throughput (tok/s):", (total_in + total_out) / DURATION)
line_f("Concurrency:", np.sum(e2es) / DURATION)
for title, name, xs, with_max in [
    ("End-to-End Latency", "E2E Latency", e2es, False),
    ("Time to First Token", "TTFT", ttfts, False),
    ("Time per Output Token (excl. 1st token)", "TPOT", tpots, False),
    ("Inter-Token Latency", "ITL", itls, True),
]:
    print("{s:{c}^{n}}".format(s=title, n=50, c="-"))
    line_f(f"Mean {name} (ms):", np.mean(ms(xs)))
    line_f(f"Median {name} (ms):", np.median(ms(xs)))
    for p in (90, 95, 99):
        line_f(f"P{p} {name} (ms):", np.percentile(ms(xs), p))
    if with_max:
        line_f(f"Max {name} (ms):", np.max(ms(xs)))
print("{s:{c}^{n}}".format(s="Failures", n=50, c="-"))
for cause in sorted(failures):
    line_s(f"  {cause}:", failures[cause])
print("=" * 50)
