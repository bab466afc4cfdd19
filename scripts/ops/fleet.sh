#!/usr/bin/env bash
# A local data-parallel fleet: N `sparrow serve` workers on consecutive ports behind
# sglang-router (SGLang's router, `python -m sglang_router.launch_router`).
#
#   scripts/ops/fleet.sh N [serve flags...] [-- router flags...]
#   scripts/ops/fleet.sh 2 --page-size 16 -- --policy cache_aware
#
# Workers listen on 127.0.0.1:$WORKER_BASE_PORT.. (default 30001..), the router on
# $ROUTER_HOST:$ROUTER_PORT (default 127.0.0.1:30000). Each worker gets `--threads` =
# cores / N (at least 1) unless the serve flags set it. The router is installed with pip
# (sglang-router $ROUTER_VERSION, default 0.3.2) into a venv under the cache directory
# ($SPARROW_CACHE_DIR, else ~/.cache/sparrow) the first time. Logs and a `fleet.env` file
# (worker URLs and PIDs, router URL and PID) go to $FLEET_DIR (default: a new /tmp dir).
# The script stays in the foreground until Ctrl-C or SIGTERM, the router exits, or every
# worker has (one dead worker is left for the router to route around); then it stops them
# all. Binary: $SPARROW, else target/release/sparrow (built if missing).
set -euo pipefail

if [[ $# -lt 1 || ! "$1" =~ ^[1-9][0-9]*$ ]]; then
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
N=$1
shift
SERVE_ARGS=()
ROUTER_ARGS=()
seen_sep=0
for a in "$@"; do
    if [[ $seen_sep == 0 && "$a" == "--" ]]; then
        seen_sep=1
    elif [[ $seen_sep == 0 ]]; then
        SERVE_ARGS+=("$a")
    else
        ROUTER_ARGS+=("$a")
    fi
done

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${SPARROW_CACHE_DIR:-$HOME/.cache/sparrow}
ROUTER_VERSION=${ROUTER_VERSION:-0.3.2}
VENV=$CACHE/venvs/sglang-router-$ROUTER_VERSION
WORKER_BASE_PORT=${WORKER_BASE_PORT:-30001}
ROUTER_HOST=${ROUTER_HOST:-127.0.0.1}
ROUTER_PORT=${ROUTER_PORT:-30000}
FLEET_DIR=${FLEET_DIR:-$(mktemp -d /tmp/sparrow-fleet.XXXXXX)}
READY_TIMEOUT=${READY_TIMEOUT:-600}
mkdir -p "$FLEET_DIR"

SPARROW=${SPARROW:-$ROOT/target/release/sparrow}
if [[ ! -x "$SPARROW" ]]; then
    echo "fleet: building $SPARROW" >&2
    (cd "$ROOT" && cargo build --release -p sparrow)
fi

# A venv when Python can make one; else (no ensurepip) a plain --target directory.
ROUTER_PY=("$VENV/bin/python")
if [[ -d "$VENV/site" ]]; then
    ROUTER_PY=(env "PYTHONPATH=$VENV/site" python3)
fi
if ! "${ROUTER_PY[@]}" -c "import sglang_router" 2>/dev/null; then
    echo "fleet: installing sglang-router==$ROUTER_VERSION into $VENV" >&2
    rm -rf "$VENV"
    if python3 -m venv "$VENV" 2>/dev/null; then
        ROUTER_PY=("$VENV/bin/python")
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "sglang-router==$ROUTER_VERSION"
    else
        python3 -m pip install --quiet --disable-pip-version-check --target "$VENV/site" "sglang-router==$ROUTER_VERSION"
        ROUTER_PY=(env "PYTHONPATH=$VENV/site" python3)
    fi
fi

threads_given=0
for a in "${SERVE_ARGS[@]+"${SERVE_ARGS[@]}"}"; do
    case "$a" in
    --threads | --threads=*) threads_given=1 ;;
    --port | --port=* | --host | --host=*)
        echo "fleet: the fleet sets each worker's --host/--port (WORKER_BASE_PORT); drop $a" >&2
        exit 2
        ;;
    esac
done
# The router's Prometheus listener (default 0.0.0.0:29000) moves to ROUTER_PORT + 10000 (or
# below it) on loopback unless the router flags set it, so fleets on other ports can coexist.
prom=()
if ! printf '%s\n' "${ROUTER_ARGS[@]+"${ROUTER_ARGS[@]}"}" | grep -q -- '^--prometheus-port'; then
    prom_port=$((ROUTER_PORT + 10000))
    ((prom_port > 65535)) && prom_port=$((ROUTER_PORT - 10000))
    prom=(--prometheus-host 127.0.0.1 --prometheus-port "$prom_port")
fi
last_worker=$((WORKER_BASE_PORT + N - 1))
if ((ROUTER_PORT >= WORKER_BASE_PORT && ROUTER_PORT <= last_worker)) || ((last_worker > 65535)); then
    echo "fleet: workers on $WORKER_BASE_PORT..$last_worker and the router on $ROUTER_PORT do not fit" >&2
    exit 2
