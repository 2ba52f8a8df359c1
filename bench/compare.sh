#!/usr/bin/env bash
# What a lock costs (issue 33): CPU per cycle of lockd and of its Redis,
# as ratios against the shared floor measured in the same run, beside
# each aim; with the waiters' memory and the handoff latency. On this
# 2-core shared machine absolute figures move with the other tenants'
# load, so the runs alternate and the medians are compared.
#
# Targets, each on free loopback ports and, but for HTTP alone and etcd,
# on a redis-server of its own (so that one target's keys and release
# events do not weigh on another's Redis CPU):
#   floor            the shared floor, lock-floor, built from FLOOR_DIR
#                    (default ../shared/floor from the repository's root;
#                    a relative FLOOR_DIR is taken from there too) into
#                    ${TMPDIR:-/tmp}/lock-floor-target, outside the repo:
#                    parse HTTP, one Redis command per request (SET NX PX,
#                    a compare-and-delete script), a small JSON answer.
#                    The aims are ratios against it. No floor there: the
#                    script stops and says where to put it.
#   http-alone       `lockd-bench null-server` without Redis: fixed
#                    answers, so HTTP alone on this machine (no aim).
#   lockd            each lockd binary given (release build, default
#                    settings, access log at info to a file).
#   lockd-nohistory  the last lockd with --history-length 0 (HISTORY_OFF=0
#                    leaves it out).
#   lease-writes, lease-writes-history
#                    with LEASE_WRITES=1 (default 0): `lockd-bench
#                    null-server --writes lease` (and `lease-history`), the
#                    floor's HTTP sending instead the least Redis work an
#                    exclusive lease of lockd needs (lock, fence from Redis's
#                    clock, holder record, change messages; the history
#                    list): what is left of lockd's Redis CPU beyond it is
#                    its scripts' logic (no aim; docs/performance.md).
#   etcd             etcd's lock API through its HTTP gateway, when the
#                    `etcd` binary is installed (Debian's etcd-server).
# Workloads, each `lockd-bench cycle` with CLIENTS keep-alive clients for
# SECONDS:
#   distinct  every cycle a new name, as webhook deliveries take (floor,
#             HTTP alone, each lockd);
#   reused    each client reuses one name (floor, HTTP alone, each lockd,
#             and etcd's lease + lock + unlock, `etcd-cycle`);
#   shared    shared locks (mode shared, then DELETE), distinct names (each
#             lockd binary);
#   run       runs (POST /runs/{key}, then PUT /runs/{key}/result),
#             distinct keys (each lockd binary).
# Each of ROUNDS rounds runs every workload against every one of its
# targets in turn; CPU (user + system) of the server and of its
# redis-server is read from /proc before and after: CPU per cycle. Then
# (WAITERS > 0), against the last lockd started alone on a fresh Redis:
#   `lockd-bench waiters`: WAITERS requests parked on one lock (each on its
#     own keep-alive connection), lockd run with --max-waiters WAITERS: RSS
#     parked, Redis connections (and those subscribed), the drain rate in
#     fence order, and RSS 20 s after the drain with every connection
#     closed;
#   `lockd-bench script-chain`, just before and just after the drain, on
#     the same Redis: WAITERS grants and releases of one lock with lockd's
#     own scripts, back to back, by one client (the drain's ceiling);
#   `lockd-bench handoff`: release request sent to the next waiter's 201.
# Prints every round, the medians, and each ratio beside its aim:
#   lockd / floor, distinct and reused names: CPU <= 1.6, Redis CPU <= 2.0;
#   a shared lock's and a run's cycle / an exclusive lock's (distinct
#   names): <= 1.25, CPU and Redis CPU; history on / off (distinct and
#   reused): <= 1.1, CPU and Redis CPU; 10,000 waiters parked <= 120 MB RSS;
#   the drain >= 0.8 x the chain (the mean of its two runs); handoff p50
#   <= 0.5 ms, p99 <= 1 ms.
# Usage: bench/compare.sh [ROUNDS] [SECONDS] [CLIENTS] [OUT] [LOCKD...]
#   (defaults 3, 10, 16, target/bench/compare, target/release/lockd: 3
#   rounds of 10 runs of 10 s, about 5 minutes, then the waiters). More
#   than one lockd binary (an older build, say) are measured side by side,
#   alternated in each round; lockd-nohistory, waiters and handoff use the
#   last. WAITERS (environment, default 10000) sets the waiters run's size;
#   WAITERS=0 skips the waiters and handoff runs (for a quick A/B of CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
seconds=${2:-10}
clients=${3:-16}
out=${4:-target/bench/compare}
shift $(($# < 4 ? $# : 4))
waiters=${WAITERS:-10000}
history_off=${HISTORY_OFF:-1}
lease_writes=${LEASE_WRITES:-0}
floor_dir=${FLOOR_DIR:-../shared/floor}
if [ ! -f "$floor_dir/Cargo.toml" ]; then
  cat >&2 <<EOF
bench/compare.sh: no shared floor at $floor_dir: no Cargo.toml there (a
relative FLOOR_DIR is taken from the repository's root, $(pwd)).
The floor (the lock-floor crate: Cargo.toml, src/main.rs) is kept outside
this repository, beside it: put it at ../shared/floor from the repository's
root ($(cd .. && pwd)/shared/floor), or set FLOOR_DIR to its directory.
EOF
  exit 1
fi
scripts/ensure-deps.sh redis-server redis-cli curl python3
. bench/lib.sh
floor_target=${TMPDIR:-/tmp}/lock-floor-target
CARGO_TARGET_DIR="$floor_target" cargo build --release --manifest-path "$floor_dir/Cargo.toml" >&2
floor_bin=$floor_target/release/lock-floor
if [ $# -eq 0 ]; then
  cargo build --release --locked --bin lockd --bin lockd-bench >&2
  set -- target/release/lockd
else
  cargo build --release --locked --bin lockd-bench >&2
fi
bins=("$@")
last_bin=${bins[$((${#bins[@]} - 1))]}
bench=target/release/lockd-bench
mkdir -p "$out"
rm -f "$out"/*.json

work=$(mktemp -d)
pids=()
redis_pids=()
stop_all() {
  for pid in "${pids[@]}" "${redis_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
  redis_pids=()
}
cleanup() {
  stop_all
  rm -rf "$work"
}
trap cleanup EXIT
up() { until curl -s -o /dev/null "$1"; do sleep 0.05; done; }

# Starts a redis-server of its own for $1: sets redis_url and redis_pid.
start_redis() {
  local dir=$work/redis-$1 port
  mkdir -p "$dir"
  port=$(free_port)
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$dir" --daemonize yes --pidfile "$dir/redis.pid" >/dev/null
  until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
  redis_pid=$(cat "$dir/redis.pid")
  redis_pids+=("$redis_pid")
  redis_url="redis://127.0.0.1:$port"
}

# Each target: a label, its base URL, the process whose CPU is its own, and
# its Redis's process ("" for none).
labels=(); urls=(); server_pids=(); target_redis=()
add_target() { labels+=("$1"); urls+=("$2"); server_pids+=("$3"); target_redis+=("$4"); }

start_redis floor
port=$(free_port)
"$floor_bin" "127.0.0.1:$port" "$redis_url" 2>"$out/floor.log" &
pids+=($!); add_target floor "http://127.0.0.1:$port" $! "$redis_pid"
port=$(free_port)
"$bench" null-server --listen "127.0.0.1:$port" 2>/dev/null &
pids+=($!); add_target http-alone "http://127.0.0.1:$port" $! ""
if [ "$lease_writes" = 1 ]; then
  for writes in lease lease-history; do
    start_redis "$writes"
    port=$(free_port)
    "$bench" null-server --listen "127.0.0.1:$port" --redis-url "$redis_url" \
      --writes "$writes" 2>/dev/null &
    label=lease-writes$([ "$writes" = lease-history ] && echo -history || true)
    pids+=($!); add_target "$label" "http://127.0.0.1:$port" $! "$redis_pid"
  done
fi
lockd_bins=()
for i in "${!bins[@]}"; do
  label="lockd$([ ${#bins[@]} -gt 1 ] && echo "-$i" || true)"
  start_redis "$label"
  port=$(free_port)
  "${bins[$i]}" serve --listen "127.0.0.1:$port" --redis-url "$redis_url" \
    2>"$out/$label.log" &
  pids+=($!); add_target "$label" "http://127.0.0.1:$port" $! "$redis_pid"
  lockd_bins+=("$label")
done
if [ "$history_off" = 1 ]; then
  start_redis lockd-nohistory
  port=$(free_port)
  "$last_bin" serve --listen "127.0.0.1:$port" --redis-url "$redis_url" \
    --history-length 0 2>"$out/lockd-nohistory.log" &
  pids+=($!); add_target lockd-nohistory "http://127.0.0.1:$port" $! "$redis_pid"
fi
if command -v etcd >/dev/null; then
  etcd_port=$(free_port); peer_port=$(free_port)
  etcd --name bench --data-dir "$work/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "bench=http://127.0.0.1:$peer_port" >"$out/etcd.log" 2>&1 &
  pids+=($!); add_target etcd "http://127.0.0.1:$etcd_port" $! ""
else
  echo "note: etcd is not installed (Debian: apt-get install etcd-server); etcd's column is skipped"
fi
for url in "${urls[@]}"; do up "$url/"; done
for i in "${!labels[@]}"; do
  case ${labels[$i]} in
    lockd*) until curl -sf "${urls[$i]}/readyz" >/dev/null; do sleep 0.05; done ;;
  esac
done

# One round: every workload against each of its targets ("WORKLOAD/INDEX").
plan=()
for workload in distinct reused; do
  for i in "${!labels[@]}"; do
    [ "${labels[$i]}" = etcd ] && [ "$workload" != reused ] && continue
    plan+=("$workload/$i")
  done
done
for workload in shared run; do
  for i in "${!labels[@]}"; do
    for label in "${lockd_bins[@]}"; do
      [ "${labels[$i]}" = "$label" ] && plan+=("$workload/$i")
    done
  done
done
for round in $(seq 1 "$rounds"); do
  for entry in "${plan[@]}"; do
    workload=${entry%/*} i=${entry#*/}
    label=${labels[$i]} redis=${target_redis[$i]}
    case $workload in
      distinct) load=(--names distinct) ;;
      reused) load=(--names reused) ;;
      shared) load=(--names distinct --kind shared) ;;
      run) load=(--names distinct --kind run) ;;
    esac
    s0=$(proc_ticks "${server_pids[$i]}"); r0=$([ -n "$redis" ] && proc_ticks "$redis" || echo 0)
    echo; echo "== round $round: $workload, $label"
    if [ "$label" = etcd ]; then
      "$bench" --json "$out/$workload-$label-$round.json" etcd-cycle --endpoint "${urls[$i]}" \
        --clients "$clients" --seconds "$seconds"
    else
      "$bench" --server "${urls[$i]}" --json "$out/$workload-$label-$round.json" cycle \
        --clients "$clients" --seconds "$seconds" "${load[@]}"
    fi
    s1=$(proc_ticks "${server_pids[$i]}"); r1=$([ -n "$redis" ] && proc_ticks "$redis" || echo 0)
    redis_ticks=$([ -n "$redis" ] && echo $((r1 - r0)) || echo null)
    echo "{\"server_ticks\": $((s1 - s0)), \"redis_ticks\": $redis_ticks, \"hz\": $(getconf CLK_TCK)}" \
      >"$out/$workload-$label-$round.cpu.json"
  done
done
stop_all

if [ "$waiters" -gt 0 ]; then
  echo; echo "== waiters: $waiters parked on one lock"
  start_redis waiters
  port=$(free_port)
  "$last_bin" serve --listen "127.0.0.1:$port" --redis-url "$redis_url" \
    --max-waiters "$waiters" 2>"$out/lockd-waiters.log" &
  pids+=($!); lockd_pid=$!
  until curl -sf "http://127.0.0.1:$port/readyz" >/dev/null; do sleep 0.05; done
  "$bench" --json "$out/chain-1.json" script-chain --redis-url "$redis_url" --count "$waiters"
  "$bench" --server "http://127.0.0.1:$port" --json "$out/waiters.json" waiters \
    --count "$waiters" --pid "$lockd_pid" --redis-url "$redis_url" --settle-seconds 20
  "$bench" --json "$out/chain-2.json" script-chain --redis-url "$redis_url" --count "$waiters"
  echo; echo "== handoff"
  "$bench" --server "http://127.0.0.1:$port" --json "$out/handoff.json" handoff \
    --rounds 1000 --poll-rounds 0
fi

echo
plan_labels=()
for entry in "${plan[@]}"; do plan_labels+=("${entry%/*}/${labels[${entry#*/}]}"); done
python3 - "$out" "$rounds" "${plan_labels[@]}" <<'PY'
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
plan = [tuple(p.split("/", 1)) for p in sys.argv[3:]]
load = lambda name: json.load(open(f"{out}/{name}.json"))
shown = lambda label: {"http-alone": "HTTP alone", "lease-writes": "lease writes",
                       "lease-writes-history": "+ history"}.get(label, label)
rows = {}
for w, l in plan:
    runs = []
    for r in range(1, rounds + 1):
        run, cpu = load(f"{w}-{l}-{r}"), load(f"{w}-{l}-{r}.cpu")
        cycles = run["cycles_per_second"] * run["seconds"]
        per = lambda ticks: None if ticks is None else ticks / cpu["hz"] / max(cycles, 1) * 1e6
        runs.append((per(cpu["server_ticks"]), per(cpu["redis_ticks"]),
                     run["cycles_per_second"], run["errors"]))
    rows[(w, l)] = runs
med = {k: [None if any(x[i] is None for x in v) else statistics.median(x[i] for x in v)
           for i in range(3)] for k, v in rows.items()}
fmt = lambda v, spec=".1f": "-" if v is None else format(v, spec)
titles = {
    "distinct": "distinct names (a new name every cycle)",
    "reused": "reused names (each client its own)",
    "shared": "shared locks, distinct names",
    "run": "runs (start, complete), distinct keys",
}
print("CPU per cycle (acquire + release; a run's start + complete), in µs")
for w in titles:
    labels = [l for ww, l in plan if ww == w]
    if not labels:
        continue
    print()
    print(f"{titles[w]:<40}" + "".join(f"{shown(l):>17}" for l in labels))
    for r in range(rounds):
        for i, what in ((0, "server CPU"), (1, "Redis CPU")):
            print(f"{f'  round {r + 1}: {what}':<40}" + "".join(f"{fmt(rows[w, l][r][i]):>17}" for l in labels))
    print(f"{'  median server CPU':<40}" + "".join(f"{fmt(med[w, l][0]):>17}" for l in labels))
    print(f"{'  median Redis CPU':<40}" + "".join(f"{fmt(med[w, l][1]):>17}" for l in labels))
    print(f"{'  median cycles/s':<40}" + "".join(f"{fmt(med[w, l][2], '.0f'):>17}" for l in labels))
errors = sum(x[3] for v in rows.values() for x in v)

checks = []
def ratio(label, num, den, aim):
    value = None if num is None or den is None or den == 0 else num / den
    checks.append((label, fmt(value, ".2f"), "" if aim is None else f"<= {aim}",
                   None if aim is None or value is None else value <= aim))
lockds = [l for w, l in plan if w == "shared"]
for l in lockds:
    for w in ("distinct", "reused"):
        if (w, l) in med and (w, "floor") in med:
            ratio(f"{w}: {l} CPU / floor's", med[w, l][0], med[w, "floor"][0], 1.6)
            ratio(f"{w}: {l} Redis CPU / floor's", med[w, l][1], med[w, "floor"][1], 2.0)
    if ("reused", "etcd") in med:
        ratio(f"  reused: {l} CPU / etcd's", med["reused", l][0], med["reused", "etcd"][0], None)
    for k, what in (("shared", "shared lock"), ("run", "run")):
        ratio(f"{what} / lock: {l} CPU", med[k, l][0], med["distinct", l][0], 1.25)
        ratio(f"{what} / lock: {l} Redis CPU", med[k, l][1], med["distinct", l][1], 1.25)
for w in ("distinct", "reused"):
    for l, what in (("lease-writes", "lease writes"), ("lease-writes-history", "lease writes with history")):
        if (w, l) in med and (w, "floor") in med:
            ratio(f"{w}: {what}, Redis CPU / floor's", med[w, l][1], med[w, "floor"][1], None)
    if (w, "lease-writes-history") in med and (w, "lease-writes") in med:
        ratio(f"{w}: lease writes, history on / off, Redis CPU",
              med[w, "lease-writes-history"][1], med[w, "lease-writes"][1], None)
if lockds and ("distinct", "lockd-nohistory") in med:
    on = lockds[-1]
    for w in ("distinct", "reused"):
        ratio(f"history on / off, {w}: {on} CPU", med[w, on][0], med[w, "lockd-nohistory"][0], 1.1)
        ratio(f"history on / off, {w}: Redis CPU", med[w, on][1], med[w, "lockd-nohistory"][1], 1.1)

wt = load("waiters") if os.path.exists(f"{out}/waiters.json") else None
chain = None
hand = load("handoff")["server_wait_from_release_sent"] if wt else None
mb = lambda b: b / 1e6
if wt:
    w = wt
    chain = statistics.mean(load(f"chain-{i}")["handoffs_per_second"] for i in (1, 2))
    tenk = w["waiters"] == 10000
    checks += [
        (f"{w['waiters']} waiters: RSS parked", f"{mb(w['parked_rss_bytes']):.1f} MB",
         "<= 120 MB" if tenk else "(10,000: <= 120 MB)",
         mb(w["parked_rss_bytes"]) <= 120 if tenk else None),
        ("  per waiter", f"{(w['parked_rss_bytes'] - w['idle_rss_bytes']) / w['waiters'] / 1e3:.1f} kB", "", None),
        ("  peak RSS", f"{mb(w['peak_rss_bytes']):.1f} MB", "", None),
        ("  drain", f"{w['handoffs_per_second']:.0f} handoffs/s", "", None),
        ("  the scripts' chain, one client", f"{chain:.0f} handoffs/s", "", None),
        ("  drain / chain", f"{w['handoffs_per_second'] / chain:.2f}", ">= 0.8",
         w["handoffs_per_second"] / chain >= 0.8),
        ("  fence-order violations", str(w["violations"]), "0", w["violations"] == 0),
        ("  Redis connections subscribed", str(w["redis_subscribed_connections"]), "1",
         w["redis_subscribed_connections"] == 1),
        ("  Redis connections in all", f"{w['redis_connections']} (idle {w['redis_connections_before']})", "", None),
        (f"  RSS {w['settle_seconds']:.0f} s after the drain", f"{mb(w['settled_rss_bytes']):.1f} MB", "<= 64 MB",
         mb(w["settled_rss_bytes"]) <= 64),
        ("handoff p50 (release sent -> 201)", f"{hand['p50_ms']:.2f} ms", "<= 0.5 ms", hand["p50_ms"] <= 0.5),
        ("handoff p99", f"{hand['p99_ms']:.2f} ms", "<= 1 ms", hand["p99_ms"] <= 1),
    ]
checks.append(("errors in the cycle runs", str(errors), "0", errors == 0))
print()
print(f"{'figure':<44} {'measured':>18}  aim")
for label, value, aim, ok in checks:
    verdict = "" if ok is None else ("met" if ok else "MISSED")
    print(f"{label:<44} {value:>18}  {aim:<10} {verdict}".rstrip())
json.dump({"medians": {f"{w}/{l}": v for (w, l), v in med.items()},
           "rounds": {f"{w}/{l}": v for (w, l), v in rows.items()},
           "waiters": wt, "handoff": hand, "chain": chain if wt else None},
          open(f"{out}/summary.json", "w"), indent=2)
PY
