#!/usr/bin/env bash
# Runs the tests of the clients in clients/ against a real lockd and
# redis-server that they start on free loopback ports: the TypeScript
# client's (`npm ci`, then `npm test`: `tsc --strict` and node's test
# runner, including a package made by `npm pack` installed into a fresh
# project). node and npm come from Debian's packages when missing; the npm
# packages (TypeScript, pinned in package-lock.json) from the npm registry.
#
# lockd: $LOCKD_BIN when set, else target/debug/lockd (or under
# $CARGO_TARGET_DIR), built by `cargo build --bin lockd` when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
scripts/ensure-deps.sh node npm redis-server redis-cli
if [ -z "${LOCKD_BIN:-}" ]; then
  target_dir=${CARGO_TARGET_DIR:-$root/target}
  case $target_dir in /*) ;; *) target_dir=$root/$target_dir ;; esac
  LOCKD_BIN=$target_dir/debug/lockd
  [ -x "$LOCKD_BIN" ] || cargo build --locked --quiet --bin lockd
fi
case $LOCKD_BIN in /*) ;; *) LOCKD_BIN=$root/$LOCKD_BIN ;; esac
export LOCKD_BIN
cd clients/typescript
npm ci --silent --no-audit --no-fund
npm test
echo "client-tests: the TypeScript client's tests passed" >&2
