#!/usr/bin/env bash
# Runs lockd's test suite on this machine. It installs redis-server when it is
# missing; the tests start their own redis-server processes on free ports.
# Extra arguments go to `cargo test`, e.g. scripts/test.sh c05
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-redis.sh
cargo test --locked --no-fail-fast "$@"
