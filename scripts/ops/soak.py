#!/usr/bin/env python3
"""Soak test of `sparrow serve`: an hour (or --duration seconds) under `sparrow bench` load at
a fraction of the server's measured capacity, with the server's RSS, open file descriptors and
KV pages sampled every --interval seconds. It fails on RSS growth past a stated bound, on any
KV page or descriptor not returned once the load stops, on a failed request where none may
fail, or on a server that died.

    scripts/ops/soak.py                       # one hour, SmolLM2, results in soak-<UTC time>/
    scripts/ops/soak.py --duration 60 --segment 30 --interval 2 --warmup 10 --capacity-prompts 32 \
        --capacity-concurrency 16 --out /tmp/soak -- --max-total-tokens 4096 --disable-autotune
                                                   # the CI variant (crates/sparrow/tests/soak.rs)
    scripts/ops/soak.py -- --max-total-tokens 8192     # flags after `--` go to `sparrow serve`
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
reference). The rate is counted in requests of the main mix: the `n: 2` and abort requests
cost somewhat more, so the offered load is a little above --load in tokens.

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
  /health at the end and never exited; a segment whose benches are not done 5 minutes after
  twice its arrival span is a hang (its benches are stopped, what they finished is saved).
- Samples: at most 2 % (or 2) may go unanswered (a long prefill can hold the engine).
Any failure, a script error included, still writes summary.json; the exit status is 1.
"""

import argparse
import datetime as dt
import http.client as httpclient
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


# What a dying or hung server makes an HTTP call raise.
HTTP_ERRORS = (OSError, ValueError, KeyError, IndexError, httpclient.HTTPException)


def try_state(base):
    """server_state, or None when the server does not answer properly."""
    try:
        return server_state(base)
    except HTTP_ERRORS:
        return None


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
        self.rows, self.misses = [], []
        self.stop_event = threading.Event()
        self.csv = open(csv_path, "w", buffering=1)
        self.csv.write(",".join(self.FIELDS) + "\n")

    def sample(self):
        t = time.monotonic() - self.t0
        try:
            rss, anon, fds = proc_status(self.pid)
            st = server_state(self.base)
        except HTTP_ERRORS as e:
            self.misses.append(f"{t:.0f} s: {type(e).__name__}: {e}")
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


def last_result(path):
    """The last result line of a bench's output file (Python's json reads its Infinity/NaN),
    or {} when there is none (the bench died before writing it)."""
    try:
        with open(path) as f:
            lines = [l for l in f if l.strip()]
        return json.loads(lines[-1])
    except (OSError, ValueError, IndexError):
        return {}


def wait_all(procs, deadline):
    """Waits for every process until `deadline` (monotonic); then SIGINT (the bench saves what
    finished), 30 s, SIGKILL. Returns the exit codes and whether the deadline was hit."""
    hung = False
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung = True
    if hung:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return [p.returncode for p in procs], hung


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
    out = args.out or "soak-" + dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    os.makedirs(os.path.join(out, "bench"), exist_ok=True)
    soak = Soak(args, out)
    signal.signal(signal.SIGTERM, lambda *a: (soak.stop_all(), sys.exit(143)))
    try:
        soak.run()
    except Exception:  # noqa: BLE001 - whatever went wrong, the summary says so
        soak.failures.append("soak script error:\n" + traceback.format_exc())
    finally:
        soak.stop_all()
    soak.finish()
    return 0 if not soak.failures else 1


