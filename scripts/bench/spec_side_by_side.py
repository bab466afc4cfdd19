#!/usr/bin/env python3
"""Speculative decoding against plain decoding: the same model on two `sparrow serve`s, one
with the speculative flags, side by side in one interleaved run.

    scripts/bench/spec_side_by_side.py --model SmolLM2-135M-Instruct.Q4_1.gguf \\
        --sparrow target/release/sparrow --out /tmp/spec-smollm2 \\
        [--spec "--speculative-algorithm NGRAM"] [--workloads edit,sharegpt] [--concs 1] \\
        [--num-prompts 20] [--rounds 2]

Both servers run on every core and stay up for the whole run; each measurement runs one while
the other idles, the two alternating within a round (the order flips every round), with the
same client (`sparrow bench`, `/v1/chat/completions` + SSE, greedy, `--flush-cache` before
each run so both pay the same prefills):

- `edit`: code-editing requests (the prompt holds a file, the answer rewrites it with a small
  change), built from this repository's own Rust sources: a ~`--edit-chars` slice at line
  boundaries and an instruction to rename one identifier that occurs in it, answer up to
  `--edit-output-len` tokens, stopping at EOS (`openai` dataset written to `OUT/edit.jsonl`);
- `sharegpt`: the ShareGPT dataset's first turns with its own output lengths (ignore_eos), the
  case where copying rarely pays.

Per workload and concurrency: output tok/s, median TPOT and TTFT of both, their ratio, the
accept length the speculating server reports (its `internal_states` counters from
`/get_server_info`, read after each run as the difference of its counters over the run: 1 + accepted / verify
steps) and how many of the generated texts are byte-identical between the two
(greedy: all of them must be). Output: `OUT/summary.tsv` and a printed table of medians over
the rounds, with the CPU model and the kernel path each server printed.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_side_by_side import healthy  # noqa: E402


def edit_dataset(path, n, chars, out_len):
    """`n` code-editing chat requests from the repository's Rust sources (deterministic)."""
    files = sorted(p for p in (ROOT / "crates").rglob("*.rs") if "/tests/" not in str(p))
    reqs = []
    i = 0
    while len(reqs) < n and i < 10 * n:
        f = files[(i * 7919) % len(files)]
        i += 1
        lines = f.read_text().splitlines(keepends=True)
        start = (i * 131) % max(1, len(lines) - 10)
        chunk = ""
        for line in lines[start:]:
            if len(chunk) + len(line) > chars:
                break
            chunk += line
        words = re.findall(r"\b[a-z_][a-z0-9_]{3,}\b", chunk)
        counts = {w: words.count(w) for w in set(words) if w not in {"self", "fn", "let", "pub", "use", "impl", "match", "return"}}
        cands = sorted((w for w, c in counts.items() if c >= 2), key=lambda w: (-counts[w], w))
        if len(chunk) < chars // 2 or not cands:
            continue
        old = cands[0]
        prompt = (
            f"Rename `{old}` to `{old}_v2` everywhere in the following Rust code. "
            f"Output the complete updated code and nothing else.\n\n```rust\n{chunk}```\n"
        )
        reqs.append({"messages": [{"role": "user", "content": prompt}], "max_tokens": out_len, "temperature": 0})
    with open(path, "w") as fh:
        for r in reqs:
            fh.write(json.dumps(r) + "\n")
    return len(reqs)


