"""The OpenAI Python SDK's `embeddings.create` against `sparrow serve --model-path all-minilm-l6-v2`.

The SDK asks for base64 when the caller names no `encoding_format` and decodes it itself (numpy
when installed, else the `array` module); with `encoding_format="float"` it takes the JSON floats.
Prints both (and the usage) as JSON for the Rust test to compare. Usage: embeddings.py PORT
"""
import json
import sys

from openai import OpenAI

client = OpenAI(base_url=f"http://127.0.0.1:{sys.argv[1]}/v1", api_key="none")
model = client.models.list().data[0].id
texts = ["The capital of France is Paris.", "Rust is a systems programming language.", "A cat sat on the mat."]
default = client.embeddings.create(model=model, input=texts)
floats = client.embeddings.create(model=model, input=texts, encoding_format="float")
short = client.embeddings.create(model=model, input=texts[0], dimensions=32)
print(json.dumps({
    "model": model,
    "default": [list(map(float, d.embedding)) for d in default.data],
    "float": [d.embedding for d in floats.data],
    "index": [d.index for d in default.data],
    "object": [default.object] + [d.object for d in default.data],
    "usage": [default.usage.prompt_tokens, default.usage.total_tokens],
    "short": short.data[0].embedding,
}))
