#!/usr/bin/env bash
# Makes sure the commands named as arguments are on PATH, installing the
# Debian packages that provide the missing ones (as root, or through sudo).
# Known commands: redis-server, redis-cli, redis-sentinel, setpriv, curl,
# python3, node, npm, promtool, haproxy, chromium (Debian's browser, which
# the console's browser tests drive headless); for the packages
# (scripts/package.sh, scripts/package-tests.sh): dpkg-deb and dpkg,
# musl-gcc, systemd-analyze and systemd-sysusers, groff, file, strip,
# /bin/kill; valgrind (bench/redis-instructions.sh);
# and python3-venv, which stands for `python3 -m venv` working (Debian's
# python3 needs the python3-venv package for it; name python3 before it).
# Example: scripts/ensure-deps.sh redis-server redis-cli
set -euo pipefail
# haproxy installs to /usr/sbin, which is not on every user's PATH: callers
# that run it add these too.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

package_of() {
  case $1 in
    redis-server|redis-cli) echo redis-server ;;
    redis-sentinel) echo redis-sentinel ;;
    setpriv) echo util-linux ;;
    node) echo nodejs ;;
    promtool) echo prometheus ;;
    dpkg-deb) echo dpkg ;;
    musl-gcc) echo musl-tools ;;
    systemd-analyze|systemd-sysusers) echo systemd ;;
    groff) echo groff-base ;;
    strip) echo binutils ;;
    # The kill of systemd units' ExecReload= (a path: `kill` alone is the
    # shell's builtin).
    /bin/kill) echo procps ;;
    *) echo "$1" ;;
  esac
}

present() {
  case $1 in
    # Debian ships ensurepip, which `-m venv` runs, in python3.X-venv.
    python3-venv) python3 -c 'import ensurepip, venv' >/dev/null 2>&1 ;;
    *) command -v "$1" >/dev/null ;;
  esac
}

missing=()
for cmd in "$@"; do
  present "$cmd" || missing+=("$(package_of "$cmd")")
done
[ ${#missing[@]} -eq 0 ] && exit 0

packages=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
echo "installing Debian packages for missing commands: $packages" >&2
if ! command -v apt-get >/dev/null; then
  echo "error: no apt-get here; install these yourself: $packages" >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then
    sudo="sudo"
  else
    echo "error: installing $packages needs root; run as root or install them yourself" >&2
    exit 1
  fi
fi
$sudo apt-get update -qq
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $packages >/dev/null
for cmd in "$@"; do
  present "$cmd" || { echo "error: $cmd is still missing" >&2; exit 1; }
done
