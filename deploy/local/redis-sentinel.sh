#!/usr/bin/env bash
# Starts a Redis master with two replicas and three Sentinels on loopback
# to try lockd's Sentinel mode: the master on port 6380, replicas on 6381
# and 6382, Sentinels on 26380-26382 watching it as "lockd-master"; no
# persistence, data in a temporary directory. Prints the lockd command
# that uses it, and how to fail over. `deploy/local/redis-sentinel.sh stop`
# stops it. REDIS_SENTINEL_PORT=N moves the servers to ports N to N+2 and
# REDIS_SENTINEL_SENTINEL_PORT=M the Sentinels to M to M+2 (default: 20000
# above the servers); give the same variables to `stop`. Needs
# redis-server, redis-cli and redis-sentinel (installed from Debian's
# packages when missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
base=${REDIS_SENTINEL_PORT:-6380}
sbase=${REDIS_SENTINEL_SENTINEL_PORT:-$((base + 20000))}
servers=("$base" $((base + 1)) $((base + 2)))
sentinels=("$sbase" $((sbase + 1)) $((sbase + 2)))
master=${servers[0]}
name=lockd-master
dir=${TMPDIR:-/tmp}/lockd-redis-sentinel-$base

if [ "${1:-}" = stop ]; then
  for p in "${sentinels[@]}" "${servers[@]}"; do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
  rm -rf "$dir"
  echo "stopped"
  exit 0
fi

scripts/ensure-deps.sh redis-server redis-cli redis-sentinel
for p in "${servers[@]}" "${sentinels[@]}"; do
  if redis-cli -p "$p" ping >/dev/null 2>&1; then
    echo "error: something answers on port $p already; run '$0 stop' first" >&2
    exit 1
  fi
done
rm -rf "$dir"
mkdir -p "$dir"
for p in "${servers[@]}"; do
  redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$dir" --dbfilename "dump-$p.rdb" --daemonize yes --logfile "$dir/redis-$p.log" >/dev/null
done
for p in "${servers[@]}"; do
  for _ in $(seq 50); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
done
redis-cli -p "${servers[1]}" replicaof 127.0.0.1 "$master" >/dev/null
redis-cli -p "${servers[2]}" replicaof 127.0.0.1 "$master" >/dev/null
for _ in $(seq 100); do
  [ "$(redis-cli -p "$master" info replication | grep -c 'state=online')" = 2 ] && break
  sleep 0.1
done
for p in "${sentinels[@]}"; do
  cat > "$dir/sentinel-$p.conf" <<CONF
port $p
bind 127.0.0.1
daemonize yes
logfile $dir/sentinel-$p.log
dir $dir
sentinel monitor $name 127.0.0.1 $master 2
sentinel down-after-milliseconds $name 2000
sentinel failover-timeout $name 10000
CONF
  redis-sentinel "$dir/sentinel-$p.conf"
done
# Settled: each Sentinel knows the two others (SENTINEL master prints one
# field per line, its value on the next).
settled() {
  for p in "${sentinels[@]}"; do
    redis-cli -p "$p" sentinel master "$name" 2>/dev/null |
      grep -A1 -x 'num-other-sentinels' | tail -1 | grep -qx 2 || return 1
  done
}
for _ in $(seq 300); do
  settled && break
  sleep 0.1
done
settled || echo "warning: the Sentinels have not all found each other yet" >&2
echo "a master ($master), two replicas (${servers[1]}, ${servers[2]}) and three Sentinels (${sentinels[0]}-${sentinels[2]}, master name $name) run on 127.0.0.1"
echo "run lockd on it:"
echo "  scripts/run.sh --redis-mode sentinel --sentinel-master $name --redis-url redis://127.0.0.1:${sentinels[0]} --redis-url redis://127.0.0.1:${sentinels[1]} --redis-url redis://127.0.0.1:${sentinels[2]}"
echo "fail over: redis-cli -p ${sentinels[0]} sentinel failover $name"
echo "stop it: ${TMPDIR:+TMPDIR=$TMPDIR }REDIS_SENTINEL_PORT=$base REDIS_SENTINEL_SENTINEL_PORT=$sbase $0 stop"
