#!/usr/bin/env python3
"""Writes a sample trace in the Mooncake trace format (kvcache-ai/Mooncake, FAST'25 release:
one JSON object per line, `timestamp` in ms, `input_length`, `output_length`, `hash_ids`, one
hash id per 512-token block of the prompt), for `sparrow bench --dataset-name mooncake`.

Sessions arrive as a Poisson process. Each one continues a "document" drawn from a small pool
(Zipf-like: the first documents are drawn most), so its leading hash ids are that document's
first blocks, shared with every other session on it, followed by blocks of its own: a server
with a prefix (radix) cache sees hits where the hash ids agree, as in the public traces.

    scripts/bench/mooncake_sample.py --sessions 24 --rate 8 --seed 1 > trace.jsonl

The committed test sample, crates/bench/tests/fixtures/mooncake_sample.jsonl, is this script's
output for `--sessions 16 --rate 10 --seed 7 --documents 3 --max-blocks 4 --output-length 8`.
"""
import argparse
import json
import random
import sys

BLOCK = 512


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=24)
    p.add_argument("--rate", type=float, default=8.0, help="sessions per second (Poisson)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--documents", type=int, default=4, help="shared prefixes to draw from")
    p.add_argument("--max-blocks", type=int, default=6, help="most hash ids per session")
    p.add_argument("--output-length", type=int, default=32)
    a = p.parse_args()
    rng = random.Random(a.seed)
    # Document d owns hash ids d*1000 .. d*1000+max_blocks-1; unique blocks count from 10**6.
    next_unique = 10**6
    t_ms = 0.0
    for i in range(a.sessions):
        if i > 0:
            t_ms += rng.expovariate(a.rate) * 1000.0
        weights = [1.0 / (d + 1) for d in range(a.documents)]
        doc = rng.choices(range(a.documents), weights)[0]
        shared = rng.randint(1, max(1, a.max_blocks - 1))
        own = rng.randint(0, a.max_blocks - shared)
        hash_ids = [doc * 1000 + b for b in range(shared)] + list(range(next_unique, next_unique + own))
        next_unique += own
        # The last block is partly filled, as in the public traces.
        input_length = (len(hash_ids) - 1) * BLOCK + rng.randint(1, BLOCK)
        rec = {"timestamp": int(round(t_ms)), "input_length": input_length,
               "output_length": a.output_length, "hash_ids": hash_ids}
        sys.stdout.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
