#!/usr/bin/env bash
# Runs the libFuzzer targets of fuzz/ (cargo fuzz, nightly toolchain, AddressSanitizer) for a
# chosen time each and summarizes executions, coverage and findings per target.
#
#   scripts/fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]      # default: 1800 s, every target
#   FUZZ_JOBS=2 scripts/fuzz/run.sh 600 gguf_load             # 2 workers on one target
#
# Limits per input, the issue's bar: 1 s (-timeout=1), 2 GiB resident (-rss_limit_mb), and no
# single allocation over 256 MiB (-malloc_limit_mb): a parser that allocates by a count it read
# shows up as an OOM finding. The corpus grows outside the repo ($FUZZ_DIR, default
# ~/.cache/sparrow/fuzz): seeds come from `sparrow_fuzz::seeds` (write_seeds), the committed
# fuzz/regressions/<target>/ inputs are read as a second corpus. Findings land in
# $FUZZ_DIR/artifacts/<time>/<target>/; copy each into fuzz/regressions/<target>/ once fixed (CI's
# `cargo test -p sparrow-fuzz` replays them). The summary goes to stdout and to
# $FUZZ_DIR/summary-<time>.md.
set -euo pipefail
cd "$(dirname "$0")/../.."

secs=${1:-1800}
shift || true
all=(gguf_index gguf_load hf_checkpoint tokenizer_gguf tokenizer_json chat_template grammar sse_stream)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")
jobs=${FUZZ_JOBS:-1}
dir=${FUZZ_DIR:-$HOME/.cache/sparrow/fuzz}
mkdir -p "$dir"

command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cargo run -q -p sparrow-fuzz --bin write_seeds -- "$dir/corpus"
(cd fuzz && cargo +nightly fuzz build -O --features libfuzzer)

# Largest input per target: model files need room for a vocabulary and tensors.
max_len() {
    case $1 in
        gguf_index | gguf_load | hf_checkpoint | tokenizer_gguf | tokenizer_json) echo 131072 ;;
        chat_template) echo 16384 ;;
        *) echo 8192 ;;
    esac
}

stamp=$(date -u +%Y%m%dT%H%M%SZ)
summary="$dir/summary-$stamp.md"
{
    echo "# sparrow fuzz run $stamp"
    echo
    echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, jobs $jobs, $secs s per target"
    echo
    echo "| target | seconds | executions | exec/s | coverage (cov) | features (ft) | corpus | crashes | timeouts | OOMs |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
} > "$summary"

for t in "${targets[@]}"; do
    mkdir -p "$dir/corpus/$t" "$dir/artifacts/$stamp/$t" fuzz/regressions/"$t"
    log="$dir/log-$t-$stamp.txt"
    echo "== $t: $secs s, log $log" >&2
    start=$(date +%s)
    # Fork mode: FUZZ_JOBS child processes, and a finding (crash, timeout, OOM) is saved and
    # the run goes on, so one long run reports every kind of bug it meets, not the first.
    set +e
    (cd fuzz && cargo +nightly fuzz run -O --features libfuzzer "$t" "$dir/corpus/$t" "$PWD/regressions/$t" -- \
        -max_total_time="$secs" -timeout=1 -rss_limit_mb=2048 -malloc_limit_mb=256 -max_len="$(max_len "$t")" \
        -print_final_stats=1 -artifact_prefix="$dir/artifacts/$stamp/$t/" -fork="$jobs" -ignore_crashes=1 -ignore_ooms=1 \
        -ignore_timeouts=1) > "$log" 2>&1
    set -e
    elapsed=$(($(date +%s) - start))
    # Fork mode's status lines: "#<executions>: cov: <n> ft: <n> corp: <n> ...".
    last=$(grep -hE '^#[0-9]+' "$log" | tail -1)
    execs=$(sed -nE 's/^#([0-9]+).*/\1/p' <<< "$last")
    cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<< "$last")
    ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<< "$last")
    corp=$(ls "$dir/corpus/$t" | wc -l)
    crashes=$(ls "$dir/artifacts/$stamp/$t" | grep -c '^crash-' || true)
    timeouts=$(ls "$dir/artifacts/$stamp/$t" | grep -c '^timeout-' || true)
    ooms=$(ls "$dir/artifacts/$stamp/$t" | grep -c '^oom-' || true)
    rate=$((execs / (elapsed > 0 ? elapsed : 1)))
    echo "| $t | $elapsed | $execs | $rate | ${cov:-?} | ${ft:-?} | $corp | $crashes | $timeouts | $ooms |" >> "$summary"
done
cat "$summary"
