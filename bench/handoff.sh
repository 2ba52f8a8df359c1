#!/usr/bin/env bash
# Measures waiting (issue 3): handoff latency beside a polling client, and
# the cost of 10,000 parked waiters. Starts its own redis-server and lockd
# (release build) on free loopback ports and stops them at the end.
# Usage: bench/handoff.sh [ROUNDS] [WAITERS]   (defaults 1000, 10000)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-1000}
waiters=${2:-10000}
scripts/ensure-deps.sh redis-server redis-cli
cargo build --release --locked --bin lockd --bin lockd-bench >&2
ulimit -n "$(ulimit -Hn)"  # 10,000 waiters need 10,000 sockets on each side

. bench/lib.sh
redis_port=$(free_port)
lockd_port=$(free_port)
work=$(mktemp -d)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$work" --daemonize yes --pidfile "$work/redis.pid" >/dev/null
trap 'kill $(cat "$work/redis.pid") 2>/dev/null; kill "$lockd_pid" 2>/dev/null; rm -rf "$work"' EXIT
until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.05; done

LOCKD_LOG=warn target/release/lockd serve --listen "127.0.0.1:$lockd_port" \
  --redis-url "redis://127.0.0.1:$redis_port" --max-waiters "$((waiters + 100))" &
lockd_pid=$!
until curl -sf "http://127.0.0.1:$lockd_port/readyz" >/dev/null; do sleep 0.05; done

bench="target/release/lockd-bench --server http://127.0.0.1:$lockd_port"
$bench --json "$work/../lockd-handoff.json" handoff --rounds "$rounds"
$bench --json "$work/../lockd-waiters.json" waiters --count "$waiters" --pid "$lockd_pid" \
  --redis-url "redis://127.0.0.1:$redis_port"
echo "pool size 16 + 1 subscriber = 17 connections at most"
