#!/usr/bin/env bash
# What a lock cycle costs Redis, in instructions: a figure that does not
# move with the machine's load, for comparing two versions of the Lua
# scripts (CPU time on this 2-core shared machine moves by a third from one
# round to the next; an instruction count by well under 1%).
#
# Starts one redis-server under valgrind's callgrind (which counts the
# instructions Redis runs, in user space: the kernel's share of a socket
# read or write is not in it) and, against it, in turn:
#   - raw: `lockd-bench raw-cycle`, SET NX PX then a compare-and-delete
#     script straight on Redis: the floor's Redis commands;
#   - each lockd binary given (release build, default settings), and the
#     last one again with --history-length 0 (lockd-nohistory);
#   - with LEASE_WRITES=1 (environment; locks only), `lockd-bench
#     null-server --writes lease` and `--writes lease-history`: the least
#     Redis work an exclusive lease needs, without and with its history
#     (docs/performance.md);
# each driven by `lockd-bench cycle` (CLIENTS clients, SECONDS long; NAMES,
# in the environment, `reused` (the default: each client its own name) or
# `distinct` (a new name every cycle); KIND `lock` (the default), `shared`
# or `run`: a shared lock's cycle, a run's start and complete; raw is
# measured for locks alone). The counters are zeroed before each and read after
# (callgrind_control): instructions per acquire+release cycle.
# Redis runs some 50 times slower under callgrind, so a few hundred cycles
# a second is expected; the count per cycle does not depend on the rate.
# PROFILES=DIR (in the environment) keeps each target's callgrind dump
# there as DIR/LABEL.callgrind, for `callgrind_annotate --inclusive=yes`.
# Usage: bench/redis-instructions.sh [SECONDS] [CLIENTS] [LOCKD...]
#   (defaults 5, 4, target/release/lockd)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-5}
clients=${2:-4}
shift $(($# < 2 ? $# : 2))
. bench/lib.sh
scripts/ensure-deps.sh redis-server redis-cli curl python3 valgrind
build_bench $#
[ $# -gt 0 ] || set -- target/release/lockd
bench=target/release/lockd-bench
scratch

start_callgrind_redis
redis_url="redis://127.0.0.1:$redis_port"

# Instructions Redis ran since the last zeroing: the newest dump's total.
instructions() {
  callgrind_control -d "$redis_pid" >/dev/null 2>&1
  awk '/^(summary|totals):/ { n = $2 } END { print n }' \
    "$(ls -t "$work"/callgrind."$redis_pid".* | head -1)"
}

# measure LABEL COMMAND...: COMMAND writes the run's JSON to $work/run.json.
results=()
measure() {
  local label=$1
  shift
  callgrind_control -z "$redis_pid" >/dev/null 2>&1
  "$@" >/dev/null
  local total
  total=$(instructions)
  if [ -n "${PROFILES:-}" ]; then
    mkdir -p "$PROFILES"
    cp "$(ls -t "$work"/callgrind."$redis_pid".* | head -1)" "$PROFILES/$label.callgrind"
  fi
  results+=("$label $total $(python3 -c 'import json,sys; r = json.load(open(sys.argv[1])); print(r["cycles_per_second"] * r["seconds"])' "$work/run.json")")
}

names=${NAMES:-reused}
kind=${KIND:-lock}
if [ "$kind" = lock ]; then
  measure raw "$bench" --json "$work/run.json" raw-cycle --redis-url "$redis_url" \
    --clients "$clients" --seconds "$seconds"
fi
# serve_run LABEL COMMAND...: COMMAND serves HTTP on $port (set by the
# caller) until killed, its stderr in $work/LABEL.log; measured after a
# second's warm-up, so that loading the scripts into Redis (the first
# target's alone: Redis keeps them) is not counted.
serve_run() {
  local label=$1
  shift
  "$@" 2>"$work/$label.log" &
  local pid=$!
  pids+=("$pid")
  until curl -sf "http://127.0.0.1:$port/readyz" >/dev/null; do sleep 0.1; done
  "$bench" --server "http://127.0.0.1:$port" --json "$work/warm.json" \
    cycle --clients 1 --seconds 1 --names "$names" --kind "$kind" >/dev/null
  measure "$label" "$bench" --server "http://127.0.0.1:$port" --json "$work/run.json" \
    cycle --clients "$clients" --seconds "$seconds" --names "$names" --kind "$kind"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}
if [ "${LEASE_WRITES:-0}" = 1 ] && [ "$kind" = lock ]; then
  for writes in lease lease-history; do
    port=$(free_port)
    serve_run "$writes-writes" "$bench" null-server --listen "127.0.0.1:$port" \
      --redis-url "$redis_url" --writes "$writes"
  done
fi
# lockd_run LABEL BIN [FLAG...]: a lockd (release build) with FLAGs.
lockd_run() {
  local label=$1 bin=$2
  shift 2
  port=$(free_port)
  serve_run "$label" "$bin" serve --listen "127.0.0.1:$port" --redis-url "$redis_url" "$@"
}
for i in $(seq 1 $#); do
  label=lockd$([ $# -gt 1 ] && echo "-$((i - 1))" || true)
  lockd_run "$label" "${!i}"
done
lockd_run lockd-nohistory "${!#}" --history-length 0

echo
echo "$kind cycles, $names names, $clients clients"
printf '%-22s %14s %10s %22s\n' target instructions cycles "Redis instr. per cycle"
for row in "${results[@]}"; do
  set -- $row
  printf '%-22s %14s %10.0f %22.0f\n' "$1" "$2" "$3" "$(python3 -c "print($2 / max($3, 1))")"
done
