#!/usr/bin/env bash
# Serves every crafted model file of `sparrow_fuzz::crafted` with the release `sparrow serve`
# and measures each refusal: exit status, wall time and peak resident memory (GNU time), the
# file's size, and whether the error names the expected problem. The first row is the
# baseline: the same binary refusing a path that does not exist (process start-up alone).
#
#   scripts/fuzz/crafted.sh [OUT_DIR]        # default: ~/.cache/sparrow/fuzz/crafted
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-$HOME/.cache/sparrow/fuzz/crafted}
mkdir -p "$out"
cargo build -q --release -p sparrow --bin sparrow
cargo run -q --release -p sparrow-fuzz --bin write_crafted -- "$out"
bin=target/release/sparrow

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo
echo "| file | bytes | exit | wall s | peak RSS MB | names the problem | error |"
echo "|---|---|---|---|---|---|---|"
row() {
    local name=$1 path=$2 expect=$3 size=$4
    local t
    t=$(mktemp)
    set +e
    /usr/bin/time -f '%e %M' -o "$t" "$bin" serve --port 0 --disable-autotune --model-path "$path" \
        > /dev/null 2> "$out/$name.stderr" < /dev/null
    local rc=$?
    set -e
    # GNU time writes "Command exited with non-zero status N" first when the command fails.
    read -r wall rss < <(tail -n 1 "$t")
    rm -f "$t"
    local named=no
    grep -qF -- "$expect" "$out/$name.stderr" && named=yes
    local msg
    msg=$(grep -m1 -E '^Error|error' "$out/$name.stderr" | cut -c1-160 | sed 's/|/\\|/g')
    printf '| %s | %s | %s | %s | %.1f | %s | %s |\n' "$name" "$size" "$rc" "$wall" "$(echo "$rss / 1024" | bc -l)" "$named" "$msg"
}
row baseline-missing-path /nonexistent/model.gguf "no such file" 0
for f in "$out"/*.gguf; do
    name=$(basename "$f" .gguf)
    row "$name" "$f" "$(cat "$out/$name.expect")" "$(stat -c %s "$f")"
done
