#!/usr/bin/env bash
# How soon readers queued behind a writer get in at its release
# (`lockd-bench readers`), for one or more lockd binaries, alternated round
# by round: each round starts a redis-server and the lockd (default
# settings, access log at info to a file) on free loopback ports, runs
# `readers` and stops them. Prints each round's table; compare the medians
# of the rounds of each binary.
# Usage: bench/readers.sh [ROUNDS] [COUNT] [LOCKD...]
#   (defaults 3 rounds, 50 readers, target/release/lockd)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
count=${2:-50}
shift $(($# < 2 ? $# : 2))
. bench/lib.sh
scripts/ensure-deps.sh redis-server redis-cli curl python3
build_bench $#
[ $# -gt 0 ] || set -- target/release/lockd
scratch

for round in $(seq "$rounds"); do
  i=0
  for bin in "$@"; do
    run="$work/$round-$i"
    mkdir -p "$run"
    start_redis "$run"
    port=$(free_port)
    "$bin" serve --listen "127.0.0.1:$port" --redis-url "redis://127.0.0.1:$redis_port" \
      2>"$run/lockd.log" &
    lockd_pid=$!
    pids+=("$lockd_pid")
    until curl -sf "http://127.0.0.1:$port/readyz" >/dev/null; do sleep 0.05; done
    echo "round $round, lockd-$i ($bin):"
    target/release/lockd-bench --server "http://127.0.0.1:$port" readers \
      --rounds 30 --count "$count"
    kill "$lockd_pid" "$redis_pid"
    wait "$lockd_pid" "$redis_pid" 2>/dev/null || true
    i=$((i + 1))
  done
done
