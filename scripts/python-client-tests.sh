#!/usr/bin/env bash
# Runs the checks of the Python client (clients/python, PyPI package
# lockd-client): `mypy --strict` on its source, tests and examples, then its
# pytest suite, which starts a real lockd and redis-server on free loopback
# ports (and builds the package with `python -m build`, installs the wheel
# into a fresh venv and runs examples/cron.py there).
#
# The tools come from a venv of their own under
# ${CARGO_TARGET_DIR:-target}/python-client-venv (never in the source
# tree), with the exact versions of clients/python/requirements-dev.txt from
# PyPI, and the package installed editable. python3, python3-venv,
# redis-server and redis-cli come from Debian's packages when missing.
# Fails when anything fails, and when any test was skipped.
#
# lockd: $LOCKD_BIN when set, else the debug build the cargo tests run
# (scripts/servers.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
scripts/ensure-deps.sh python3 python3-venv redis-server redis-cli
. scripts/servers.sh
resolve_lockd_bin

target_dir=${CARGO_TARGET_DIR:-target}
case $target_dir in /*) ;; *) target_dir=$root/$target_dir ;; esac
venv=$target_dir/python-client-venv
work=$target_dir/python-client-tests
client=$root/clients/python
started=$(date +%s)

if ! "$venv/bin/python" -c 'import sys' >/dev/null 2>&1; then
  rm -rf "$venv"
  python3 -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check --quiet)
"${pip[@]}" install -r "$client/requirements-dev.txt"
# No build isolation: hatchling is the one pinned above, nothing fetched.
"${pip[@]}" install --no-build-isolation --no-deps --editable "$client"

rm -rf "$work"
mkdir -p "$work"
# Keep bytecode and tool caches out of the source tree.
export PYTHONPYCACHEPREFIX=$work/pycache
cd "$client"

mypy_out=$("$venv/bin/mypy" --strict --cache-dir "$work/mypy-cache") || { echo "$mypy_out" >&2; exit 1; }
echo "$mypy_out" >&2
checked=$(sed -nE 's/.*no issues found in ([0-9]+) source files?.*/\1/p' <<<"$mypy_out")

"$venv/bin/python" -m pytest -q -rs -p no:cacheprovider --junitxml="$work/junit.xml"

# pytest exits 0 with skipped tests; a skip here means something was not
# checked, so it fails the run.
read -r tests failed skipped < <("$venv/bin/python" - "$work/junit.xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
count = lambda key: sum(int(s.get(key, 0)) for s in suites)
print(count("tests"), count("failures") + count("errors"), count("skipped"))
EOF
)
if [ "$tests" -eq 0 ] || [ "$failed" -ne 0 ] || [ "$skipped" -ne 0 ]; then
  echo "python-client-tests: $tests tests, $failed failed, $skipped skipped: failing (nothing may be skipped)" >&2
  exit 1
fi
echo "python-client-tests: mypy --strict clean on ${checked:-?} files; pytest $((tests - skipped)) passed, 0 failed, 0 skipped; in $(( $(date +%s) - started )) s" >&2
