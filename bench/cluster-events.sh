#!/usr/bin/env bash
# What release events cost a Redis Cluster: one 3-master cluster with 2
# replicas each (9 nodes, started once), and lockd builds run on it in
# turn, RUNS times each, alternating. Each run measures, from /proc, the
# CPU time of lockd and of every redis-server per acquire + release cycle:
#   cycle:     uncontended cycles (lockd-bench cycle, CLIENTS names): each
#              release publishes an event nobody waits for;
#   contended: 32 clients on 4 names, 5 ms holds, waiting on the server
#              (lockd-bench contended): every release wakes a waiter.
# The cluster is deploy/local/redis-cluster.sh's, on ports 17300-17308.
# Prints each run, then the medians per build: cycles (grants) per second,
# lockd µs per cycle and the cluster's µs per cycle (all 9 nodes). An event
# sent with PUBLISH reaches all 9 nodes; one sent with SPUBLISH only the 3
# of the lock's shard: the difference is the broadcast's cost.
# Usage: bench/cluster-events.sh RUNS SECONDS BIN [BIN...]
#   e.g. bench/cluster-events.sh 5 10 /path/to/lockd.before target/release/lockd
# lockd-bench is the one next to the last BIN (or target/release/lockd-bench).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:?runs}
seconds=${2:?seconds}
shift 2
[ $# -ge 1 ] || { echo "usage: $0 RUNS SECONDS BIN [BIN...]" >&2; exit 2; }
bins=("$@")
last=${bins[$((${#bins[@]} - 1))]}
bench=$(dirname "$last")/lockd-bench
[ -x "$bench" ] || bench=target/release/lockd-bench
scripts/ensure-deps.sh redis-server redis-cli python3
. bench/lib.sh
work=$(mktemp -d)
export REDIS_CLUSTER_PORT=17300
ports=()
for i in $(seq 0 8); do ports+=($((REDIS_CLUSTER_PORT + i))); done
cleanup() {
  deploy/local/redis-cluster.sh stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
deploy/local/redis-cluster.sh >/dev/null
sleep 2
pids=()
for p in "${ports[@]}"; do
  pids+=("$(redis-cli -p "$p" info server | awk -F: '/^process_id/ {print $2}' | tr -d '\r')")
done
cluster_cpu() { for pid in "${pids[@]}"; do proc_cpu_seconds "$pid"; done | paste -sd' '; }
lockd_port=17399
results="$work/results"
: >"$results"
for run in $(seq 1 "$runs"); do
  for bin in "${bins[@]}"; do
    for load in cycle contended; do
      "$bin" serve --listen "127.0.0.1:$lockd_port" --redis-mode cluster \
        --redis-url "redis://127.0.0.1:${ports[0]}" >"$work/lockd.log" 2>&1 &
      lockd=$!
      until curl -sf "http://127.0.0.1:$lockd_port/readyz" >/dev/null 2>&1; do sleep 0.05; done
      case $load in
        cycle) args=(cycle --clients 16 --seconds "$seconds") ;;
        contended) args=(contended --clients 32 --names 4 --hold-ms 5 --wait-ms 2000 --seconds "$seconds") ;;
      esac
      l0=$(proc_cpu_seconds "$lockd"); c0=$(cluster_cpu)
      "$bench" --server "http://127.0.0.1:$lockd_port" --json "$work/run.json" "${args[@]}" >/dev/null 2>&1
      l1=$(proc_cpu_seconds "$lockd"); c1=$(cluster_cpu)
      kill "$lockd"; wait "$lockd" 2>/dev/null || true
      python3 - "$work/run.json" "$bin" "$load" "$run" "$l0" "$l1" "$c0" "$c1" >>"$results" <<'EOF'
import json, sys
path, binary, load, run, l0, l1, c0, c1 = sys.argv[1:]
d = json.load(open(path))
cycles = max(1, round(d.get("cycles_per_second", d.get("grants_per_second", 0)) * d["seconds"]))
before = [float(x) for x in c0.split()]
after = [float(x) for x in c1.split()]
cluster = sum(after) - sum(before)
print(json.dumps({
    "bin": binary, "load": load, "run": int(run),
    "per_second": round(cycles / d["seconds"]),
    "lockd_us": round((float(l1) - float(l0)) * 1e6 / cycles, 1),
    "cluster_us": round(cluster * 1e6 / cycles, 1),
}))
EOF
      tail -1 "$results"
    done
  done
done
python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("\nmedians (CPU µs per cycle, from /proc):")
print(f"{'build':40} {'load':10} {'per s':>8} {'lockd':>8} {'cluster':>8}")
for key in sorted({(r["bin"], r["load"]) for r in rows}):
    sel = [r for r in rows if (r["bin"], r["load"]) == key]
    med = lambda k: statistics.median(r[k] for r in sel)
    print(f"{key[0][-40:]:40} {key[1]:10} {med('per_second'):8.0f} {med('lockd_us'):8.1f} {med('cluster_us'):8.1f}")
EOF
