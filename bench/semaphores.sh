#!/usr/bin/env bash
# What a permit costs beside a lock (issue 17), in one run. Starts one
# redis-server and one lockd on it (release build, default settings, access
# log at info to a file, as bench/compare.sh), on free loopback ports. Then,
# ROUNDS times, alternating, `lockd-bench cycle` (uncontended acquire +
# release over keep-alive HTTP, CLIENTS clients for SECONDS) on locks, then
# on permits of semaphores of limit 5 (`--semaphore-limit 5`, one semaphore
# per client). During each it reads the CPU time (user + system, from
# /proc/PID/stat) of lockd and of redis-server, and prints, per round and
# mode, cycles/s and the CPU each used per cycle, in µs. JSON lands in OUT.
# Usage: bench/semaphores.sh [SECONDS] [CLIENTS] [ROUNDS] [OUT]
#        (defaults 5, 16, 3, target/bench-semaphores)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-5}
clients=${2:-16}
rounds=${3:-3}
out=${4:-${CARGO_TARGET_DIR:-target}/bench-semaphores}
scripts/ensure-deps.sh redis-server redis-cli python3
. bench/lib.sh
cargo build --release --locked --bin lockd --bin lockd-bench >&2
bin=${CARGO_TARGET_DIR:-target}/release
mkdir -p "$out"
rm -f "$out"/*.json "$out"/*.log
redis_port=$(free_port)
lockd_port=$(free_port)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
redis-server --bind 127.0.0.1 --port "$redis_port" --save "" --appendonly no \
  --logfile "$out/redis.log" &
redis_pid=$!
pids+=("$redis_pid")
for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
LOCKD_LOG=info "$bin/lockd" serve --listen "127.0.0.1:$lockd_port" \
  --redis-url "redis://127.0.0.1:$redis_port" 2>"$out/lockd.log" &
lockd_pid=$!
pids+=("$lockd_pid")
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$lockd_port/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
hz=$(getconf CLK_TCK)
for round in $(seq "$rounds"); do
  for mode in lock permit; do
    extra=()
    [ "$mode" = permit ] && extra=(--semaphore-limit 5)
    l0=$(proc_ticks "$lockd_pid"); r0=$(proc_ticks "$redis_pid")
    "$bin/lockd-bench" --server "http://127.0.0.1:$lockd_port" --json "$out/$mode-$round.json" \
      cycle --clients "$clients" --seconds "$seconds" "${extra[@]}" >/dev/null
    l1=$(proc_ticks "$lockd_pid"); r1=$(proc_ticks "$redis_pid")
    python3 - "$out/$mode-$round.json" "$mode" "$round" "$l0" "$l1" "$r0" "$r1" "$hz" <<'PY'
import json, sys
path, mode, rnd = sys.argv[1:4]
l0, l1, r0, r1, hz = map(float, sys.argv[4:9])
d = json.load(open(path))
n = d["cycles_per_second"] * d["seconds"]
d["lockd_cpu_us_per_cycle"] = (l1 - l0) / hz / n * 1e6
d["redis_cpu_us_per_cycle"] = (r1 - r0) / hz / n * 1e6
json.dump(d, open(path, "w"))
print(f"round {rnd} {mode:6}: {d['cycles_per_second']:7.0f} cycles/s, errors {d['errors']}, "
      f"lockd {d['lockd_cpu_us_per_cycle']:5.1f} us/cycle, redis {d['redis_cpu_us_per_cycle']:5.1f} us/cycle")
PY
  done
done
