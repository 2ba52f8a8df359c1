#!/usr/bin/env bash
# lockd beside raw Redis, in one run: rates and latency. Starts one redis-server, one
# lockd (release build, default settings, logs to a file) and two floors
# (`lockd-bench null-server`: a bare axum server with fixed answers; floor 1
# has nothing behind it, floor 2 sends each request's raw command to the same
# Redis over one multiplexed connection), all on free loopback ports. Then:
#   1. idle RSS of lockd;
#   2. back to back: raw Redis (SET NX PX + compare-and-delete script, CLIENTS
#      connections), floor 1, floor 2 and lockd `cycle` (acquire + release
#      over HTTP, CLIENTS keep-alive clients), at full speed;
#   3. lockd, floor 1 and floor 2 again at half lockd's peak rate (latency);
#   4. lockd `contended`: 32 clients on 4 names, 5 ms holds, wait_ms 2000,
#      with the mutual-exclusion check;
#   5. lockd `handoff`: release-to-grant latency with server-side waiting.
# Then prints each figure beside its aim, lockd's rate as a ratio of raw
# Redis's. No lock service speaking HTTP in front of Redis can beat floor 2
# on this machine: its ratio to raw Redis is the ceiling for lockd's, and its
# p99 the floor for lockd's. Figures from one run on a shared machine move
# by 10-20%; compare ratios, not absolute rates. JSON lands in OUT.
# Usage: bench/throughput.sh [SECONDS] [CLIENTS] [OUT]   (defaults 10, 16, target/bench)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
clients=${2:-16}
out=${3:-target/bench}
scripts/ensure-deps.sh redis-server redis-cli curl python3
cargo build --release --locked --bin lockd --bin lockd-bench >&2
mkdir -p "$out"

