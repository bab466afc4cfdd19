#!/usr/bin/env python3
"""Soak test of `sparrow serve`: an hour (or --duration seconds) under `sparrow bench` load at
a fraction of the server's measured capacity, with the server's RSS, open file descriptors and
KV pages sampled every --interval seconds. It fails on RSS growth past a stated bound, on any
KV page or descriptor not returned once the load stops, on a failed request where none may
fail, or on a server that died.

    scripts/soak.py                       # one hour, SmolLM2, results in soak-<UTC time>/
    scripts/soak.py --duration 150 --interval 5 --out /tmp/soak   # the CI variant's size
    scripts/soak.py -- --max-total-tokens 8192     # flags after `--` go to `sparrow serve`
                                                   # (default: --max-total-tokens 16384)

The load, as three `sparrow bench` processes run side by side in segments of --segment
seconds (Poisson arrivals, each with its own seed per segment):
- main (70 % of the target rate): native `/generate`, streamed, `random` prompts with mixed
  lengths (input 1-256, output 1-128 tokens, SGLang's `--random-range-ratio 0`); no failure
  allowed;
- n>1 (10 %): `/v1/completions` with `"n": 2`, not streamed, input 1-128, output 1-64; no
  failure allowed;
- aborts (10 %): streamed `/generate` asking for 128-256 tokens with a 1.5 s
  `--request-timeout`, so most are cut by the client mid-stream and the server aborts them;
  their failures are the point and are not counted.
Arrivals add up to --load (default 0.8) of the capacity measured first: the request
throughput of the main mix at `--request-rate inf` and --capacity-concurrency requests in
flight, over enough prompts to fill the KV pool once (so every page is touched before the RSS
reference).

Samples go to <out>/soak.csv (t_s, rss_mib, rss_anon_mib, fds, free_pages,
evictable_pages, total_pages, running, queued, retractions, generated_tokens); the verdict
and the figures to <out>/summary.json; the server's log to <out>/server.log; every bench's
result line and per-request records to <out>/bench/.

The checks, all stated in summary.json:
- RSS: the reference is the first sample at or after --warmup seconds of load (by then every KV
  page and the allocator's arenas are touched); the peak after it may
  exceed it by at most max(--rss-bound-mib, --rss-bound-frac x reference). The least-squares
  slope after the reference is reported in MiB/hour.
- Pages: after the load stops and the server is idle, free + evictable pages = total (every
  page is free or held by the radix cache, none by a finished request), and after
  /flush_cache free = total.
- Descriptors: once idle, open descriptors at most 8 above the count before the load.
- Requests: the main and n>1 benches end with every request successful; the server answers
  /health at the end and never exited.
"""

import argparse
import datetime as dt
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, data=None, timeout=10):
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


def server_state(base):
    _, body = http(base + "/get_server_info")
    return json.loads(body)["internal_states"][0]


def proc_status(pid):
    """(VmRSS, RssAnon) in MiB and the open descriptor count of `pid`."""
    rss = anon = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("RssAnon:"):
                anon = int(line.split()[1]) / 1024
    return rss, anon, len(os.listdir(f"/proc/{pid}/fd"))


class Sampler(threading.Thread):
    """Samples the server every `interval` seconds into `csv_path` until stopped."""

    FIELDS = ["t_s", "rss_mib", "rss_anon_mib", "fds", "free_pages", "evictable_pages", "total_pages",
              "running", "queued", "retractions", "generated_tokens"]

    def __init__(self, pid, base, interval, csv_path, t0):
        super().__init__(daemon=True)
        self.pid, self.base, self.interval, self.t0 = pid, base, interval, t0
        self.rows, self.errors = [], []
        self.stop_event = threading.Event()
        self.csv = open(csv_path, "w", buffering=1)
        self.csv.write(",".join(self.FIELDS) + "\n")

    def sample(self):
        t = time.monotonic() - self.t0
        try:
            rss, anon, fds = proc_status(self.pid)
            st = server_state(self.base)
        except (OSError, ValueError, KeyError) as e:
            self.errors.append(f"{t:.0f} s: cannot sample the server: {e}")
            return None
        row = {"t_s": round(t, 1), "rss_mib": round(rss, 1), "rss_anon_mib": round(anon, 1), "fds": fds,
               "free_pages": st["free_pages"], "evictable_pages": st["evictable_pages"],
               "total_pages": st["total_pages"], "running": st["num_running_reqs"], "queued": st["num_queue_reqs"],
               "retractions": st["num_retractions"], "generated_tokens": st["generation_tokens_total"]}
        self.rows.append(row)
        self.csv.write(",".join(str(row[k]) for k in self.FIELDS) + "\n")
        return row

    def run(self):
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            self.sample()
            next_at += self.interval
            self.stop_event.wait(max(0.0, next_at - time.monotonic()))

    def stop(self):
        self.stop_event.set()
        self.join()


