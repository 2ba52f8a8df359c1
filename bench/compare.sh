#!/usr/bin/env bash
# What a lock costs: CPU per acquire+release cycle of lockd, of the floor
# and of etcd's lock API, in one run, with the waiters' memory and the
# handoff latency. On this 2-core shared machine absolute figures move with
# the other tenants' load, so the runs alternate and the medians are
# compared, as ratios against the floor measured in the same run.
#
# Starts one redis-server, the floor (`lockd-bench null-server
# --redis-url`: a bare axum server sending each request's one Redis command
# over one multiplexed connection), each lockd binary given (release build,
# default settings, access log at info to a file) and, when the `etcd`
# binary is installed (Debian's etcd-server), one etcd, all on free
# loopback ports. Then:
#   1. ROUNDS rounds; in each, `lockd-bench cycle` (CLIENTS keep-alive
#      clients, each on its own name, SECONDS long) against the floor, each
#      lockd and etcd (`etcd-cycle`: lease, lock, unlock through its HTTP
#      gateway) in turn. CPU (user + system) of the server and of
#      redis-server is read from /proc before and after: CPU per cycle.
#   2. `lockd-bench waiters`: WAITERS requests parked on one lock (each on
#      its own keep-alive connection), against a lockd started alone with
#      --max-waiters WAITERS: RSS parked, Redis connections (and those
#      subscribed), the drain rate in fence order, and RSS 20 s after the
#      drain with every connection closed.
#   3. `lockd-bench handoff`: release request sent to the next waiter's 201.
# Prints every round, the medians, and the ratios beside the aims.
# Usage: bench/compare.sh [ROUNDS] [SECONDS] [CLIENTS] [OUT] [LOCKD...]
#   (defaults 3, 10, 16, target/bench/compare, target/release/lockd). More
#   than one lockd binary (an older build, say) are measured side by side,
#   alternated in each round; the waiters and handoff runs use the last.
#   WAITERS (environment, default 10000) sets the waiters run's size;
#   WAITERS=0 skips the waiters and handoff runs (for a quick A/B of CPU).
#   HISTORY_OFF=1 also measures the last lockd with --history-length 0
#   (column lockd-nohistory), alternated with the others, and prints what
#   the history costs: lockd's CPU and Redis CPU over those without it.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
seconds=${2:-10}
clients=${3:-16}
out=${4:-target/bench/compare}
shift $(($# < 4 ? $# : 4))
waiters=${WAITERS:-10000}
scripts/ensure-deps.sh redis-server redis-cli curl python3
. bench/lib.sh
if [ $# -eq 0 ]; then
  cargo build --release --locked --bin lockd --bin lockd-bench >&2
  set -- target/release/lockd
else
  cargo build --release --locked --bin lockd-bench >&2
fi
bins=("$@")
bench=target/release/lockd-bench
mkdir -p "$out"
rm -f "$out"/*.json

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  [ -f "$work/redis.pid" ] && kill "$(cat "$work/redis.pid")" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
up() { until curl -s -o /dev/null "$1"; do sleep 0.05; done; }

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$work" --daemonize yes --pidfile "$work/redis.pid" >/dev/null
until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.05; done
redis_pid=$(cat "$work/redis.pid")
redis_url="redis://127.0.0.1:$redis_port"

# Each target: a label, its base URL and the process whose CPU is its own.
labels=(floor)
floor_port=$(free_port)
"$bench" null-server --listen "127.0.0.1:$floor_port" --redis-url "$redis_url" 2>/dev/null &
pids+=($!); servers=("http://127.0.0.1:$floor_port"); server_pids=($!)
for i in "${!bins[@]}"; do
  port=$(free_port)
  "${bins[$i]}" serve --listen "127.0.0.1:$port" --redis-url "$redis_url" \
    2>"$out/lockd-$i.log" &
  pids+=($!); servers+=("http://127.0.0.1:$port"); server_pids+=($!)
  labels+=("lockd$([ ${#bins[@]} -gt 1 ] && echo "-$i" || true)")
done
lockd_count=${#bins[@]}
if [ "${HISTORY_OFF:-0}" = 1 ]; then
  port=$(free_port)
  "${bins[$((${#bins[@]} - 1))]}" serve --listen "127.0.0.1:$port" --redis-url "$redis_url" \
    --history-length 0 2>"$out/lockd-nohistory.log" &
  pids+=($!); servers+=("http://127.0.0.1:$port"); server_pids+=($!)
  labels+=(lockd-nohistory)
  lockd_count=$((lockd_count + 1))
fi
if command -v etcd >/dev/null; then
  etcd_port=$(free_port); peer_port=$(free_port)
  etcd --name bench --data-dir "$work/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "bench=http://127.0.0.1:$peer_port" >"$out/etcd.log" 2>&1 &
  pids+=($!); servers+=("http://127.0.0.1:$etcd_port"); server_pids+=($!); labels+=(etcd)
else
  echo "note: etcd is not installed (Debian: apt-get install etcd-server); etcd's column is skipped"
fi
for url in "${servers[@]}"; do up "$url/"; done
for url in "${servers[@]:1:$lockd_count}"; do
  until curl -sf "$url/readyz" >/dev/null; do sleep 0.05; done
done

for round in $(seq 1 "$rounds"); do
  for i in "${!labels[@]}"; do
    label=${labels[$i]}
    s0=$(proc_ticks "${server_pids[$i]}"); r0=$(proc_ticks "$redis_pid")
    echo; echo "== round $round: $label"
    if [ "$label" = etcd ]; then
      "$bench" --json "$out/$label-$round.json" etcd-cycle --endpoint "${servers[$i]}" \
        --clients "$clients" --seconds "$seconds"
    else
      "$bench" --server "${servers[$i]}" --json "$out/$label-$round.json" cycle \
        --clients "$clients" --seconds "$seconds"
    fi
    s1=$(proc_ticks "${server_pids[$i]}"); r1=$(proc_ticks "$redis_pid")
    echo "{\"server_ticks\": $((s1 - s0)), \"redis_ticks\": $((r1 - r0)), \"hz\": $(getconf CLK_TCK)}" \
      >"$out/$label-$round.cpu.json"
  done
done
for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
pids=()

if [ "$waiters" -gt 0 ]; then
  echo; echo "== waiters: $waiters parked on one lock"
  port=$(free_port)
  "${bins[$((${#bins[@]} - 1))]}" serve --listen "127.0.0.1:$port" --redis-url "$redis_url" \
    --max-waiters "$waiters" 2>"$out/lockd-waiters.log" &
  pids+=($!); lockd_pid=$!
  until curl -sf "http://127.0.0.1:$port/readyz" >/dev/null; do sleep 0.05; done
  "$bench" --server "http://127.0.0.1:$port" --json "$out/waiters.json" waiters \
    --count "$waiters" --pid "$lockd_pid" --redis-url "$redis_url" --settle-seconds 20
  echo; echo "== handoff"
  "$bench" --server "http://127.0.0.1:$port" --json "$out/handoff.json" handoff \
    --rounds 1000 --poll-rounds 0
fi

echo
python3 - "$out" "$rounds" "${labels[@]}" <<'PY'
import json, statistics, sys
out, rounds, labels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
load = lambda name: json.load(open(f"{out}/{name}.json"))
rows = {}
for label in labels:
    runs = []
    for r in range(1, rounds + 1):
        run, cpu = load(f"{label}-{r}"), load(f"{label}-{r}.cpu")
        cycles = run["cycles_per_second"] * run["seconds"]
        per = lambda ticks: ticks / cpu["hz"] / max(cycles, 1) * 1e6
        runs.append((per(cpu["server_ticks"]), per(cpu["redis_ticks"]),
                     run["cycles_per_second"], run["errors"]))
    rows[label] = runs
print(f"{'per acquire+release cycle':<28}" + "".join(f"{l:>14}" for l in labels))
for r in range(rounds):
    print(f"  round {r + 1}: server CPU µs   " + "".join(f"{rows[l][r][0]:>14.1f}" for l in labels))
    print(f"  round {r + 1}: Redis CPU µs    " + "".join(
        f"{'-' if l == 'etcd' else format(rows[l][r][1], '.1f'):>14}" for l in labels))
med = {l: [statistics.median(x[k] for x in rows[l]) for k in range(3)] for l in labels}
print(f"{'median server CPU µs':<28}" + "".join(f"{med[l][0]:>14.1f}" for l in labels))
print(f"{'median Redis CPU µs':<28}" + "".join(
    f"{'-' if l == 'etcd' else format(med[l][1], '.1f'):>14}" for l in labels))
print(f"{'median cycles/s':<28}" + "".join(f"{med[l][2]:>14.0f}" for l in labels))
errors = sum(x[3] for l in labels for x in rows[l])
import os
w = load("waiters") if os.path.exists(f"{out}/waiters.json") else None
h = load("handoff") if w else None
mb = lambda b: b / 1e6
checks = []
for l in labels:
    if not l.startswith("lockd"):
        continue
    cpu, redis = med[l][0] / med["floor"][0], med[l][1] / med["floor"][1]
    checks += [(f"{l} CPU / floor's", f"{cpu:.2f}", "<= 2", cpu <= 2),
               (f"{l} Redis CPU / floor's", f"{redis:.2f}", "<= 2.5", redis <= 2.5)]
    if "etcd" in med:
        checks.append((f"  {l} CPU / etcd's", f"{med[l][0] / med['etcd'][0]:.2f}", "", None))
if "lockd-nohistory" in med:
    on = [l for l in labels if l.startswith("lockd") and l != "lockd-nohistory"][-1]
    off = med["lockd-nohistory"]
    cpu, redis = med[on][0] / off[0], med[on][1] / off[1]
    checks += [(f"history on / off: {on} CPU", f"{cpu:.2f}", "<= 1.1", cpu <= 1.1),
               ("history on / off: Redis CPU", f"{redis:.2f}", "<= 1.1", redis <= 1.1)]
hand = h["server_wait_from_release_sent"] if h else None
checks += [] if not w else [
    (f"{w['waiters']} waiters: RSS parked", f"{mb(w['parked_rss_bytes']):.1f} MB", "<= 150 MB",
     mb(w["parked_rss_bytes"]) <= 150),
    ("  per waiter", f"{(w['parked_rss_bytes'] - w['idle_rss_bytes']) / w['waiters'] / 1e3:.1f} kB", "", None),
    ("  peak RSS", f"{mb(w['peak_rss_bytes']):.1f} MB", "", None),
    ("  drain", f"{w['handoffs_per_second']:.0f} handoffs/s", ">= 2000", w["handoffs_per_second"] >= 2000),
    ("  fence-order violations", str(w["violations"]), "0", w["violations"] == 0),
    ("  Redis connections subscribed", str(w["redis_subscribed_connections"]), "1",
     w["redis_subscribed_connections"] == 1),
    ("  Redis connections in all", f"{w['redis_connections']} (idle {w['redis_connections_before']})", "", None),
    (f"  RSS {w['settle_seconds']:.0f} s after the drain", f"{mb(w['settled_rss_bytes']):.1f} MB", "<= 64 MB",
     mb(w["settled_rss_bytes"]) <= 64),
    ("handoff p50 (release sent -> 201)", f"{hand['p50_ms']:.2f} ms", "<= 0.5 ms", hand["p50_ms"] <= 0.5),
    ("handoff p99", f"{hand['p99_ms']:.2f} ms", "<= 2 ms", hand["p99_ms"] <= 2),
]
checks.append(("errors in the cycle runs", str(errors), "0", errors == 0))
print()
print(f"{'figure':<38} {'measured':>18}  {'aim':<10}")
for label, value, aim, ok in checks:
    verdict = "" if ok is None else ("met" if ok else "MISSED")
    print(f"{label:<38} {value:>18}  {aim:<10} {verdict}")
json.dump({"medians": med, "rounds": rows, "waiters": w, "handoff": hand},
          open(f"{out}/summary.json", "w"), indent=2)
PY
