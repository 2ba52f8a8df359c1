#!/usr/bin/env bash
# Runs the tests of the clients in clients/ against a real lockd and
# redis-server that they start on free loopback ports:
# - the TypeScript client's (`npm ci`, then `npm test`: `tsc --strict` on
#   the client and its examples, and node's test runner, including a
#   package made by `npm pack` installed into a fresh project); node and
#   npm come from Debian's packages when missing, TypeScript (pinned in
#   package-lock.json) from the npm registry;
# - the Python client's (scripts/python-client-tests.sh: `mypy --strict`,
#   pytest, and a wheel made by `python -m build` installed into a fresh
#   venv), with the packages pinned in clients/python/requirements-dev.txt
#   from PyPI.
# Both run even when the first fails; the last line says which failed.
#
# lockd: $LOCKD_BIN when set, else the debug build the cargo tests run
# (scripts/servers.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
scripts/ensure-deps.sh node npm redis-server redis-cli
. scripts/servers.sh
resolve_lockd_bin

failed=()
if (cd clients/typescript && npm ci --silent --no-audit --no-fund && npm test); then
  echo "client-tests: the TypeScript client's tests passed" >&2
else
  failed+=("the TypeScript client's tests")
fi
scripts/python-client-tests.sh || failed+=("the Python client's tests")
if [ ${#failed[@]} -gt 0 ]; then
  printf 'client-tests: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "client-tests: the TypeScript and the Python client's tests passed" >&2
