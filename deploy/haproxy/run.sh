#!/usr/bin/env bash
# Brings up lockd behind haproxy on loopback (docs/deploy.md): one
# redis-server, REPLICAS lockd replicas (release build; 3 by default, 1 to 3)
# and haproxy with deploy/haproxy/haproxy.cfg, each on a free port. Installs
# redis-server and haproxy from Debian's packages when missing.
#
# Without arguments it prints the addresses and runs until Ctrl-C. With
# arguments it runs `lockd-bench --server <haproxy> ARGS...` through haproxy
# and exits with its status. Either way everything it started is stopped on
# exit. Logs (lockd-N.log, haproxy.log, redis.log) are kept in LOGS
# (default target/deploy-haproxy), emptied at the next start. HAPROXY_PORT
# and HAPROXY_STATS_PORT set haproxy's two ports (default: free ones).
#
# `cycle` and `contended` measure through haproxy; `handoff` and `waiters`
# read one lockd's /metrics, which haproxy sends to any replica, so they
# need a single lockd (bench/handoff.sh).
#
# Examples:
#   deploy/haproxy/run.sh
#   deploy/haproxy/run.sh cycle --clients 16 --seconds 10
#   REPLICAS=2 deploy/haproxy/run.sh contended --clients 32 --names 4
set -euo pipefail
cd "$(dirname "$0")/../.."
replicas=${REPLICAS:-3}
case $replicas in 1|2|3) ;; *)
  echo "REPLICAS must be 1, 2 or 3 (haproxy.cfg has three server lines; add more there)" >&2
  exit 2 ;;
esac
# haproxy is in /usr/sbin, which is not on every user's PATH.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
scripts/ensure-deps.sh redis-server redis-cli haproxy curl python3
cargo build --release --locked --bin lockd --bin lockd-bench >&2
bin=${CARGO_TARGET_DIR:-target}/release
logs=${LOGS:-${CARGO_TARGET_DIR:-target}/deploy-haproxy}
mkdir -p "$logs"
rm -f "$logs"/*.log

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
work=$(mktemp -d)
cleanup() {
  # haproxy first, so that no request reaches a replica that is stopping.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Waits up to 30 s for a command to succeed while process `pid` runs;
# fails with the end of `log`.
await() {
  local name=$1 pid=$2 log=$3
  shift 3
  for _ in $(seq 600); do
    "$@" >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  echo "error: $name did not come up; the end of its log, $log:" >&2
  tail -n 20 "$log" >&2
  exit 1
}

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$work" >"$logs/redis.log" 2>&1 &
pids+=($!)
await redis-server "$!" "$logs/redis.log" redis-cli -p "$redis_port" ping

replica_env=()
for i in $(seq "$replicas"); do
  port=$(free_port)
  "$bin/lockd" serve --listen "127.0.0.1:$port" \
    --redis-url "redis://127.0.0.1:$redis_port" >"$logs/lockd-$i.log" 2>&1 &
  pids+=($!)
  await "lockd replica $i" "$!" "$logs/lockd-$i.log" curl -sf "http://127.0.0.1:$port/readyz"
  replica_env+=("LOCKD_REPLICA_$i=127.0.0.1:$port")
done

haproxy_port=${HAPROXY_PORT:-$(free_port)}
stats_port=${HAPROXY_STATS_PORT:-$(free_port)}
env "${replica_env[@]}" LOCKD_REPLICAS="$replicas" \
  LOCKD_HAPROXY_BIND="127.0.0.1:$haproxy_port" LOCKD_HAPROXY_STATS="127.0.0.1:$stats_port" \
  LOCKD_HAPROXY_ADMIN="$work/admin.sock" haproxy -db -f deploy/haproxy/haproxy.cfg >"$logs/haproxy.log" 2>&1 &
pids+=($!)
# Up once every replica has passed a health check (haproxy's stats, as CSV:
# field 18 is the status, 37 the last check's result).
all_up() {
  [ "$(curl -sf "http://127.0.0.1:$stats_port/;csv" |
    awk -F, '$1 == "lockd" && $2 ~ /^lockd[0-9]/ && $18 == "UP" && $37 == "L7OK"' |
    wc -l)" -eq "$replicas" ]
}
await haproxy "${pids[-1]}" "$logs/haproxy.log" all_up

url="http://127.0.0.1:$haproxy_port"
if [ $# -gt 0 ]; then
  "$bin/lockd-bench" --server "$url" "$@"
  exit
fi
cat <<EOF
lockd through haproxy: $url  ($replicas replicas on one Redis, 127.0.0.1:$redis_port)
haproxy stats:         http://127.0.0.1:$stats_port/   (metrics: /metrics)
haproxy runtime API:   $work/admin.sock
logs:                  $logs
Try:  curl -s -X POST '$url/locks/demo?ttl_ms=30000'
Ctrl-C stops everything.
EOF
wait -n "${pids[@]}" || true
echo "a process stopped by itself; stopping the rest (logs: $logs)" >&2
exit 1
