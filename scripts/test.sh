#!/usr/bin/env bash
# Runs lockd's test suite on this machine. It installs what the tests run
# (redis-server, curl, python3, node: the README snippets are run too;
# promtool, from Debian's prometheus package, checks the metrics) when
# missing; the tests start their own redis-server processes on free ports.
# Extra arguments go to `cargo test`, e.g. scripts/test.sh c05
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-deps.sh redis-server redis-cli curl python3 node promtool
cargo test --locked --no-fail-fast "$@"
