#!/usr/bin/env bash
# What a lock cycle costs lockd itself, in instructions: as
# bench/redis-instructions.sh does for Redis, a figure that does not move
# with the machine's load, for comparing two builds of lockd.
#
# For each round and each lockd binary given (alternated), starts a
# redis-server of its own and the lockd under valgrind's callgrind
# (default settings, access log at info to a file; LOCKD_LOG in the
# environment sets another filter), warms it up with `lockd-bench cycle`
# for 3 s, zeroes the counters (callgrind_control), drives it for SECONDS
# with CLIENTS clients (NAMES in the environment: `distinct`, the default,
# a new name every cycle, or `reused`), and prints the instructions lockd
# ran per acquire+release cycle, in user space (the kernel's share of its
# socket reads and writes is not in it; `perf stat -e
# raw_syscalls:sys_enter,context-switches -p PID` counts those). lockd
# runs some 30 times slower under callgrind: a few hundred cycles a second
# is expected; the count per cycle does not depend on the rate.
# PROFILES=DIR (in the environment) keeps each run's callgrind dump there,
# for `callgrind_annotate --inclusive=yes --tree=caller`.
# Usage: bench/lockd-instructions.sh [ROUNDS] [SECONDS] [CLIENTS] [LOCKD...]
#   (defaults 2, 10, 4, target/release/lockd)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
seconds=${2:-10}
clients=${3:-4}
shift $(($# < 3 ? $# : 3))
names=${NAMES:-distinct}
. bench/lib.sh
scripts/ensure-deps.sh redis-server redis-cli curl python3 valgrind
build_bench $#
[ $# -gt 0 ] || set -- target/release/lockd
bench=target/release/lockd-bench
scratch

for round in $(seq "$rounds"); do
  for i in $(seq 0 $(($# - 1))); do
    bins=("$@")
    bin=${bins[$i]}
    run="$work/$round-$i"
    mkdir -p "$run"
    start_redis "$run"
    port=$(free_port)
    valgrind --tool=callgrind --callgrind-out-file="$run/callgrind.%p" \
      "$bin" serve --listen "127.0.0.1:$port" --redis-url "redis://127.0.0.1:$redis_port" \
      2>"$run/lockd.log" &
    lockd_pid=$!
    pids+=("$lockd_pid")
    timeout 120 bash -c "until curl -sf -H 'Host: localhost' http://127.0.0.1:$port/healthz >/dev/null; do sleep 0.3; done"
    "$bench" --server "http://127.0.0.1:$port" cycle --clients "$clients" --seconds 3 \
      --names "$names" >/dev/null
    callgrind_control -z "$lockd_pid" >/dev/null
    "$bench" --server "http://127.0.0.1:$port" --json "$run/cycle.json" cycle \
      --clients "$clients" --seconds "$seconds" --names "$names" >/dev/null
    callgrind_control -d "$lockd_pid" >/dev/null
    kill "$lockd_pid" "$redis_pid"
    wait "$lockd_pid" 2>/dev/null || true
    dump=$(ls "$run"/callgrind.*.1)
    if [ -n "${PROFILES:-}" ]; then
      mkdir -p "$PROFILES"
      cp "$dump" "$PROFILES/lockd-$i-round-$round.callgrind"
    fi
    python3 - "$run/cycle.json" "$dump" "$round" "$i" "$bin" <<'PY'
import json, re, sys
cycle = json.load(open(sys.argv[1]))
cycles = cycle["cycles_per_second"] * cycle["seconds"]
text = open(sys.argv[2]).read()
total = int(re.search(r"^(?:summary|totals): (\d+)", text, re.M).group(1))
print(f"round {sys.argv[3]}, lockd-{sys.argv[4]} ({sys.argv[5]}): "
      f"{cycles:.0f} cycles, {total / cycles:,.0f} instructions per cycle")
PY
  done
done