def bench(args, port, workload, conc, n, out_file, edit_path):
    cmd = [
        args.sparrow, "bench", "--backend", "sglang-oai-chat", "--base-url", f"http://127.0.0.1:{port}",
        "--num-prompts", str(n), "--max-concurrency", str(conc), "--request-rate", "inf",
        "--warmup-requests", "0", "--flush-cache", "--output-details", "--output-file", str(out_file),
        "--seed", "42", "--disable-tqdm",
    ]
    if workload == "edit":
        cmd += ["--dataset-name", "openai", "--dataset-path", str(edit_path), "--disable-ignore-eos"]
    else:
        cmd += ["--dataset-name", "sharegpt"]
        if args.sharegpt_output_len:
            cmd += ["--sharegpt-output-len", str(args.sharegpt_output_len)]
    if out_file.exists():
        out_file.unlink()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench failed ({' '.join(cmd)}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return json.loads(out_file.read_text().strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--sparrow", default=str(ROOT / "target/release/sparrow"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--spec", default="--speculative-algorithm NGRAM", help="flags of the speculating server")
    ap.add_argument("--serve-args", default="", help="flags of both servers")
    ap.add_argument("--workloads", default="edit,sharegpt")
    ap.add_argument("--concs", default="1")
    ap.add_argument("--num-prompts", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--edit-chars", type=int, default=1600)
    ap.add_argument("--edit-output-len", type=int, default=512)
    ap.add_argument("--sharegpt-output-len", type=int, help="fixed output length of the ShareGPT requests (default: the dataset's)")
    ap.add_argument("--ports", default="30111,30112")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    edit_path = args.out / "edit.jsonl"
    n_edit = edit_dataset(edit_path, args.num_prompts, args.edit_chars, args.edit_output_len)
    threads = str(os.cpu_count())
    ports = [int(p) for p in args.ports.split(",")]
    names = ["plain", "spec"]
    extra = [args.serve_args.split(), args.serve_args.split() + args.spec.split()]
    procs, lines = [], {}
    try:
        for name, port, ex in zip(names, ports, extra):
            log = open(args.out / f"{name}.log", "w")
            p = subprocess.Popen([args.sparrow, "serve", "--model-path", args.model, "--port", str(port), "--threads", threads] + ex,
                                 stdout=log, stderr=subprocess.STDOUT)
            procs.append(p)
            if not healthy(port, p, 600):
                sys.exit(f"{name} server did not come up; see {args.out / (name + '.log')}")
            lines[name] = [l for l in (args.out / f"{name}.log").read_text().splitlines() if "kernels" in l or "speculative" in l]
        rows = []
        last = (0, 0)  # the speculating server's (verify steps, accepted tokens) so far
        tsv = open(args.out / "summary.tsv", "w")
        tsv.write("round\tworkload\tconc\tserver\toutput_tok_s\tmedian_tpot_ms\tmedian_ttft_ms\taccept_length\tcompleted\n")
        for rnd in range(args.rounds):
            for w in args.workloads.split(","):
                for conc in [int(c) for c in args.concs.split(",")]:
                    order = [0, 1] if rnd % 2 == 0 else [1, 0]
                    res = {}
                    for k in order:
                        n = n_edit if w == "edit" else args.num_prompts
                        res[names[k]] = bench(args, ports[k], w, conc, n, args.out / f"{w}-c{conc}-{names[k]}-r{rnd}.jsonl", edit_path)
                    a, b = res["plain"], res["spec"]
                    st = ((b.get("server_info") or {}).get("internal_states") or [{}])[0]
                    now = (st.get("spec_verify_ct_total", 0), st.get("spec_accepted_tokens_total", 0))
                    dv, da = now[0] - last[0], now[1] - last[1]
                    last = now
                    b["accept_length"] = round(1 + da / dv, 3) if dv > 0 else None
                    same = sum(x == y for x, y in zip(a.get("generated_texts", []), b.get("generated_texts", [])))
                    row = dict(round=rnd, workload=w, conc=conc, plain=a["output_throughput"], spec=b["output_throughput"],
                               tpot_plain=a["median_tpot_ms"], tpot_spec=b["median_tpot_ms"], ttft_plain=a["median_ttft_ms"],
                               ttft_spec=b["median_ttft_ms"], accept=b.get("accept_length"), same=same,
                               total=len(a.get("generated_texts", [])))
                    rows.append(row)
                    for nm, r in res.items():
                        tsv.write(f"{rnd}\t{w}\t{conc}\t{nm}\t{r['output_throughput']:.2f}\t{r['median_tpot_ms']:.2f}\t"
                                  f"{r['median_ttft_ms']:.1f}\t{r.get('accept_length') or ''}\t{r['completed']}\n")
                    tsv.flush()
                    print(f"round {rnd} {w} c={conc}: plain {row['plain']:.2f} tok/s, spec {row['spec']:.2f} tok/s "
                          f"({row['spec'] / row['plain']:.2f} x), TPOT {row['tpot_plain']:.2f} -> {row['tpot_spec']:.2f} ms, "
                          f"accept length {row['accept']}, identical texts {same}/{row['total']}", flush=True)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    flags = open("/proc/cpuinfo").read()
    isa = "avx512_vnni" if "avx512_vnni" in flags else ("avx2" if "avx2" in flags else "?")
    print(f"\nCPU: {cpu} ({os.cpu_count()} cores, {isa}); model {args.model}")
    for nm in names:
        for l in lines[nm]:
            print(f"{nm}: {l}")
    print(f"spec flags: {args.spec}\n")
    print("| workload | c | plain out tok/s | spec out tok/s | ratio | TPOT plain -> spec (ms) | TTFT plain -> spec (ms) | accept length | identical |")
    print("|---|---|---|---|---|---|---|---|---|")
    keys = sorted({(r["workload"], r["conc"]) for r in rows}, key=lambda k: (args.workloads.split(",").index(k[0]), k[1]))
    for w, c in keys:
        rs = [r for r in rows if r["workload"] == w and r["conc"] == c]
        med = lambda k: statistics.median(r[k] for r in rs)
        ratios = ", ".join(f"{r['spec'] / r['plain']:.2f}" for r in rs)
        acc = [r["accept"] for r in rs if r["accept"]]
        print(f"| {w} | {c} | {med('plain'):.2f} | {med('spec'):.2f} | {med('spec') / med('plain'):.2f} x (rounds {ratios}) | "
              f"{med('tpot_plain'):.2f} -> {med('tpot_spec'):.2f} | {med('ttft_plain'):.0f} -> {med('ttft_spec'):.0f} | "
              f"{acc[-1] if acc else '-'} | {sum(r['same'] for r in rs)}/{sum(r['total'] for r in rs)} |")


if __name__ == "__main__":
    main()
