#!/usr/bin/env python3
"""Goldens for the GLM-5 model from HF transformers' own GlmMoeDsa implementation.

Usage (the venv needs torch, transformers >= 5 with models/glm_moe_dsa, safetensors, tokenizers):
    sparrow gen-model glm5-tiny --seed 0 --output /tmp/glm5-tiny
    python scripts/goldens/reference_glm5.py --model /tmp/glm5-tiny \
        --out crates/convert/tests/fixtures/glm5_tiny_golden.json

What it does, independently of Sparrow's Rust code:
1. Dequantizes every NVFP4 linear of the checkpoint itself (nibbles -> E2M1 table, weight_scale
   decoded by torch's float8_e4m3fn, times weight_scale_2), keeps the BF16 tensors, and loads the
   resulting float32 state dict with `GlmMoeDsaForCausalLM.from_pretrained` (which also turns the
   per-expert keys into its fused expert tensors).
2. Tokenizes fixed prompts (all longer than index_topk, so the sparse path runs) with the
   checkpoint's tokenizer.json through the `tokenizers` library.
3. Runs a float32 prefill forward and records logits at chosen positions; then greedy-decodes a
   few steps one token at a time through HF's KV cache, recording each step's logits.
4. Checks that every DSA top-k selection in those forwards is free of near-ties at the top-k
   boundary (a tie would make the selected set, and so the logits, implementation-defined) and
   records the smallest margin.

Logits are stored for a subset of the vocabulary per position: the reference's top 16 plus 48
fixed ids drawn from a seeded generator.
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]

PROMPTS = [
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, oil-based ink and a wooden press adapted from wine making. Within fifty years, "
    "printers in more than two hundred European cities had produced millions of books.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
    "for i in range(10):\n    print(i, fibonacci(i))\n# The loop prints the first ten numbers of the sequence.",
    "User: Could you explain why the sky looks blue during the day but red at sunset?\nAssistant: Sunlight "
    "is scattered by air molecules, and shorter wavelengths scatter much more strongly than longer ones.",
]
DECODE_STEPS = 6
SUBSET_TOP = 16
SUBSET_RANDOM = 48


def load_state_dict(model_dir):
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
    else:
        files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    raw = {}
    for f in files:
        with safe_open(os.path.join(model_dir, f), framework="pt") as st:
            for k in st.keys():
                raw[k] = st.get_tensor(k)
    table = torch.tensor(E2M1, dtype=torch.float32)
    out = {}
    for k, t in raw.items():
        if k.endswith((".weight_scale", ".weight_scale_2", ".input_scale")):
            continue
        mod = k[: -len(".weight")] if k.endswith(".weight") else None
        if mod is not None and mod + ".weight_scale" in raw:
            packed = t.to(torch.uint8)
            lo = (packed & 0x0F).long()
            hi = (packed >> 4).long()
            codes = torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], packed.shape[1] * 2)
            vals = table[codes]
            scale = raw[mod + ".weight_scale"].to(torch.float32)  # float8_e4m3fn -> f32
            s2 = raw[mod + ".weight_scale_2"].to(torch.float32).reshape(())
            w = vals * torch.repeat_interleave(scale, 16, dim=1) * s2
            out[k] = w.contiguous()
        else:
            out[k] = t.to(torch.float32)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0, help="the gen-model seed the checkpoint was made with")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    import transformers
    from tokenizers import Tokenizer
    from transformers import GlmMoeDsaForCausalLM
    from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as mod

    cfg = json.load(open(os.path.join(args.model, "config.json")))
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = "float32"
    sd = load_state_dict(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        json.dump(cfg, open(os.path.join(tmp, "config.json"), "w"))
        save_file(sd, os.path.join(tmp, "model.safetensors"))
        model = GlmMoeDsaForCausalLM.from_pretrained(tmp, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    topk_cfg = cfg["index_topk"]

    # Record every indexer top-k input to check boundary margins.
    state = {"in_indexer": False, "rows": []}
    orig_fwd = mod.GlmMoeDsaIndexer.forward
    orig_topk = torch.Tensor.topk

    def fwd(self, *a, **kw):
        state["in_indexer"] = True
        try:
            return orig_fwd(self, *a, **kw)
        finally:
            state["in_indexer"] = False

    def topk(self, k, *a, **kw):
        if state["in_indexer"]:
            state["rows"].append((self.detach().clone(), k))
        return orig_topk(self, k, *a, **kw)

    mod.GlmMoeDsaIndexer.forward = fwd
    torch.Tensor.topk = topk

    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    rng = np.random.default_rng(1234)
    vocab = cfg["vocab_size"]
    random_ids = sorted(int(x) for x in rng.choice(vocab, SUBSET_RANDOM, replace=False))

    def subset(logits_row):
        top = torch.argsort(logits_row, descending=True)[:SUBSET_TOP].tolist()
        ids = sorted(set(top) | set(random_ids))
        return {"ids": ids, "logits": [float(logits_row[i]) for i in ids], "argmax": int(top[0])}

    cases = []
    with torch.no_grad():
        for text in PROMPTS:
            ids = tok.encode(text, add_special_tokens=False).ids
            assert len(ids) > topk_cfg + 8, f"prompt of {len(ids)} tokens is not longer than top-k {topk_cfg}"
            out = model(input_ids=torch.tensor([ids]), use_cache=True)
            logits = out.logits[0]
            n = len(ids)
            positions = sorted(set([0, topk_cfg - 1, topk_cfg, topk_cfg + 1, n // 2, n - 2, n - 1]))
            prefill = [dict(position=p, **subset(logits[p])) for p in positions]
            pkv = out.past_key_values
            steps = []
            nxt = int(torch.argmax(logits[n - 1]))
            for s in range(DECODE_STEPS):
                o = model(input_ids=torch.tensor([[nxt]]), past_key_values=pkv, use_cache=True)
                pkv = o.past_key_values
                row = o.logits[0, -1]
                steps.append(dict(token=nxt, position=n + s, **subset(row)))
                nxt = int(torch.argmax(row))
            cases.append({"text": text, "prompt_ids": ids, "prefill": prefill, "decode": steps})

    # Margins at the top-k boundary of every selection made.
    min_margin = float("inf")
    sparse_rows = 0
    for scores, k in state["rows"]:
        flat = scores.reshape(-1, scores.shape[-1])
        for row in flat:
            # Masked keys are -inf (bool masks) or finfo.min (additive masks).
            finite = row[torch.isfinite(row) & (row > -1e30)]
            if finite.numel() <= k:
                continue
            sparse_rows += 1
            srt = torch.sort(finite, descending=True).values
            min_margin = min(min_margin, float(srt[k - 1] - srt[k]))
    # Scores are O(1); two f32 implementations differ by ~1e-6 at most, so 1e-5 is a safe gap.
    if not min_margin > 1e-5:
        sys.exit(f"a DSA selection has a near-tie at the top-k boundary (margin {min_margin}); pick other prompts")

    with_hf = {
        "source": "scripts/goldens/reference_glm5.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model": "glm5-tiny",
        "gen_model_seed": args.seed,
        "dtype": "float32",
        "index_topk": topk_cfg,
        "sparse_rows_checked": sparse_rows,
        "min_topk_margin": min_margin,
        "weight_sums": {
            k: float(sd[k].double().sum())
            for k in [
                "model.embed_tokens.weight",
                "model.layers.2.mlp.experts.5.down_proj.weight",
                "model.layers.0.self_attn.indexer.wq_b.weight",
            ]
        },
        "cases": cases,
    }
    with open(args.out, "w") as f:
        json.dump(with_hf, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out}: {len(cases)} prompts, {sparse_rows} sparse selections, min margin {min_margin:.3g}")


if __name__ == "__main__":
    main()
