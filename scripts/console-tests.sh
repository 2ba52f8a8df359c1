#!/usr/bin/env bash
# Runs the browser tests of lockd's console (/ui) and /docs
# (tests/console/console.test.mjs) in headless Chromium, driven by
# Playwright (npm playwright-core, pinned in tests/console/package-lock.json,
# installed by `npm ci` into tests/console/node_modules), against lockd
# servers this script starts on free loopback ports over one throwaway
# redis-server:
# - one without API keys;
# - one with a keys file: a `read` key and an acquire/extend/release/read key;
# - one whose keys file gives a key the `admin` permission (for breaking a
#   lease from the page).
# node, npm and chromium (Debian's; Playwright's own browser download is not
# used) come from Debian's packages when missing. Screenshots (desktop and
# 390 px wide) are kept in ${CARGO_TARGET_DIR:-target}/console-artifacts/.
# Fails when a test fails, and when any test was skipped or left as a todo.
# scripts/test.sh runs it, with the release build, in a whole run.
# Arguments go to `node --test`, such as --test-name-pattern=keyboard (the
# other tests are then skipped, which fails nothing).
#
# lockd: $LOCKD_BIN when set, else the debug build the cargo tests run
# (scripts/servers.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
scripts/ensure-deps.sh node npm chromium redis-server redis-cli curl python3
. scripts/servers.sh
resolve_lockd_bin

target_dir=${CARGO_TARGET_DIR:-$root/target}
case $target_dir in /*) ;; *) target_dir=$root/$target_dir ;; esac
work=$target_dir/console-tests
artifacts=$target_dir/console-artifacts
rm -rf "$work" "$artifacts"
mkdir -p "$work" "$artifacts"

redis_port=$(free_port)
start_redis "$redis_port" "$work/redis.log"

# The keys: random secrets, only their SHA-256 in the files (as `lockd
# keygen` writes them).
secret() { python3 -c 'import secrets; print("lockd_" + secrets.token_urlsafe(32))'; }
sha256() { printf '%s' "$1" | python3 -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'; }
key_entry() { # ID SECRET PERMISSIONS (a TOML list)
  printf '[[keys]]\nid = "%s"\nsecret_sha256 = "%s"\nprefixes = ["*"]\npermissions = %s\n\n' "$1" "$(sha256 "$2")" "$3"
}
viewer=$(secret)
operator=$(secret)
admin=$(secret)
{
  key_entry viewer "$viewer" '["read"]'
  key_entry operator "$operator" '["acquire", "extend", "release", "read"]'
} >"$work/keys.toml"
key_entry admin "$admin" '["acquire", "extend", "release", "read", "admin"]' >"$work/admin-keys.toml"

# start_lockd NAME PORT ARGS...: starts `lockd serve` on PORT, logging to
# $work/NAME.log; returns 0 once /healthz answers, 1 if lockd exited first.
start_lockd() {
  local name=$1 port=$2
  shift 2
  "$LOCKD_BIN" serve --listen "127.0.0.1:$port" --redis-url "redis://127.0.0.1:$redis_port" "$@" \
    >"$work/$name.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 300); do
    curl -sf -o /dev/null "http://127.0.0.1:$port/healthz" && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  echo "console-tests: lockd ($name) did not answer within 30 s; see $work/$name.log" >&2
  exit 1
}

open_port=$(free_port)
start_lockd open "$open_port" ||
  { cat "$work/open.log" >&2; echo "console-tests: lockd did not start" >&2; exit 1; }
keys_port=$(free_port)
start_lockd keys "$keys_port" --auth-keys-file "$work/keys.toml" ||
  { cat "$work/keys.log" >&2; echo "console-tests: lockd with API keys did not start" >&2; exit 1; }
admin_port=$(free_port)
start_lockd admin "$admin_port" --auth-keys-file "$work/admin-keys.toml" ||
  { cat "$work/admin.log" >&2; echo "console-tests: lockd with an admin key did not start" >&2; exit 1; }

(cd tests/console && npm ci --silent --no-audit --no-fund)

status=0
(
  cd tests/console
  LOCKD_URL=http://127.0.0.1:$open_port \
  LOCKD_KEYS_URL=http://127.0.0.1:$keys_port \
  LOCKD_ADMIN_URL=http://127.0.0.1:$admin_port \
  CONSOLE_VIEWER_KEY=$viewer \
  CONSOLE_OPERATOR_KEY=$operator \
  CONSOLE_ADMIN_KEY=$admin \
  CONSOLE_ARTIFACTS=$artifacts \
  CHROMIUM=$(command -v chromium) \
  node --test --test-concurrency=1 --test-timeout=180000 \
    --test-reporter=spec --test-reporter-destination=stdout \
    --test-reporter=tap --test-reporter-destination="$work/results.tap" \
    "$@" console.test.mjs
) || status=1
# A test skipped or left as a todo checked nothing: that fails a whole run.
[ $# -eq 0 ] && for kind in skipped todo; do
  if ! grep -q "^# $kind 0$" "$work/results.tap"; then
    echo "console-tests: FAILED: a test was marked $kind ($(grep "^# $kind" "$work/results.tap"))" >&2
    status=1
  fi
done
if [ "$status" -ne 0 ]; then
  echo "console-tests: FAILED (lockd's logs: $work/*.log; screenshots: $artifacts)" >&2
  exit 1
fi
echo "console-tests: every browser test passed; screenshots in $artifacts" >&2