def bench(args, base_port, out_dir, name, extra, log):
    """Starts one `sparrow bench` process; its result line and records go to out_dir/name.*"""
    cmd = [args.sparrow, "bench", "--host", "127.0.0.1", "--port", str(base_port), "--disable-tqdm",
           "--output-file", os.path.join(out_dir, f"{name}.jsonl")] + extra
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def last_result(path):
    with open(path) as f:
        lines = [l for l in f if l.strip()]
    return json.loads(lines[-1].replace("Infinity", "null").replace("NaN", "null"))


MAIN = ["--dataset-name", "random", "--random-input-len", "256", "--random-output-len", "128",
        "--random-range-ratio", "0"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=3600, help="seconds of load (default 3600)")
    ap.add_argument("--interval", type=float, default=10, help="seconds between samples (default 10)")
    ap.add_argument("--segment", type=float, default=None,
                    help="seconds of arrivals per bench run (default min(300, duration / 2))")
    ap.add_argument("--load", type=float, default=0.8, help="fraction of the measured capacity (default 0.8)")
    ap.add_argument("--capacity-concurrency", type=int, default=32)
    ap.add_argument("--capacity-prompts", type=int, default=96,
                    help="prompts of the capacity run, at least enough to fill the KV pool")
    ap.add_argument("--warmup", type=float, default=None,
                    help="seconds of load before the RSS reference (default min(600, duration / 4))")
    ap.add_argument("--rss-bound-mib", type=float, default=64.0)
    ap.add_argument("--rss-bound-frac", type=float, default=0.05)
    ap.add_argument("--sparrow", default=None, help="the sparrow binary (default: build target/release/sparrow)")
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--out", default=None, help="results folder (default soak-<UTC time>)")
    ap.add_argument("serve_args", nargs="*",
                    help="flags for `sparrow serve`, after `--` (default: --max-total-tokens 16384)")
    args = ap.parse_args()
    # A KV pool the capacity run fills: every page is touched before the RSS reference, so
    # first touches of a big pool filling up over the hour are not mistaken for a leak, and
    # the radix cache evicts (and the scheduler may retract) all along.
    args.serve_args = args.serve_args or ["--max-total-tokens", "16384"]
    if args.sparrow is None:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "sparrow"], cwd=ROOT, check=True)
        args.sparrow = os.path.join(ROOT, "target", "release", "sparrow")
    segment = args.segment or min(300.0, args.duration / 2)
    warmup = args.warmup if args.warmup is not None else min(600.0, args.duration / 4)
    out = args.out or "soak-" + dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    bench_dir = os.path.join(out, "bench")
    os.makedirs(bench_dir, exist_ok=True)
    port = args.port or free_port()
    base = f"http://127.0.0.1:{port}"
    failures, notes = [], []

    server_log = open(os.path.join(out, "server.log"), "w")
    serve_cmd = [args.sparrow, "serve", "--host", "127.0.0.1", "--port", str(port)] + args.serve_args
    print(f"soak: {' '.join(serve_cmd)}", flush=True)
    server = subprocess.Popen(serve_cmd, stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True)
    bench_log = open(os.path.join(out, "bench.log"), "w")
    procs = []

    def stop_all(*_):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, lambda *a: (stop_all(), sys.exit(143)))
    try:
        deadline = time.monotonic() + 600
        while True:
            if server.poll() is not None:
                raise SystemExit(f"soak: sparrow serve exited during start-up ({server.returncode}); see {out}/server.log")
            try:
                if http(base + "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("soak: sparrow serve not ready after 600 s")
            time.sleep(0.5)
        fds_before = proc_status(server.pid)[2]
        _, info = http(base + "/get_server_info")
        info = json.loads(info)
        st0 = info["internal_states"][0]
        # Enough prompts for the capacity run to fill the KV pool (the main mix averages 193
        # tokens a request): the radix cache keeps every finished request until the pool is
        # full, so by then every page has been touched, and pages touched for the first time
        # later in the run cannot pass for a leak.
        pool_tokens = st0["total_pages"] * int(info.get("page_size", 1))
        capacity_prompts = max(args.capacity_prompts, math.ceil(1.25 * pool_tokens / 193))
        t0 = time.monotonic()
        sampler = Sampler(server.pid, base, args.interval, os.path.join(out, "soak.csv"), t0)
        sampler.start()

        # Capacity: the main mix, as fast as it goes, with a fixed number in flight.
        p = bench(args, port, bench_dir, "capacity", MAIN + ["--num-prompts", str(capacity_prompts),
                  "--max-concurrency", str(args.capacity_concurrency), "--request-rate", "inf"], bench_log)
        procs.append(p)
        if p.wait() != 0:
            raise SystemExit(f"soak: the capacity run failed (exit {p.returncode}); see {out}/bench.log")
        cap = last_result(os.path.join(bench_dir, "capacity.jsonl"))
        capacity = cap["request_throughput"]
        rate = args.load * capacity
        print(f"soak: capacity {capacity:.2f} req/s ({cap['output_throughput']:.1f} output tok/s) at concurrency "
              f"{args.capacity_concurrency}; load {args.load:.0%} = {rate:.2f} req/s for {args.duration:.0f} s", flush=True)

        load_t0 = time.monotonic()
        segments = max(1, math.ceil(args.duration / segment))
        seg_results = []
        for k in range(segments):
            left = args.duration - (time.monotonic() - load_t0)
            if left < min(segment, args.duration) * 0.25 and k > 0:
                break
            secs = min(segment, max(left, 1.0))
            shares = {"main": 0.7, "n2": 0.1, "abort": 0.1}
            n = {s: max(2, round(rate * f * secs)) for s, f in shares.items()}
            r = {s: rate * f for s, f in shares.items()}
            c = args.capacity_concurrency
            procs[:] = [
                bench(args, port, bench_dir, f"seg{k:02}-main", MAIN + [
                    "--num-prompts", str(n["main"]), "--request-rate", f"{r['main']:.4f}", "--max-concurrency", str(c),
                    "--seed", str(1000 + k)], bench_log),
                bench(args, port, bench_dir, f"seg{k:02}-n2", [
                    "--backend", "sglang-oai", "--dataset-name", "random", "--random-input-len", "128",
                    "--random-output-len", "64", "--random-range-ratio", "0", "--disable-stream",
                    "--extra-request-body", '{"n": 2}', "--num-prompts", str(n["n2"]),
                    "--request-rate", f"{r['n2']:.4f}", "--max-concurrency", str(max(1, c // 4)),
                    "--seed", str(2000 + k), "--warmup-requests", "0"], bench_log),
                bench(args, port, bench_dir, f"seg{k:02}-abort", [
                    "--dataset-name", "random", "--random-input-len", "128", "--random-output-len", "256",
                    "--random-range-ratio", "0.5", "--request-timeout", "1.5", "--max-failure-rate", "1",
                    "--num-prompts", str(n["abort"]), "--request-rate", f"{r['abort']:.4f}",
                    "--max-concurrency", str(max(1, c // 4)), "--seed", str(3000 + k), "--warmup-requests", "0"],
                    bench_log),
            ]
            codes = [pr.wait() for pr in procs]
            row = {"segment": k, "seconds": round(secs)}
            for (name, code) in zip(["main", "n2", "abort"], codes):
                try:
                    res = last_result(os.path.join(bench_dir, f"seg{k:02}-{name}.jsonl"))
                except (OSError, ValueError, IndexError):
                    res = {}
                row[name] = {"exit": code, "completed": res.get("completed"), "failed": res.get("failed"),
                             "output_throughput": res.get("output_throughput")}
                if name != "abort" and code != 0:
                    failures.append(f"segment {k}: the {name} bench exited {code} "
                                    f"({res.get('failed')} failed of {res.get('completed', 0) + (res.get('failed') or 0)})")
            seg_results.append(row)
            last = sampler.rows[-1] if sampler.rows else {}
            print(f"soak: segment {k + 1}/{segments} done at {time.monotonic() - load_t0:.0f} s: main "
                  f"{row['main']['completed']} ok / {row['main']['failed']} failed, n2 {row['n2']['completed']} ok, "
                  f"abort {row['abort']['completed']} ok / {row['abort']['failed']} cut; RSS {last.get('rss_mib')} MiB, "
                  f"free pages {last.get('free_pages')}/{last.get('total_pages')}", flush=True)
            if server.poll() is not None:
                failures.append(f"the server exited during the load (status {server.returncode})")
                break
        load_s = time.monotonic() - load_t0

        # The load has stopped: the server must go idle and give every page back.
        idle_deadline = time.monotonic() + 120
        while server.poll() is None:
            st = server_state(base)
            if st["num_running_reqs"] == 0 and st["num_queue_reqs"] == 0:
                break
            if time.monotonic() > idle_deadline:
                failures.append(f"not idle 120 s after the load stopped: {st['num_running_reqs']} running, "
                                f"{st['num_queue_reqs']} queued")
                break
            time.sleep(0.5)
        time.sleep(1.0)
        sampler.stop()
        idle = sampler.sample()
        pages = {}
        if server.poll() is None and idle:
            if idle["free_pages"] + idle["evictable_pages"] != idle["total_pages"]:
                failures.append(f"idle: {idle['free_pages']} free + {idle['evictable_pages']} evictable != "
                                f"{idle['total_pages']} pages: {idle['total_pages'] - idle['free_pages'] - idle['evictable_pages']} "
                                "held by no request")
            http(base + "/flush_cache", data=b"")
            after = server_state(base)
            pages = {"total": idle["total_pages"], "idle_free": idle["free_pages"],
                     "idle_evictable": idle["evictable_pages"], "after_flush_free": after["free_pages"]}
            if after["free_pages"] != after["total_pages"]:
                failures.append(f"after /flush_cache: {after['free_pages']} of {after['total_pages']} pages free")
            if idle["fds"] > fds_before + 8:
                failures.append(f"idle: {idle['fds']} open descriptors, {fds_before} before the load")
            try:
                if http(base + "/health", timeout=10)[0] != 200:
                    failures.append("/health does not answer 200 at the end")
            except OSError as e:
                failures.append(f"/health at the end: {e}")
        else:
            failures.append(f"the server is gone (status {server.returncode})")
        failures.extend(sampler.errors)

        # RSS against the reference taken after the warm-up.
        rows = sampler.rows
        load_rows = [r for r in rows if r["t_s"] >= (load_t0 - t0) + warmup]
        rss = {}
        if len(load_rows) >= 2:
            ref = load_rows[0]
            later = load_rows[1:]
            peak = max(later, key=lambda r: r["rss_mib"])
            bound = max(args.rss_bound_mib, args.rss_bound_frac * ref["rss_mib"])
            xs = [r["t_s"] / 3600 for r in load_rows]
            ys = [r["rss_mib"] for r in load_rows]
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            var = sum((x - mx) ** 2 for x in xs)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var > 0 else 0.0
            rss = {"start_mib": rows[0]["rss_mib"], "reference_mib": ref["rss_mib"], "reference_t_s": ref["t_s"],
                   "peak_mib": peak["rss_mib"], "peak_t_s": peak["t_s"], "end_mib": rows[-1]["rss_mib"],
                   "bound_mib": round(bound, 1), "growth_mib": round(peak["rss_mib"] - ref["rss_mib"], 1),
                   "slope_mib_per_hour": round(slope, 1)}
            if peak["rss_mib"] - ref["rss_mib"] > bound:
                failures.append(f"RSS grew {peak['rss_mib'] - ref['rss_mib']:.1f} MiB after the warm-up "
                                f"({ref['rss_mib']} MiB at {ref['t_s']} s to {peak['rss_mib']} MiB at {peak['t_s']} s), "
                                f"past the bound of {bound:.1f} MiB")
        else:
            failures.append(f"too few samples after the {warmup:.0f} s warm-up to judge RSS ({len(load_rows)})")

        st1 = server_state(base) if server.poll() is None else {}
        summary = {
            "pass": not failures, "failures": failures, "notes": notes,
            "server_cmd": serve_cmd, "capacity_req_s": capacity, "load": args.load, "rate_req_s": rate,
            "duration_s": args.duration, "load_s": round(load_s, 1), "interval_s": args.interval,
            "warmup_s": warmup, "samples": len(rows), "rss": rss, "pages": pages,
            "fds": {"before": fds_before, "idle": idle["fds"] if idle else None},
            "retractions": st1.get("num_retractions", 0) - st0.get("num_retractions", 0),
            "generated_tokens": st1.get("generation_tokens_total", 0) - st0.get("generation_tokens_total", 0),
            "segments": seg_results,
        }
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        print(f"soak: RSS start {rss.get('start_mib')} MiB, reference {rss.get('reference_mib')} MiB, peak "
              f"{rss.get('peak_mib')} MiB, end {rss.get('end_mib')} MiB (bound +{rss.get('bound_mib')} MiB, slope "
              f"{rss.get('slope_mib_per_hour')} MiB/h); pages {pages}; {summary['retractions']} retractions")
        for f_ in failures:
            print(f"soak: FAIL: {f_}")
        print(f"soak: {'PASS' if not failures else 'FAIL'} ({out}/summary.json, {out}/soak.csv)")
        return 0 if not failures else 1
    finally:
        stop_all()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