class Soak:
    """One soak run: the server, its sampler, the load, and the verdict."""

    def __init__(self, args, out):
        self.args, self.out = args, out
        self.bench_dir = os.path.join(out, "bench")
        self.port = args.port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.failures, self.notes = [], []
        self.segment = args.segment or min(300.0, args.duration / 2)
        self.warmup = args.warmup if args.warmup is not None else min(600.0, args.duration / 4)
        self.serve_cmd = [args.sparrow, "serve", "--host", "127.0.0.1", "--port", str(self.port)] + args.serve_args
        self.server = None
        self.sampler = None
        # Set as the run reaches them: the server's state before the load, when sampling and
        # the load began.
        self.fds_before = self.st0 = self.t0 = self.load_t0 = None
        self.procs = []
        self.bench_log = open(os.path.join(out, "bench.log"), "w")
        self.summary = {"server_cmd": self.serve_cmd, "load": args.load, "duration_s": args.duration,
                        "interval_s": args.interval, "warmup_s": self.warmup, "segments": []}

    def alive(self):
        return self.server is not None and self.server.poll() is None

    def stop_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        if self.sampler is not None and self.sampler.is_alive():
            self.sampler.stop()
        if self.alive():
            os.killpg(self.server.pid, signal.SIGTERM)
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)

    def bench(self, name, extra):
        """Starts one `sparrow bench` process; its result line and records go to bench/<name>.*"""
        cmd = [self.args.sparrow, "bench", "--host", "127.0.0.1", "--port", str(self.port), "--disable-tqdm",
               "--output-file", os.path.join(self.bench_dir, f"{name}.jsonl")] + extra
        self.bench_log.write(f"$ {' '.join(cmd)}\n")
        self.bench_log.flush()
        return subprocess.Popen(cmd, stdout=self.bench_log, stderr=subprocess.STDOUT)

    def start_server(self):
        print(f"soak: {' '.join(self.serve_cmd)}", flush=True)
        log = open(os.path.join(self.out, "server.log"), "w")
        self.server = subprocess.Popen(self.serve_cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 600
        while True:
            if not self.alive():
                raise RuntimeError(f"sparrow serve exited during start-up ({self.server.returncode}); "
                                   f"see {self.out}/server.log")
            try:
                if http(self.base + "/health", timeout=2)[0] == 200:
                    return
            except HTTP_ERRORS:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("sparrow serve not ready after 600 s")
            time.sleep(0.5)

    def run(self):
        a = self.args
        self.start_server()
        self.fds_before = proc_status(self.server.pid)[2]
        _, info = http(self.base + "/get_server_info")
        info = json.loads(info)
        self.st0 = info["internal_states"][0]
        # Enough prompts for the capacity run to fill the KV pool (the main mix averages 193
        # tokens a request): the radix cache keeps every finished request until the pool is
        # full, so by then every page has been touched, and pages touched for the first time
        # later in the run cannot pass for a leak.
        pool_tokens = self.st0["total_pages"] * int(info.get("page_size", 1))
        capacity_prompts = max(a.capacity_prompts, math.ceil(1.25 * pool_tokens / 193))
        self.t0 = time.monotonic()
        self.sampler = Sampler(self.server.pid, self.base, a.interval, os.path.join(self.out, "soak.csv"), self.t0)
        self.sampler.start()

        # Capacity: the main mix, as fast as it goes, with a fixed number in flight.
        self.procs = [self.bench("capacity", MAIN + ["--num-prompts", str(capacity_prompts),
                                 "--max-concurrency", str(a.capacity_concurrency), "--request-rate", "inf"])]
        (code,), hung = wait_all(self.procs, time.monotonic() + 1800)
        cap = last_result(os.path.join(self.bench_dir, "capacity.jsonl"))
        if code != 0 or hung or not cap.get("request_throughput"):
            raise RuntimeError(f"the capacity run failed (exit {code}{', hung' if hung else ''}); see {self.out}/bench.log")
        capacity = cap["request_throughput"]
        rate = a.load * capacity
        self.summary.update({"capacity_req_s": capacity, "capacity_output_tok_s": cap.get("output_throughput"),
                             "capacity_prompts": capacity_prompts, "rate_req_s": rate})
        print(f"soak: capacity {capacity:.2f} req/s ({cap.get('output_throughput', 0):.1f} output tok/s) at concurrency "
              f"{a.capacity_concurrency}; load {a.load:.0%} = {rate:.2f} req/s for {a.duration:.0f} s", flush=True)

        self.load_t0 = time.monotonic()
        segments = max(1, math.ceil(a.duration / self.segment))
        secs = a.duration / segments
        for k in range(segments):
            self.run_segment(k, segments, secs, rate)
            if not self.alive():
                self.failures.append(f"the server exited during the load (status {self.server.returncode})")
                return
        self.summary["load_s"] = round(time.monotonic() - self.load_t0, 1)
        self.check_idle()

    def run_segment(self, k, segments, secs, rate):
        a = self.args
        shares = {"main": 0.7, "n2": 0.1, "abort": 0.1}
        n = {s: max(2, round(rate * f * secs)) for s, f in shares.items()}
        r = {s: rate * f for s, f in shares.items()}
        c = a.capacity_concurrency
        self.procs = [
            self.bench(f"seg{k:02}-main", MAIN + [
                "--num-prompts", str(n["main"]), "--request-rate", f"{r['main']:.4f}", "--max-concurrency", str(c),
                "--seed", str(1000 + k)]),
            self.bench(f"seg{k:02}-n2", [
                "--backend", "sglang-oai", "--dataset-name", "random", "--random-input-len", "128",
                "--random-output-len", "64", "--random-range-ratio", "0", "--disable-stream",
                "--extra-request-body", '{"n": 2}', "--num-prompts", str(n["n2"]),
                "--request-rate", f"{r['n2']:.4f}", "--max-concurrency", str(max(1, c // 4)),
                "--seed", str(2000 + k), "--warmup-requests", "0"]),
            self.bench(f"seg{k:02}-abort", [
                "--dataset-name", "random", "--random-input-len", "128", "--random-output-len", "256",
                "--random-range-ratio", "0.5", "--request-timeout", "1.5", "--max-failure-rate", "1",
                "--num-prompts", str(n["abort"]), "--request-rate", f"{r['abort']:.4f}",
                "--max-concurrency", str(max(1, c // 4)), "--seed", str(3000 + k), "--warmup-requests", "0"]),
        ]
        # Arrivals span `secs`; at 80 % of capacity the backlog drains in seconds. Twice that
        # plus five minutes is a server that stopped making progress.
        codes, hung = wait_all(self.procs, time.monotonic() + 2 * secs + 300)
        if hung:
            self.failures.append(f"segment {k}: the load did not finish within {2 * secs + 300:.0f} s (a hang?)")
        row = {"segment": k, "seconds": round(secs)}
        for name, code in zip(["main", "n2", "abort"], codes):
            res = last_result(os.path.join(self.bench_dir, f"seg{k:02}-{name}.jsonl"))
            row[name] = {"exit": code, "completed": res.get("completed"), "failed": res.get("failed"),
                         "output_throughput": res.get("output_throughput")}
            if name != "abort" and code != 0:
                total = (res.get("completed") or 0) + (res.get("failed") or 0)
                self.failures.append(f"segment {k}: the {name} bench exited {code} ({res.get('failed')} failed of {total})")
        self.summary["segments"].append(row)
        last = self.sampler.rows[-1] if self.sampler.rows else {}
        print(f"soak: segment {k + 1}/{segments} done at {time.monotonic() - self.load_t0:.0f} s: main "
              f"{row['main']['completed']} ok / {row['main']['failed']} failed, n2 {row['n2']['completed']} ok, "
              f"abort {row['abort']['completed']} ok / {row['abort']['failed']} cut; RSS {last.get('rss_mib')} MiB, "
              f"free pages {last.get('free_pages')}/{last.get('total_pages')}", flush=True)

    def check_idle(self):
        """The load has stopped: the server must go idle and give every page and descriptor back."""
        deadline = time.monotonic() + 120
        while self.alive():
            st = try_state(self.base)
            if st and st["num_running_reqs"] == 0 and st["num_queue_reqs"] == 0:
                break
            if time.monotonic() > deadline:
                self.failures.append(f"not idle 120 s after the load stopped: {st}")
                return
            time.sleep(0.5)
        time.sleep(1.0)
        self.sampler.stop()
        idle = self.sampler.sample()
        if not self.alive():
            self.failures.append(f"the server exited after the load (status {self.server.returncode})")
            return
        if idle is None:
            self.failures.append("the idle server could not be sampled: " + "; ".join(self.sampler.misses[-1:]))
            return
        self.summary["fds"] = {"before": self.fds_before, "idle": idle["fds"]}
        held = idle["total_pages"] - idle["free_pages"] - idle["evictable_pages"]
        if held:
            self.failures.append(f"idle: {idle['free_pages']} free + {idle['evictable_pages']} evictable of "
                                 f"{idle['total_pages']} pages: {held} held by no running request")
        try:
            http(self.base + "/flush_cache", data=b"")
            after = server_state(self.base)
            self.summary["pages"] = {"total": idle["total_pages"], "idle_free": idle["free_pages"],
                                     "idle_evictable": idle["evictable_pages"], "after_flush_free": after["free_pages"]}
            if after["free_pages"] != after["total_pages"]:
                self.failures.append(f"after /flush_cache: {after['free_pages']} of {after['total_pages']} pages free")
            self.summary["retractions"] = after["num_retractions"] - self.st0["num_retractions"]
            self.summary["generated_tokens"] = after["generation_tokens_total"] - self.st0["generation_tokens_total"]
            if http(self.base + "/health", timeout=10)[0] != 200:
                self.failures.append("/health does not answer 200 at the end")
        except HTTP_ERRORS as e:
            self.failures.append(f"the idle server does not answer: {type(e).__name__}: {e}")
        if idle["fds"] > self.fds_before + 8:
            self.failures.append(f"idle: {idle['fds']} open descriptors, {self.fds_before} before the load")

    def check_rss(self):
        """RSS against the reference taken after the warm-up."""
        rows = self.sampler.rows if self.sampler else []
        if not rows or self.load_t0 is None:
            return
        load_rows = [r for r in rows if r["t_s"] >= (self.load_t0 - self.t0) + self.warmup]
        if len(load_rows) < 2:
            self.failures.append(f"too few samples after the {self.warmup:.0f} s warm-up to judge RSS ({len(load_rows)})")
            return
        ref, later = load_rows[0], load_rows[1:]
        peak = max(later, key=lambda r: r["rss_mib"])
        bound = max(self.args.rss_bound_mib, self.args.rss_bound_frac * ref["rss_mib"])
        xs = [r["t_s"] / 3600 for r in load_rows]
        ys = [r["rss_mib"] for r in load_rows]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var > 0 else 0.0
        self.summary["rss"] = {
            "start_mib": rows[0]["rss_mib"], "reference_mib": ref["rss_mib"], "reference_t_s": ref["t_s"],
            "peak_mib": peak["rss_mib"], "peak_t_s": peak["t_s"], "end_mib": rows[-1]["rss_mib"],
            "bound_mib": round(bound, 1), "growth_mib": round(peak["rss_mib"] - ref["rss_mib"], 1),
            "slope_mib_per_hour": round(slope, 1)}
        if peak["rss_mib"] - ref["rss_mib"] > bound:
            self.failures.append(f"RSS grew {peak['rss_mib'] - ref['rss_mib']:.1f} MiB after the warm-up "
                                 f"({ref['rss_mib']} MiB at {ref['t_s']} s to {peak['rss_mib']} MiB at {peak['t_s']} s), "
                                 f"past the bound of {bound:.1f} MiB")

    def finish(self):
        """The verdict: summary.json and the printed lines."""
        self.check_rss()
        if self.sampler is not None:
            misses = self.sampler.misses
            attempts = len(self.sampler.rows) + len(misses)
            # A sample may miss while a long prefill holds the engine; many may not.
            if len(misses) > max(2, attempts // 50):
                self.failures.append(f"{len(misses)} of {attempts} samples got no answer: {misses[:3]}")
            elif misses:
                self.notes.append(f"{len(misses)} of {attempts} samples got no answer: {misses}")
            self.summary["samples"] = len(self.sampler.rows)
        self.summary.update({"pass": not self.failures, "failures": self.failures, "notes": self.notes})
        with open(os.path.join(self.out, "summary.json"), "w") as f:
            json.dump(self.summary, f, indent=2)
        rss, pages = self.summary.get("rss", {}), self.summary.get("pages")
        print(f"soak: RSS start {rss.get('start_mib')} MiB, reference {rss.get('reference_mib')} MiB, peak "
              f"{rss.get('peak_mib')} MiB, end {rss.get('end_mib')} MiB (bound +{rss.get('bound_mib')} MiB, slope "
              f"{rss.get('slope_mib_per_hour')} MiB/h); pages {pages}; "
              f"{self.summary.get('retractions')} retractions")
        for n in self.notes:
            print(f"soak: note: {n}")
        for f_ in self.failures:
            print(f"soak: FAIL: {f_}")
        print(f"soak: {'PASS' if not self.failures else 'FAIL'} ({self.out}/summary.json, {self.out}/soak.csv)")


if __name__ == "__main__":
    sys.exit(main())
