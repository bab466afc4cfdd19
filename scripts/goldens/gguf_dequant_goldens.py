#!/usr/bin/env python3
"""Dequantization goldens from the `gguf` Python package (llama.cpp's gguf-py, an independent
reader of GGML's block formats: `gguf.quants.dequantize`).

Writes crates/engine/tests/fixtures/gguf_dequant.json with two parts:

  synthetic   For every block type Sparrow reads (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
              Q6_K, MXFP4): random block bytes (scales forced finite and small, as the Rust tests do),
              given as hex, and the 256 values gguf-py dequantizes them to.
  tensors     For two tensors of each quantized type in the Gemma 3 270M Q4_K_M file: the
              dequantized values of rows 0, rows/2 and rows-1 (first 64 values) and the f64
              sum and sum of |w| of each whole row.

Run (any Python with `pip install gguf numpy`):

    python3 scripts/goldens/gguf_dequant_goldens.py \
        --gguf ~/.cache/sparrow/pkgs/gemma3-270m/gemma-3-270m-q4_k_m.gguf \
        --out crates/engine/tests/fixtures/gguf_dequant.json
"""

import argparse
import importlib.metadata
import json
import random

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "MXFP4"]
# Byte offsets of the high byte of each f16 scale field in a block.
HIGHS = {"Q4_0": [1], "Q4_1": [1, 3], "Q5_0": [1], "Q5_1": [1, 3], "Q8_0": [1],
         "Q4_K": [1, 3], "Q5_K": [1, 3], "Q6_K": [209]}
# MXFP4's E8M0 scale byte (block byte 0), kept within 2^-10 .. 2^5 as the Rust tests keep it.
E8M0 = {"MXFP4": 0}


def synthetic(rng):
    out = {}
    for name in TYPES:
        ty = T[name]
        block, size = gguf.GGML_QUANT_SIZES[ty]
        n = 256
        raw = bytearray(rng.getrandbits(8) for _ in range(n // block * size))
        for b in range(n // block):
            if name in E8M0:
                raw[b * size + E8M0[name]] = 118 + raw[b * size + E8M0[name]] % 16
            for i, h in enumerate(HIGHS.get(name, [])):
                sign = 0x80 if i == 1 and name in ("Q4_1", "Q5_1") else 0
                raw[b * size + h] = sign | 0x20 | (raw[b * size + h] & 0x0F)
        vals = dequantize(np.frombuffer(bytes(raw), dtype=np.uint8), ty).reshape(-1)
        out[name] = {"hex": bytes(raw).hex(), "values": [float(v) for v in vals.astype(np.float32)]}
    return out


def tensors(path):
    r = gguf.GGUFReader(path)
    seen = {}
    out = []
    for t in r.tensors:
        name = t.tensor_type.name
        if name not in TYPES or seen.get(name, 0) >= 2:
            continue
        seen[name] = seen.get(name, 0) + 1
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape(-1, int(t.shape[0]))
        rows = [0, w.shape[0] // 2, w.shape[0] - 1]
        out.append({
            "name": t.name, "type": name, "rows": int(w.shape[0]), "cols": int(w.shape[1]),
            "sample_rows": rows,
            "head": [[float(v) for v in w[i, :64]] for i in rows],
            "sum": [float(w[i].astype(np.float64).sum()) for i in rows],
            "abs_sum": [float(np.abs(w[i].astype(np.float64)).sum()) for i in rows],
        })
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    doc = {
        "reference": f"gguf-py {importlib.metadata.version('gguf')} gguf.quants.dequantize",
        "synthetic": synthetic(random.Random(16)),
        "tensors": tensors(a.gguf),
    }
    with open(a.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
