#!/usr/bin/env bash
# Runs lockd's test suite on this machine. It installs what the tests run
# (redis-server and redis-cli, which also make a Redis Cluster;
# redis-sentinel; setpriv, which ties test servers to the test binary's life;
# curl, python3, node: the documentation's snippets are run too;
# promtool, from Debian's prometheus package, checks the metrics; haproxy
# runs the example deploy/haproxy/haproxy.cfg in front of lockd replicas)
# when missing; the tests start their own redis-server processes on free ports.
# Then, for a whole run, scripts/schemathesis.sh fuzzes the HTTP API against
# its OpenAPI document, with the release build of lockd, and
# scripts/openapi-check.sh checks that client generators read the document
# right (redocly lint, openapi-typescript and tsc --strict,
# openapi-python-client against a real lockd; npm and PyPI packages, pinned),
# scripts/client-tests.sh runs the tests of the clients in clients/
# (TypeScript and Python), scripts/console-tests.sh the browser tests of
# the console (/ui) and /docs in headless Chromium (Debian's chromium;
# playwright-core, pinned), and scripts/package-tests.sh builds the Debian
# package (from the release build) and the static binary, and tests them
# (contents, unit, an install into a throwaway root, the binaries against
# Redis).
# Extra arguments go to `cargo test`, e.g. scripts/test.sh c05; with any,
# only those tests run (no Schemathesis nor generator checks, and it says so).
# Both run even when a cargo test failed; the script then exits
# non-zero, and its last lines say which parts failed.
set -euo pipefail
cd "$(dirname "$0")/.."
# haproxy is in /usr/sbin, which is not on every user's PATH.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
scripts/ensure-deps.sh redis-server redis-cli redis-sentinel setpriv curl python3 node promtool haproxy
failed=()
cargo test --locked --no-fail-fast "$@" || failed+=("cargo test")
if [ $# -eq 0 ]; then
  # The fuzzer sends the shortest lease there is (ttl_ms 1), which a debug
  # build's round trip (p50 2 ms here) often outlasts: such a grant is
  # answered 503, since nothing of it is left. The release build, which
  # users run, answers in under a millisecond: the fuzzing runs against it.
  if cargo build --release --locked --bin lockd; then
    LOCKD_BIN="${CARGO_TARGET_DIR:-target}/release/lockd" scripts/schemathesis.sh \
      || failed+=("Schemathesis")
    LOCKD_BIN="${CARGO_TARGET_DIR:-target}/release/lockd" scripts/openapi-check.sh \
      || failed+=("the OpenAPI generator checks")
    LOCKD_BIN="${CARGO_TARGET_DIR:-target}/release/lockd" scripts/client-tests.sh \
      || failed+=("the client tests")
    LOCKD_BIN="${CARGO_TARGET_DIR:-target}/release/lockd" scripts/console-tests.sh \
      || failed+=("the console's browser tests")
    # Packages the release build just made (cargo-deb --no-build).
    scripts/package-tests.sh || failed+=("the package tests")
  else
    failed+=("the release build (so Schemathesis, the OpenAPI generator checks, the client tests, the console's browser tests and the package tests did not run)")
  fi
else
  echo "test.sh: only the tests named ($*) ran; Schemathesis, the OpenAPI generator checks, the client tests, the console's browser tests and the package tests did not run (they run with no arguments)" >&2
fi
if [ ${#failed[@]} -gt 0 ]; then
  printf 'test.sh: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "test.sh: every part passed: cargo test${1:+ ($*)}$([ $# -eq 0 ] && echo ", Schemathesis, the OpenAPI generator checks, the client tests, the console's browser tests and the package tests")" >&2
