#!/usr/bin/env bash
# Starts a Redis master with two replicas and three Sentinels on loopback
# to try lockd's Sentinel mode: the master on port 6380, replicas on 6381
# and 6382, Sentinels on 26380-26382 watching it as "lockd-master"; no
# persistence, data in a temporary directory. Prints the lockd command
# that uses it, and how to fail over. `deploy/local/redis-sentinel.sh stop`
# stops it. Needs redis-server, redis-cli and redis-sentinel (installed from
# Debian's packages when missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
servers=(6380 6381 6382)
sentinels=(26380 26381 26382)
name=lockd-master
dir=${TMPDIR:-/tmp}/lockd-redis-sentinel

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
redis-cli -p 6381 replicaof 127.0.0.1 6380 >/dev/null
redis-cli -p 6382 replicaof 127.0.0.1 6380 >/dev/null
for _ in $(seq 100); do
  [ "$(redis-cli -p 6380 info replication | grep -c 'state=online')" = 2 ] && break
  sleep 0.1
done
for p in "${sentinels[@]}"; do
  cat > "$dir/sentinel-$p.conf" <<CONF
port $p
bind 127.0.0.1
daemonize yes
logfile $dir/sentinel-$p.log
dir $dir
sentinel monitor $name 127.0.0.1 6380 2
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
echo "a master (6380), two replicas (6381, 6382) and three Sentinels (26380-26382, master name $name) run on 127.0.0.1"
echo "run lockd on it:"
echo "  scripts/run.sh --redis-mode sentinel --sentinel-master $name --redis-url redis://127.0.0.1:26380 --redis-url redis://127.0.0.1:26381 --redis-url redis://127.0.0.1:26382"
echo "fail over: redis-cli -p 26380 sentinel failover $name"
echo "stop it: $0 stop"
