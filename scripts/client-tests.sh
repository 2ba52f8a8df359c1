#!/usr/bin/env bash
# Runs the tests of the clients in clients/ against a real lockd and
# redis-server that they start on free loopback ports: the TypeScript
# client's (`npm ci`, then `npm test`: `tsc --strict` and node's test
# runner, including a package made by `npm pack` installed into a fresh
# project). node and npm come from Debian's packages when missing; the npm
# packages (TypeScript, pinned in package-lock.json) from the npm registry.
#
# lockd: $LOCKD_BIN when set, else the debug build the cargo tests run
# (scripts/servers.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
scripts/ensure-deps.sh node npm redis-server redis-cli
. scripts/servers.sh
resolve_lockd_bin
cd clients/typescript
npm ci --silent --no-audit --no-fund
npm test
echo "client-tests: the TypeScript client's tests passed" >&2
