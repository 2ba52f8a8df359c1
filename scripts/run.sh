#!/usr/bin/env bash
# Builds and runs `lockd serve` on 127.0.0.1:8080. Unless a Redis URL
# (--redis-url, LOCKD_REDIS_URL) or dev mode (--dev, LOCKD_DEV=1) is given, it
# makes sure a Redis answers on 127.0.0.1:6379, installing and starting a
# local redis-server (no persistence) when none does. A redis-server it
# started is stopped when lockd exits (Ctrl-C and SIGTERM are passed on to
# lockd), or when the build fails or is interrupted; a Redis that already
# answered is left running. The exit status is lockd's.
# Arguments go to `lockd serve`, e.g. scripts/run.sh --default-ttl-ms 10000
set -euo pipefail
cd "$(dirname "$0")/.."

wants_local_redis=yes
[ -n "${LOCKD_REDIS_URL:-}" ] && wants_local_redis=no
case "${LOCKD_DEV:-}" in 1|[Tt]rue|[Yy]es|[Yy]|[Oo]n|[Tt]) wants_local_redis=no ;; esac
for arg in "$@"; do
  case "$arg" in --redis-url*|--dev) wants_local_redis=no ;; esac
done

# The run_id of the redis-server this script started, if it started one: it
# stops that server and no other (not one started in its place meanwhile).
started_redis=
redis_run_id() {
  { redis-cli -h 127.0.0.1 -p 6379 info server 2>/dev/null || true; } |
    sed -n 's/^run_id:\([0-9a-f]*\).*/\1/p'
}

if [ "$wants_local_redis" = yes ]; then
  scripts/ensure-deps.sh redis-server redis-cli
  if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    echo "starting redis-server on 127.0.0.1:6379 (no persistence)" >&2
    redis-server --bind 127.0.0.1 --port 6379 --save "" --appendonly no --daemonize yes \
      --logfile "${TMPDIR:-/tmp}/lockd-redis.log" >/dev/null
    for _ in $(seq 50); do
      started_redis=$(redis_run_id)
      [ -n "$started_redis" ] && break
      sleep 0.1
    done
  fi
fi

# Where cargo puts the binary: its own target directory, or the one
# CARGO_TARGET_DIR names.
lockd_bin="${CARGO_TARGET_DIR:-target}/release/lockd"

if [ -z "$started_redis" ]; then
  cargo build --release --locked --bin lockd
  exec "$lockd_bin" serve "$@"
fi

stop_started_redis() {
  if [ "$(redis_run_id)" = "$started_redis" ]; then
    redis-cli -h 127.0.0.1 -p 6379 shutdown nosave >/dev/null 2>&1 || true
    for _ in $(seq 50); do
      redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 || break
      sleep 0.1
    done
    echo "stopped the redis-server this script started on 127.0.0.1:6379" >&2
  fi
}
trap stop_started_redis EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
cargo build --release --locked --bin lockd

# lockd runs as a child, so that the script outlives it and stops the Redis;
# a Ctrl-C or SIGTERM to the script is passed on to lockd, which shuts down
# as it would have alone.
"$lockd_bin" serve "$@" &
lockd=$!
trap 'kill -INT "$lockd" 2>/dev/null || true' INT
trap 'kill -TERM "$lockd" 2>/dev/null || true' TERM
set +e
# A signal caught while waiting cuts `wait` short (status 128+signal) with
# lockd still running: wait again until it is gone.
while :; do
  wait "$lockd"
  status=$?
  kill -0 "$lockd" 2>/dev/null || break
done
# lockd may have ended, and been reaped, while a cut-short wait's trap ran:
# bash keeps its status for a later `wait` (127 when it kept none: the status
# above stands).
wait "$lockd" 2>/dev/null
last=$?
[ "$last" = 127 ] || status=$last
exit "$status"