. bench/lib.sh
redis_port=$(free_port)
lockd_port=$(free_port)
null_port=$(free_port)
null_redis_port=$(free_port)
work=$(mktemp -d)
lockd_pid=""
null_pid=""
null_redis_pid=""
cleanup() {
  [ -n "$null_redis_pid" ] && kill "$null_redis_pid" 2>/dev/null
  [ -n "$lockd_pid" ] && kill "$lockd_pid" 2>/dev/null
  [ -n "$null_pid" ] && kill "$null_pid" 2>/dev/null
  [ -f "$work/redis.pid" ] && kill "$(cat "$work/redis.pid")" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$work" --daemonize yes --pidfile "$work/redis.pid" >/dev/null
until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.05; done

target/release/lockd serve --listen "127.0.0.1:$lockd_port" \
  --redis-url "redis://127.0.0.1:$redis_port" 2>"$out/lockd.log" &
lockd_pid=$!
until curl -sf "http://127.0.0.1:$lockd_port/readyz" >/dev/null; do sleep 0.05; done
sleep 1
idle_rss_kib=$(awk '/^VmRSS:/ {print $2}' "/proc/$lockd_pid/status")
echo "{\"idle_rss_bytes\": $((idle_rss_kib * 1024))}" >"$out/idle.json"
echo "lockd idle RSS: $((idle_rss_kib / 1024)) MiB"

target/release/lockd-bench null-server --listen "127.0.0.1:$null_port" 2>/dev/null &
null_pid=$!
target/release/lockd-bench null-server --listen "127.0.0.1:$null_redis_port" \
  --redis-url "redis://127.0.0.1:$redis_port" 2>/dev/null &
null_redis_pid=$!
for port in "$null_port" "$null_redis_port"; do
  until curl -s -o /dev/null "http://127.0.0.1:$port/"; do sleep 0.05; done
done

# The rates to compare run back to back, so that the machine's other load
# weighs on them alike.
bench="target/release/lockd-bench --server http://127.0.0.1:$lockd_port"
floor1="target/release/lockd-bench --server http://127.0.0.1:$null_port"
floor2="target/release/lockd-bench --server http://127.0.0.1:$null_redis_port"
echo; $bench --json "$out/raw.json" raw-cycle --redis-url "redis://127.0.0.1:$redis_port" \
  --clients "$clients" --seconds "$seconds"
echo; echo "Floor 1: bare HTTP server, nothing behind it"
$floor1 --json "$out/null.json" cycle --clients "$clients" --seconds "$seconds"
echo; echo "Floor 2: bare HTTP server sending the raw-cycle commands to Redis"
$floor2 --json "$out/null-redis.json" cycle --clients "$clients" --seconds "$seconds"
echo; echo "lockd"
$bench --json "$out/cycle.json" cycle --clients "$clients" --seconds "$seconds"
half=$(python3 -c "import json; print(round(json.load(open('$out/cycle.json'))['cycles_per_second'] / 2))")
echo; echo "At half lockd's peak: lockd, floor 1, floor 2"
$bench --json "$out/cycle-half.json" cycle --clients "$clients" --seconds "$seconds" --rate "$half"
echo; $floor1 --json "$out/null-half.json" cycle --clients "$clients" --seconds "$seconds" --rate "$half"
echo; $floor2 --json "$out/null-redis-half.json" cycle --clients "$clients" --seconds "$seconds" --rate "$half"
echo; $bench --json "$out/contended.json" contended --clients 32 --names 4 --hold-ms 5 \
  --wait-ms 2000 --seconds "$seconds"
echo; $bench --json "$out/handoff.json" handoff --rounds 1000 --poll-rounds 20


echo
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
load = lambda name: json.load(open(f"{out}/{name}.json"))
raw, cycle, half, cont, hand, idle, null, null_half, nr, nr_half = (load(n) for n in
    ("raw", "cycle", "cycle-half", "contended", "handoff", "idle", "null", "null-half",
     "null-redis", "null-redis-half"))
rate = lambda run: run["cycles_per_second"]
ratio = rate(cycle) / rate(raw)
ceiling = rate(nr) / rate(raw)
p99 = lambda run: max(run["latency"]["acquire"]["p99_ms"], run["latency"]["release"]["p99_ms"])
p99_half, p99_floor = p99(half), p99(nr_half)
handoff_p99 = hand["server_wait"]["p99_ms"]
rss_mb = idle["idle_rss_bytes"] / 1e6
rows = [
    ("raw Redis cycles/s", f"{raw['cycles_per_second']:.0f}", "", None),
    ("lockd cycles/s", f"{cycle['cycles_per_second']:.0f}", "", None),
    ("bare HTTP cycles/s (floor 1)", f"{rate(null):.0f}", "", None),
    ("bare HTTP + Redis cycles/s (floor 2)", f"{rate(nr):.0f}", "", None),
    ("lockd / raw Redis", f"{ratio:.2f}", ">= 0.40", ratio >= 0.40),
    ("  ceiling: floor 2 / raw Redis", f"{ceiling:.2f}", "", None),
    ("  lockd / floor 2", f"{rate(cycle) / rate(nr):.2f}", "", None),
    (f"p99 at half peak ({rate(half):.0f}/s)", f"{p99_half:.2f} ms", "< 2 ms", p99_half < 2),
    ("  floor 1 p99, same rate", f"{p99(null_half):.2f} ms", "", None),
    ("  floor 2 p99, same rate", f"{p99_floor:.2f} ms", "", None),
    ("handoff p99", f"{handoff_p99:.2f} ms", "< 5 ms", handoff_p99 < 5),
    ("idle RSS", f"{rss_mb:.1f} MB", "< 30 MB", rss_mb < 30),
    ("contended grants/s", f"{cont['grants_per_second']:.0f}", "", None),
    ("mutual-exclusion violations", str(cont["violations"]), "0", cont["violations"] == 0),
    ("errors (cycle, contended)", str(cycle["errors"] + half["errors"] + cont["errors"]), "0",
     cycle["errors"] + half["errors"] + cont["errors"] == 0),
]
print(f"{'figure':<34} {'measured':>12}  {'aim':<8}")
for label, value, aim, ok in rows:
    verdict = "" if ok is None else ("met" if ok else "MISSED")
    print(f"{label:<34} {value:>12}  {aim:<8} {verdict}")
json.dump({"ratio": ratio, "http_ceiling_ratio": ceiling, "p99_half_peak_ms": p99_half,
           "floor_p99_half_peak_ms": p99_floor, "lockd_over_floor": rate(cycle) / rate(nr), "handoff_p99_ms": handoff_p99,
           "idle_rss_mb": rss_mb, "violations": cont["violations"]},
          open(f"{out}/summary.json", "w"), indent=2)
PY
