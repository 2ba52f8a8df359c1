#!/usr/bin/env bash
# Starts a Redis Cluster on loopback to try lockd's cluster mode: 3 masters
# with 2 replicas each on ports 7000-7008 (cluster bus ports 17000-17008),
# no persistence, data in a temporary directory. Prints the lockd command
# that uses it. `deploy/local/redis-cluster.sh stop` stops it.
# REDIS_CLUSTER_PORT=N moves it to ports N to N+8, and REDIS_CLUSTER_BUS_PORT=M
# its bus ports to M to M+8 (default: 10000 above the ports). Give the same
# variables to `stop`.
# Needs redis-server and redis-cli (installed from Debian's packages when
# missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
base=${REDIS_CLUSTER_PORT:-7000}
bus=${REDIS_CLUSTER_BUS_PORT:-$((base + 10000))}
ports=()
for i in 0 1 2 3 4 5 6 7 8; do ports+=($((base + i))); done
dir=${TMPDIR:-/tmp}/lockd-redis-cluster-$base

if [ "${1:-}" = stop ]; then
  for p in "${ports[@]}"; do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
  rm -rf "$dir"
  echo "stopped"
  exit 0
fi

scripts/ensure-deps.sh redis-server redis-cli
for p in "${ports[@]}"; do
  if redis-cli -p "$p" ping >/dev/null 2>&1; then
    echo "error: something answers on port $p already; run '$0 stop' first" >&2
    exit 1
  fi
done
rm -rf "$dir"
for p in "${ports[@]}"; do
  mkdir -p "$dir/$p"
  redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
    --cluster-port $((bus + p - base)) \
    --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
    --save "" --appendonly no --dir "$dir/$p" --daemonize yes \
    --logfile "$dir/$p/redis.log" >/dev/null
done
for p in "${ports[@]}"; do
  for _ in $(seq 50); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
done
nodes=()
for p in "${ports[@]}"; do nodes+=("127.0.0.1:$p"); done
redis-cli --cluster create "${nodes[@]}" --cluster-replicas 2 --cluster-yes >/dev/null
# Formed: the slots are served, and every replica follows its master (they
# attach a few seconds after the masters serve).
formed() {
  redis-cli -p "$base" cluster info | grep -q 'cluster_state:ok' &&
    [ "$(redis-cli -p "$base" cluster nodes | grep -c ' slave ')" = 6 ]
}
for _ in $(seq 300); do
  formed && break
  sleep 0.1
done
formed || {
  echo "error: the cluster did not form; logs in $dir" >&2
  exit 1
}
echo "a Redis Cluster runs on 127.0.0.1:${ports[0]}-${ports[8]} (3 masters, 2 replicas each)"
echo "run lockd on it:"
echo "  scripts/run.sh --redis-mode cluster --redis-url redis://127.0.0.1:${ports[0]} --redis-url redis://127.0.0.1:${ports[1]}"
echo "stop it: ${TMPDIR:+TMPDIR=$TMPDIR }REDIS_CLUSTER_PORT=$base $0 stop"
