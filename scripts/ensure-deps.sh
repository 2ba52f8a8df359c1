#!/usr/bin/env bash
# Makes sure the commands named as arguments are on PATH, installing the
# Debian packages that provide the missing ones (as root, or through sudo).
# Known commands: redis-server, redis-cli, curl, python3, node, promtool.
# Example: scripts/ensure-deps.sh redis-server redis-cli
set -euo pipefail

package_of() {
  case $1 in
    redis-server|redis-cli) echo redis-server ;;
    node) echo nodejs ;;
    promtool) echo prometheus ;;
    *) echo "$1" ;;
  esac
}

missing=()
for cmd in "$@"; do
  command -v "$cmd" >/dev/null || missing+=("$(package_of "$cmd")")
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
  command -v "$cmd" >/dev/null || { echo "error: $cmd is still missing" >&2; exit 1; }
done
