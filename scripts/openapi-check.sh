#!/usr/bin/env bash
# Checks that client generators read lockd's OpenAPI document
# (openapi/openapi.json) right:
#   1. `@redocly/cli lint` with its recommended rules: no error, no warning;
#   2. the types `openapi-typescript` generates compile with `tsc --strict`
#      (no skipLibCheck), beside a file that uses them;
#   3. a client `openapi-python-client` generates acquires, extends and
#      releases a lock (extend and release with no body, the token in
#      `Lock-Token`) on a real lockd on a throwaway redis-server, and reads
#      the 404 after as a Problem.
# The tools are pinned and installed on first use into target/openapi-check/
# (npm packages from the npm registry, a Python venv from PyPI); node, npm
# and python3-venv come from Debian's packages when missing. Exits non-zero
# on any failure. scripts/test.sh runs it after Schemathesis.
#
# lockd: $LOCKD_BIN when set, else the debug build the cargo tests run
# (scripts/servers.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$root/target/openapi-check
doc=$root/openapi/openapi.json
redocly_version=2.77.0
openapi_typescript_version=7.13.0
typescript_version=5.9.3
python_client_version=0.29.1
mkdir -p "$work"

scripts/ensure-deps.sh node npm python3 python3-venv redis-server redis-cli

# 1 and 2: the npm tools, pinned.
node_tools=$work/node-$redocly_version-$openapi_typescript_version-$typescript_version
if [ ! -x "$node_tools/node_modules/.bin/tsc" ]; then
  rm -rf "$node_tools"
  mkdir -p "$node_tools"
  (cd "$node_tools" && echo '{"private": true}' >package.json &&
    npm install --silent --no-audit --no-fund \
      "@redocly/cli@$redocly_version" "openapi-typescript@$openapi_typescript_version" \
      "typescript@$typescript_version")
fi
bin=$node_tools/node_modules/.bin

totals=$("$bin/redocly" lint "$doc" --format json 2>/dev/null |
  python3 -c 'import json, sys; t = json.load(sys.stdin)["totals"]; print(t["errors"], t["warnings"])')
read -r errors warnings <<<"$totals"
if [ "$errors" != 0 ] || [ "$warnings" != 0 ]; then
  "$bin/redocly" lint "$doc" >&2 || true
  echo "openapi-check: redocly lint: $errors errors, $warnings warnings" >&2
  exit 1
fi
echo "openapi-check: redocly lint (recommended): no error, no warning" >&2

ts=$work/typescript
rm -rf "$ts"
mkdir -p "$ts"
"$bin/openapi-typescript" "$doc" -o "$ts/lockd.d.ts" >/dev/null
cat >"$ts/use.ts" <<'EOF'
import type { components, operations, paths } from "./lockd.d.ts";

type Grant = paths["/locks/{name}"]["post"]["responses"][201]["content"]["application/json"];
type Permit = operations["takePermit"]["responses"][201]["content"]["application/json"];
type ProblemType = components["schemas"]["Problem"]["type"];
type LockEvent = operations["watchLock"]["responses"][200]["content"]["text/event-stream"];

export const held: ProblemType = "urn:lockd:problem:lock-held";
export function fenceOf(grant: Grant, permit: Permit): number {
  return Math.max(grant.fence, permit.fence);
}
export function eventName(event: LockEvent): string {
  return event.event;
}
EOF
cat >"$ts/tsconfig.json" <<'EOF'
{
  "compilerOptions": {
    "strict": true,
    "noEmit": true,
    "skipLibCheck": false,
    "target": "es2022",
    "module": "es2022",
    "moduleResolution": "bundler",
    "allowImportingTsExtensions": true
  },
  "files": ["lockd.d.ts", "use.ts"]
}
EOF
"$bin/tsc" -p "$ts"
echo "openapi-check: openapi-typescript's types compile with tsc --strict" >&2

# 3: a generated Python client against a real lockd.
venv=$work/python-$python_client_version
if [ ! -x "$venv/bin/openapi-python-client" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "openapi-python-client==$python_client_version"
fi
py=$work/python
rm -rf "$py"
mkdir -p "$py"
"$venv/bin/openapi-python-client" generate --path "$doc" --output-path "$py/lockd_generated" \
  --meta none >"$py/generate.log" 2>&1 || { cat "$py/generate.log" >&2; exit 1; }

. scripts/servers.sh
resolve_lockd_bin
redis_port=$(free_port)
lockd_port=$(free_port)
start_redis "$redis_port" "$py/redis.log"
"$LOCKD_BIN" serve --listen "127.0.0.1:$lockd_port" --redis-url "redis://127.0.0.1:$redis_port" \
  >"$py/lockd.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$lockd_port/readyz')" \
    2>/dev/null && break
  sleep 0.1
done

cat >"$py/use.py" <<'EOF'
import sys

from lockd_generated import Client
from lockd_generated.api.locks import acquire_lock, extend_lock, inspect_lock, release_lock
from lockd_generated.models import Extended, Grant, Problem

client = Client(base_url=sys.argv[1], raise_on_unexpected_status=True)
granted = acquire_lock.sync_detailed("generated:1", client=client)
assert granted.status_code == 201 and isinstance(granted.parsed, Grant), granted
token = granted.parsed.token
extended = extend_lock.sync_detailed("generated:1", client=client, lock_token=token)
assert extended.status_code == 200 and isinstance(extended.parsed, Extended), extended
assert extended.parsed.fence == granted.parsed.fence
released = release_lock.sync_detailed("generated:1", client=client, lock_token=token)
assert released.status_code == 204, released
free = inspect_lock.sync_detailed("generated:1", client=client)
assert free.status_code == 404 and isinstance(free.parsed, Problem), free
assert free.parsed.type_ == "urn:lockd:problem:lock-not-held", free.parsed
print("acquired, extended and released with no body; fence", granted.parsed.fence)
EOF
(cd "$py" && "$venv/bin/python" use.py "http://127.0.0.1:$lockd_port") >&2
echo "openapi-check: openapi-python-client's client acquires, extends and releases" >&2
