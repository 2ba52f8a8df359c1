#!/usr/bin/env bash
# Redlock beside single-instance mode, in one run: starts 5 redis-servers and
# three lockd instances (over 1, 3 and 5 of them) on free loopback ports, runs
# the same uncontended `cycle` load against each, and prints throughput and
# latency. Stops everything it started.
# Usage: bench/redlock.sh [SECONDS] [CLIENTS]   (defaults 10, 16)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
clients=${2:-16}
scripts/ensure-deps.sh redis-server redis-cli
cargo build --release --locked --bin lockd --bin lockd-bench >&2

. bench/lib.sh
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for f in "$work"/redis-*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

urls=()
for i in 1 2 3 4 5; do
  port=$(free_port)
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work" --daemonize yes --pidfile "$work/redis-$i.pid" >/dev/null
  until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
  urls+=("redis://127.0.0.1:$port")
done

run_mode() {
  local label=$1; shift
  local port; port=$(free_port)
  local args=()
  for url in "$@"; do args+=(--redis-url "$url"); done
  LOCKD_LOG=warn target/release/lockd serve --listen "127.0.0.1:$port" "${args[@]}" &
  local pid=$!
  pids+=("$pid")
  until curl -sf "http://127.0.0.1:$port/readyz" >/dev/null; do sleep 0.05; done
  echo "== $label"
  target/release/lockd-bench --server "http://127.0.0.1:$port" \
    --json "$work/../lockd-cycle-$label.json" cycle --clients "$clients" --seconds "$seconds"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

run_mode single "${urls[0]}"
run_mode redlock-3 "${urls[@]:0:3}"
run_mode redlock-5 "${urls[@]}"
