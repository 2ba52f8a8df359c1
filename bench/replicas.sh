#!/usr/bin/env bash
# lockd replicas behind haproxy (issue 15), in one run. Starts one
# redis-server, three lockd replicas on it (release build, default settings,
# access log at info to a file, as bench/compare.sh) and one
# `lockd-bench null-server` (fixed answers, nothing behind it), all on free
# loopback ports. Then, ROUNDS times, each scenario once, the order turned
# by one each round so that no scenario always runs first or last:
#   direct     lockd-bench -> replica 1, no haproxy (the reference);
#   haproxy-1  lockd-bench -> haproxy -> replica 1;
#   haproxy-2  lockd-bench -> haproxy -> replicas 1 and 2;
#   haproxy-3  lockd-bench -> haproxy -> replicas 1, 2 and 3;
#   floor      lockd-bench -> haproxy -> null-server: haproxy's own floor,
#              the most cycles/s anything behind this haproxy can see here.
# Each is `lockd-bench cycle` (acquire + release over keep-alive HTTP) with
# the same CLIENTS and SECONDS. haproxy runs deploy/haproxy/haproxy.cfg,
# started afresh for each measurement (and stopped after it), once every
# server in its backend passed a health check.
#
# During each measurement it reads the CPU time (user + system, from
# /proc/PID/stat; the load generator's from the shell's `times`) of every
# process it started, and the whole machine's busy time from /proc/stat
# (other tenants' work included). It prints the median cycles/s of each
# scenario with the figure of every round, and the CPU each process used
# in the median run, in cores (CPU seconds per second). JSON lands in OUT.
# Usage: bench/replicas.sh [SECONDS] [CLIENTS] [ROUNDS] [OUT]
#        (defaults 10, 16, 3, target/bench-replicas)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
clients=${2:-16}
rounds=${3:-3}
out=${4:-${CARGO_TARGET_DIR:-target}/bench-replicas}
# haproxy is in /usr/sbin, which is not on every user's PATH.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
scripts/ensure-deps.sh redis-server redis-cli haproxy curl python3
. bench/lib.sh
cargo build --release --locked --bin lockd --bin lockd-bench >&2
bin=${CARGO_TARGET_DIR:-target}/release
mkdir -p "$out"
rm -f "$out"/*.json "$out"/*.log

work=$(mktemp -d)
pids=()
haproxy_pid=""
cleanup() {
  [ -n "$haproxy_pid" ] && kill "$haproxy_pid" 2>/dev/null
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$work" >"$out/redis.log" 2>&1 &
redis_pid=$!
pids+=("$redis_pid")
until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.05; done

replica_addr=()
replica_pid=()
for i in 1 2 3; do
  port=$(free_port)
  "$bin/lockd" serve --listen "127.0.0.1:$port" \
    --redis-url "redis://127.0.0.1:$redis_port" 2>"$out/lockd-$i.log" &
  replica_pid+=($!)
  pids+=($!)
  replica_addr+=("127.0.0.1:$port")
  until curl -sf "http://127.0.0.1:$port/readyz" >/dev/null; do sleep 0.05; done
done
null_port=$(free_port)
"$bin/lockd-bench" null-server --listen "127.0.0.1:$null_port" 2>/dev/null &
null_pid=$!
pids+=("$null_pid")
until curl -sf "http://127.0.0.1:$null_port/readyz" >/dev/null; do sleep 0.05; done

# Starts haproxy in front of the given host:port servers and waits until
# each passed a health check (haproxy's stats as CSV: field 18 is the
# status, 37 the last check's result).
start_haproxy() {
  local n=$# stats_port env=()
  haproxy_port=$(free_port)
  stats_port=$(free_port)
  for i in $(seq "$n"); do env+=("LOCKD_REPLICA_$i=${!i}"); done
  env "${env[@]}" LOCKD_REPLICAS="$n" LOCKD_HAPROXY_BIND="127.0.0.1:$haproxy_port" \
    LOCKD_HAPROXY_STATS="127.0.0.1:$stats_port" \
    haproxy -db -f deploy/haproxy/haproxy.cfg >>"$out/haproxy.log" 2>&1 &
  haproxy_pid=$!
  for _ in $(seq 300); do
    up=$(curl -sf "http://127.0.0.1:$stats_port/;csv" |
      awk -F, '$1 == "lockd" && $2 ~ /^lockd[0-9]/ && $18 == "UP" && $37 == "L7OK"' | wc -l) || up=0
    [ "$up" -eq "$n" ] && return 0
    kill -0 "$haproxy_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "error: haproxy did not come up; see $out/haproxy.log" >&2
  exit 1
}
stop_haproxy() {
  kill "$haproxy_pid" 2>/dev/null || true
  wait "$haproxy_pid" 2>/dev/null || true
  haproxy_pid=""
}

# The machine's busy ticks (neither idle, waiting for I/O nor stolen by
# the hypervisor), all ticks and stolen ticks so far, all cores together.
machine() { awk '/^cpu / { t = 0; for (i = 2; i <= 9; i++) t += $i; print t - $5 - $6 - $9, t, $9 }' /proc/stat; }
# The CPU time (user + system) of this shell's children that have ended,
# in seconds. `times` must run in this shell, not a subshell: a subshell's
# children are its own.
children_cpu() {
  times >"$work/times"
  awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/); print u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$work/times"
}

# Runs one measurement of `scenario`: the load, with the CPU of each process.
measure() {
  local scenario=$1 round=$2 target names=() procs=()
  case $scenario in
    direct) target=${replica_addr[0]} ;;
    haproxy-1) start_haproxy "${replica_addr[0]}" ;;
    haproxy-2) start_haproxy "${replica_addr[@]:0:2}" ;;
    haproxy-3) start_haproxy "${replica_addr[@]}" ;;
    floor) start_haproxy "127.0.0.1:$null_port" ;;
  esac
  [ "$scenario" = direct ] || target="127.0.0.1:$haproxy_port"
  names=(redis lockd1 lockd2 lockd3 null-server)
  procs=("$redis_pid" "${replica_pid[@]}" "$null_pid")
  if [ -n "$haproxy_pid" ]; then names+=(haproxy); procs+=("$haproxy_pid"); fi
  local before=() after=() m0 m1 c0 c1 t0 t1
  for pid in "${procs[@]}"; do before+=("$(proc_ticks "$pid")"); done
  children_cpu >"$work/c0"; m0=$(machine); t0=$(date +%s.%N)
  echo; echo "== $scenario, round $round: lockd-bench -> $target"
  "$bin/lockd-bench" --server "http://$target" --json "$out/$scenario-$round.json" \
    cycle --clients "$clients" --seconds "$seconds"
  t1=$(date +%s.%N); m1=$(machine); children_cpu >"$work/c1"
  c0=$(cat "$work/c0"); c1=$(cat "$work/c1")
  for pid in "${procs[@]}"; do after+=("$(proc_ticks "$pid")"); done
  [ -n "$haproxy_pid" ] && stop_haproxy
  python3 - "$out/$scenario-$round.cpu.json" "$(getconf CLK_TCK)" "$t0" "$t1" "$c0" "$c1" \
    "$m0" "$m1" "${names[*]}" "${before[*]}" "${after[*]}" <<'PY'
import json, sys
path, hz, t0, t1, c0, c1, m0, m1, names, before, after = sys.argv[1:]
hz, wall = int(hz), float(t1) - float(t0)
cores = {n: (int(a) - int(b)) / hz / wall
         for n, b, a in zip(names.split(), before.split(), after.split())}
cores["lockd-bench"] = (float(c1) - float(c0)) / wall
(b0, tot0, st0), (b1, tot1, st1) = ([int(x) for x in m.split()] for m in (m0, m1))
busy = (b1 - b0) / hz / wall
json.dump({"wall_seconds": wall, "cores": cores,
           "machine_cores": (tot1 - tot0) / hz / wall,
           "machine_busy_cores": busy,
           "others_cores": busy - sum(cores.values()),
           "machine_steal_cores": (st1 - st0) / hz / wall}, open(path, "w"), indent=2)
PY
}

scenarios=(direct haproxy-1 haproxy-2 haproxy-3 floor)
for round in $(seq "$rounds"); do
  n=${#scenarios[@]}
  for k in $(seq 0 $((n - 1))); do
    measure "${scenarios[$(((k + round - 1) % n))]}" "$round"
  done
done

echo
python3 - "$out" "$rounds" "$clients" "$seconds" "${scenarios[@]}" <<'PY'
import json, statistics, sys
out, rounds, clients, seconds, *scenarios = sys.argv[1:]
rounds = int(rounds)
procs = ["lockd-bench", "haproxy", "lockd1", "lockd2", "lockd3", "redis", "null-server"]
summary = {"clients": int(clients), "seconds": int(seconds), "rounds": rounds, "scenarios": {}}
print(f"lockd-bench cycle, {clients} clients, {seconds} s, {rounds} rounds; "
      "CPU in cores (CPU s per s) in the median run")
head = f"{'scenario':<10} {'cycles/s':>8}  {'each round':<20}" + "".join(f"{p:>12}" for p in procs)
print(head + f"{'ours':>7}{'others':>7}{'machine':>8}{'steal':>6}{'errors':>7}   others, each round")
for s in scenarios:
    runs = []
    for r in range(1, rounds + 1):
        bench = json.load(open(f"{out}/{s}-{r}.json"))
        cpu = json.load(open(f"{out}/{s}-{r}.cpu.json"))
        runs.append((bench["cycles_per_second"], bench["errors"], cpu))
    rates = [r[0] for r in runs]
    med = statistics.median(rates)
    rate, errors, cpu = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
    cores = cpu["cores"]
    ours = sum(cores.values())
    row = f"{s:<10} {med:>8.0f}  {' '.join(f'{x:.0f}' for x in rates):<20}"
    row += "".join(f"{cores.get(p, 0):>12.2f}" for p in procs)
    row += f"{ours:>7.2f}{cpu['others_cores']:>7.2f}{cpu['machine_busy_cores']:>8.2f}"
    row += f"{cpu['machine_steal_cores']:>6.2f}"
    row += f"{sum(r[1] for r in runs):>7}"
    row += "   " + " ".join(f"{r[2]['others_cores']:.2f}" for r in runs)
    print(row)
    summary["scenarios"][s] = {
        "median_cycles_per_second": med, "cycles_per_second": rates,
        "errors": sum(r[1] for r in runs), "median_run_cpu": cpu,
        "others_cores": [r[2]["others_cores"] for r in runs],
        "median_run_cpu_us_per_cycle": {p: c / rate * 1e6 for p, c in cores.items()},
    }
print(f"machine: {cpu['machine_cores']:.1f} cores in /proc/stat. 'ours': the processes above "
      "(the kernel's loopback work is charged to them); 'others': every other process on the "
      "machine (other tenants); 'machine': all busy time; 'steal': taken by the hypervisor")
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
PY
