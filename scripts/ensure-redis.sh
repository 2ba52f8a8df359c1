#!/usr/bin/env bash
# Makes sure redis-server and redis-cli are on PATH, installing Debian's
# redis-server package when they are missing (as root, or through sudo).
set -euo pipefail

if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
  exit 0
fi
echo "redis-server not found: installing Debian's redis-server package" >&2
if ! command -v apt-get >/dev/null; then
  echo "error: no apt-get here; install Redis 6.2 or newer and put redis-server and redis-cli on PATH" >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then
    sudo="sudo"
  else
    echo "error: installing redis-server needs root; run as root or install it yourself" >&2
    exit 1
  fi
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends redis-server >/dev/null
command -v redis-server >/dev/null && command -v redis-cli >/dev/null
