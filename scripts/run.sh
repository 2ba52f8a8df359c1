#!/usr/bin/env bash
# Builds and runs `lockd serve` on 127.0.0.1:8080. Unless a Redis URL
# (--redis-url, LOCKD_REDIS_URL) or dev mode (--dev, LOCKD_DEV=1) is given, it
# makes sure a Redis answers on 127.0.0.1:6379, installing and starting a
# local redis-server (no persistence) when none does.
# Arguments go to `lockd serve`, e.g. scripts/run.sh --default-ttl-ms 10000
set -euo pipefail
cd "$(dirname "$0")/.."

wants_local_redis=yes
[ -n "${LOCKD_REDIS_URL:-}" ] && wants_local_redis=no
case "${LOCKD_DEV:-}" in 1|[Tt]rue|[Yy]es|[Yy]|[Oo]n|[Tt]) wants_local_redis=no ;; esac
for arg in "$@"; do
  case "$arg" in --redis-url*|--dev) wants_local_redis=no ;; esac
done

if [ "$wants_local_redis" = yes ]; then
  scripts/ensure-deps.sh redis-server redis-cli
  if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    echo "starting redis-server on 127.0.0.1:6379 (no persistence)" >&2
    redis-server --bind 127.0.0.1 --port 6379 --save "" --appendonly no --daemonize yes \
      --logfile "${TMPDIR:-/tmp}/lockd-redis.log" >/dev/null
    for _ in $(seq 50); do
      redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break
      sleep 0.1
    done
  fi
fi

cargo build --release --locked --bin lockd
exec target/release/lockd serve "$@"
