#!/usr/bin/env bash
# lockd beside raw Redis, in one run (issue 7). Starts one redis-server and
# one lockd (release build, default settings, logs to a file) on free
# loopback ports, then measures:
#   1. idle RSS of lockd;
#   2. raw Redis: SET NX PX + compare-and-delete script, CLIENTS connections;
#   3. lockd `cycle` (acquire + release over HTTP), CLIENTS keep-alive clients;
#   4. lockd `cycle` again at half the peak rate it just reached (latency);
#   5. lockd `contended`: 32 clients on 4 names, 5 ms holds, wait_ms 2000,
#      with the mutual-exclusion check;
#   6. lockd `handoff`: release-to-grant latency with server-side waiting.
# Then prints each figure beside its aim, lockd's rate as a ratio of raw
# Redis's. Figures from one run on a shared machine move by 10-20%; compare
# ratios, not absolute rates. JSON of every scenario lands in OUT.
# Usage: bench/compare.sh [SECONDS] [CLIENTS] [OUT]   (defaults 10, 16, target/bench)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
clients=${2:-16}
out=${3:-target/bench}
scripts/ensure-deps.sh redis-server redis-cli curl python3
cargo build --release --locked --bin lockd --bin lockd-bench >&2
mkdir -p "$out"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
redis_port=$(free_port)
lockd_port=$(free_port)
work=$(mktemp -d)
lockd_pid=""
cleanup() {
  [ -n "$lockd_pid" ] && kill "$lockd_pid" 2>/dev/null
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

bench="target/release/lockd-bench --server http://127.0.0.1:$lockd_port"
echo; $bench --json "$out/raw.json" raw-cycle --redis-url "redis://127.0.0.1:$redis_port" \
  --clients "$clients" --seconds "$seconds"
echo; $bench --json "$out/cycle.json" cycle --clients "$clients" --seconds "$seconds"
half=$(python3 -c "import json; print(round(json.load(open('$out/cycle.json'))['cycles_per_second'] / 2))")
echo; $bench --json "$out/cycle-half.json" cycle --clients "$clients" --seconds "$seconds" --rate "$half"
echo; $bench --json "$out/contended.json" contended --clients 32 --names 4 --hold-ms 5 \
  --wait-ms 2000 --seconds "$seconds"
echo; $bench --json "$out/handoff.json" handoff --rounds 1000 --poll-rounds 20

echo
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
load = lambda name: json.load(open(f"{out}/{name}.json"))
raw, cycle, half, cont, hand, idle = (load(n) for n in
    ("raw", "cycle", "cycle-half", "contended", "handoff", "idle"))
ratio = cycle["cycles_per_second"] / raw["cycles_per_second"]
p99_half = max(half["latency"]["acquire"]["p99_ms"], half["latency"]["release"]["p99_ms"])
handoff_p99 = hand["server_wait"]["p99_ms"]
rss_mb = idle["idle_rss_bytes"] / 1e6
rows = [
    ("raw Redis cycles/s", f"{raw['cycles_per_second']:.0f}", "", None),
    ("lockd cycles/s", f"{cycle['cycles_per_second']:.0f}", "", None),
    ("lockd / raw Redis", f"{ratio:.2f}", ">= 0.40", ratio >= 0.40),
    (f"p99 at half peak ({half['cycles_per_second']:.0f}/s)", f"{p99_half:.2f} ms", "< 2 ms", p99_half < 2),
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
json.dump({"ratio": ratio, "p99_half_peak_ms": p99_half, "handoff_p99_ms": handoff_p99,
           "idle_rss_mb": rss_mb, "violations": cont["violations"]},
          open(f"{out}/summary.json", "w"), indent=2)
PY
