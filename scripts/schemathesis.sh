#!/usr/bin/env bash
# Fuzzes lockd's HTTP API with Schemathesis, against the OpenAPI document that
# lockd serves. It starts a throwaway redis-server and lockd on free loopback
# ports, lockd with API keys on (a fresh keys file holding one key with every
# permission on every name, prefix `*`), runs the checks below with the key's
# secret in an `Authorization: Bearer` header, stops both servers, and exits
# non-zero on any failure. scripts/test.sh runs it after the cargo tests.
#
# lockd: $LOCKD_BIN when set; else target/debug/lockd (or under
# $CARGO_TARGET_DIR), the binary the cargo tests run, made sure of by
# `cargo test --no-run` (see scripts/servers.sh).
#
# Schemathesis is installed, pinned, into target/schemathesis/venv-VERSION on
# first use (Debian's python3 needs python3-venv for that; scripts/ensure-deps.sh
# installs it). Its JUnit report, lockd's and redis's logs and `st replay`
# data are left in target/schemathesis/ too.
#
# Environment:
#   LOCKD_BIN                    lockd binary to test instead of the debug build
#   LOCKD_SCHEMATHESIS_HEADER    more headers sent with every request, one per
#                                line, e.g. 'X-Request-Id: fuzz'
#   LOCKD_SCHEMATHESIS_EXAMPLES  test cases per operation and phase (default 200)
#   LOCKD_SCHEMATHESIS_SEED      seed (default 1, so that runs are repeatable)
# Extra arguments go to `st run`, e.g. scripts/schemathesis.sh --include-method POST
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
st_version=4.32.5
work=$root/target/schemathesis
venv=$work/venv-$st_version
mkdir -p "$work"

scripts/ensure-deps.sh redis-server redis-cli python3 python3-venv
if [ ! -x "$venv/bin/st" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "schemathesis==$st_version"
fi

. scripts/servers.sh
resolve_lockd_bin
redis_port=$(free_port)
lockd_port=$(free_port)
start_redis "$redis_port" "$work/redis.log"

# A fresh key for this run only: every permission, every lock name. The keys
# file holds its SHA-256; the secret stays in this shell and reaches
# Schemathesis as a header on its command line (a throwaway key on a loopback
# server), which the output sanitization below hides from output and reports.
rm -f "$work/keys.toml"
secret=$("$LOCKD_BIN" keygen --id schemathesis --prefix '*' \
  --permission acquire,extend,release,read,metrics --keys-file "$work/keys.toml")

# Short waits keep a fuzzed wait_ms from stalling the run on a held lock.
"$LOCKD_BIN" serve --listen "127.0.0.1:$lockd_port" --redis-url "redis://127.0.0.1:$redis_port" \
  --auth-keys-file "$work/keys.toml" --max-wait-ms 200 >"$work/lockd.log" 2>&1 &
pids+=($!)

# The API key must not reach the output or the reports, but lock tokens made
# up by the fuzzer should, so that a failure can be replayed: sanitize only
# auth-like names ("token" is left out of Schemathesis's default markers).
cat >"$work/schemathesis.toml" <<'EOF'
[output.sanitization]
keys-to-sanitize = ["authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key", "api_key"]
sensitive-markers = ["auth", "key", "secret", "password", "cookie", "session", "credential"]
EOF

# Leases shorter than 100 ms are left out: one of 1 ms often runs out before
# its answer arrives (on a busy machine above all), and lockd then answers
# 503 with Retry-After (nothing of the lease being left), which the fuzzer
# would count as a server error. The filters leave them out of the
# generated data; the coverage phase, which tries each bound as it is and
# does not filter, has them raised to 100 ms just before the call.
# tests/integration/fences.rs covers such leases.
cat >"$work/lockd_hooks.py" <<'EOF'
import schemathesis


def _long_enough(value):
    if not isinstance(value, dict):
        return True
    ttl = value.get("ttl_ms")
    if isinstance(ttl, str) and ttl.isdigit():
        ttl = int(ttl)
    return not (isinstance(ttl, int) and not isinstance(ttl, bool) and 0 < ttl < 100)


@schemathesis.hook
def filter_body(ctx, body):
    return _long_enough(body)


@schemathesis.hook
def filter_query(ctx, query):
    return _long_enough(query)


@schemathesis.hook
def before_call(ctx, case, kwargs):
    for part in (case.body, case.query):
        if not _long_enough(part):
            part["ttl_ms"] = 100 if isinstance(part["ttl_ms"], int) else "100"
    # A watch without wait_ms lasts until the client leaves: give it one,
    # so that its stream ends and each of its events is checked.
    if case.path.endswith("/events"):
        if case.query is None:
            case.query = {}
        if isinstance(case.query, dict) and "wait_ms" not in case.query:
            case.query["wait_ms"] = 100
EOF
export PYTHONPATH="$work${PYTHONPATH:+:$PYTHONPATH}" SCHEMATHESIS_HOOKS=lockd_hooks

headers=(--header "Authorization: Bearer $secret")
while IFS= read -r line; do
  [ -n "$line" ] && headers+=(--header "$line")
done <<<"${LOCKD_SCHEMATHESIS_HEADER:-}"

# Every check except positive_data_acceptance, which wants a 2xx for every
# request that is valid per the document. The document is written so that
# such a request is one lockd takes: it shows each value in one place only (a
# token in the Lock-Token header, required on PATCH and DELETE; ttl_ms, owner
# and wait_ms in the body), though lockd also takes them elsewhere (a token
# as the body's `token`, the others in the query string) and refuses a value
# given in both; and the maxima of ttl_ms and wait_ms are this server's own
# (--max-ttl-ms, --max-wait-ms, here 200). One rule is left that JSON Schema
# cannot state: a whole-number float such as 118.0 is an "integer" to JSON
# Schema, but lockd refuses any JSON number with a fraction part or an
# exponent where it wants milliseconds (the document says "a JSON integer"),
# and Schemathesis does generate them.
# The watch streams (`/locks/{name}/events`, `/semaphores/{name}/events`,
# `/runs/{key}/events`) are checked event by event against the document's
# `{event, id, data}` schema (`data` against its `contentSchema`); the hook
# above gives a request without `wait_ms` one of 100 ms, since a watch
# without it lasts until the client leaves.
# What the run still proves: no 5xx, every answer conforms to the document
# (status, content type, headers, body schema), requests that break the
# document are refused, and lockd does not crash.
#
# Run from target/schemathesis so Schemathesis's .hypothesis and .schemathesis
# (for `st replay`) stay there. The example database is off: repeatable runs.
# In the background, then `wait`, so that INT/TERM run the cleanup at once.
cd "$work"
"$venv/bin/st" --config-file schemathesis.toml run "http://127.0.0.1:$lockd_port/openapi.json" \
  --wait-for-schema 30 \
  --checks all \
  --exclude-checks positive_data_acceptance \
  --max-examples "${LOCKD_SCHEMATHESIS_EXAMPLES:-200}" \
  --seed "${LOCKD_SCHEMATHESIS_SEED:-1}" \
  --generation-database none \
  --request-timeout 10 \
  --report junit --report-dir "$work/report" \
  "${headers[@]}" "$@" &
pids+=($!)
wait $!