fi
cores=$(nproc)
per=$((cores / N))
((per < 1)) && per=1

PIDS=()
cleanup() {
    trap - EXIT INT TERM
    for p in "${PIDS[@]+"${PIDS[@]}"}"; do
        kill -TERM "$p" 2>/dev/null || true
    done
    sleep 1
    for p in "${PIDS[@]+"${PIDS[@]}"}"; do
        kill -KILL "$p" 2>/dev/null || true
    done
    wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Polls `check args...` every 0.5 s until it succeeds; gives up (showing `log`) when `pid`
# exits or READY_TIMEOUT passes. A check may set READY_DETAIL for the timeout message.
READY_DETAIL=""
wait_for() { # what pid log check args...
    local what=$1 pid=$2 log=$3
    shift 3
    local deadline=$((SECONDS + READY_TIMEOUT))
    until "$@"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "fleet: $what exited before it was ready; its log:" >&2
            tail -n 20 "$log" >&2 || true
            exit 1
        fi
        if ((SECONDS > deadline)); then
            echo "fleet: $what not ready after $READY_TIMEOUT s: $READY_DETAIL" >&2
            exit 1
        fi
        sleep 0.5
    done
}
http_ok() { # url
    READY_DETAIL="$1 does not answer 200"
    curl -sf -o /dev/null --max-time 2 "$1"
}
# `/readiness` answers 200 once a worker has been registered and found healthy; wait for all.
router_ready() { # url n
    local body healthy
    body=$(curl -s --max-time 2 "$1/readiness" || true)
    READY_DETAIL="fewer than $2 healthy workers: $body"
    healthy=$(sed -n 's/.*"healthy_workers":\([0-9]*\).*/\1/p' <<<"$body")
    [[ -n "$healthy" && "$healthy" -ge "$2" ]]
}

URLS=()
: >"$FLEET_DIR/fleet.env"
for ((i = 0; i < N; i++)); do
    port=$((WORKER_BASE_PORT + i))
    extra=()
    ((threads_given)) || extra=(--threads "$per")
    log="$FLEET_DIR/worker$i.log"
    "$SPARROW" serve --host 127.0.0.1 --port "$port" "${extra[@]+"${extra[@]}"}" \
        "${SERVE_ARGS[@]+"${SERVE_ARGS[@]}"}" >"$log" 2>&1 &
    PIDS+=($!)
    URLS+=("http://127.0.0.1:$port")
    echo "WORKER${i}_URL=http://127.0.0.1:$port" >>"$FLEET_DIR/fleet.env"
    echo "WORKER${i}_PID=$!" >>"$FLEET_DIR/fleet.env"
    echo "WORKER${i}_LOG=$log" >>"$FLEET_DIR/fleet.env"
done
for ((i = 0; i < N; i++)); do
    wait_for "worker $i" "${PIDS[$i]}" "$FLEET_DIR/worker$i.log" http_ok "${URLS[$i]}/health"
    echo "fleet: worker $i ready at ${URLS[$i]}" >&2
done

rlog="$FLEET_DIR/router.log"
"${ROUTER_PY[@]}" -m sglang_router.launch_router --host "$ROUTER_HOST" --port "$ROUTER_PORT" \
    --worker-urls "${URLS[@]}" "${prom[@]+"${prom[@]}"}" "${ROUTER_ARGS[@]+"${ROUTER_ARGS[@]}"}" >"$rlog" 2>&1 &
ROUTER_PID=$!
PIDS+=("$ROUTER_PID")
{
    echo "ROUTER_URL=http://$ROUTER_HOST:$ROUTER_PORT"
    echo "ROUTER_PID=$ROUTER_PID"
    echo "ROUTER_LOG=$rlog"
} >>"$FLEET_DIR/fleet.env"
wait_for "the router" "$ROUTER_PID" "$rlog" router_ready "http://$ROUTER_HOST:$ROUTER_PORT" "$N"
threads_note="threads $per each"
((threads_given)) && threads_note="threads as given"
echo "fleet: ready: router http://$ROUTER_HOST:$ROUTER_PORT -> ${URLS[*]} ($threads_note; logs $FLEET_DIR)" >&2
echo "READY=1" >>"$FLEET_DIR/fleet.env"

# Stay up until a signal, or until any member exits (a dead worker is the router's to
# route around; the fleet itself keeps running so a test can watch that).
while :; do
    if ! kill -0 "$ROUTER_PID" 2>/dev/null; then
        echo "fleet: the router exited" >&2
        exit 1
    fi
    alive=0
    for ((i = 0; i < N; i++)); do
        kill -0 "${PIDS[$i]}" 2>/dev/null && alive=$((alive + 1))
    done
    if ((alive == 0)); then
        echo "fleet: every worker has exited" >&2
        exit 1
    fi
    sleep 1
done
