#!/usr/bin/env bash
# Redis instructions per exclusive acquire+release cycle of lockd's Lua
# scripts alone, run back to back by one client (bench/script_cycle.py)
# on one redis-server under valgrind's callgrind: with distinct names and
# reused names, history on (HISTORY_LENGTH in the environment, default 20)
# and off. For weighing a change to the scripts in seconds, before
# building lockd; bench/redis-instructions.sh measures lockd itself.
# Each VARIANT is a directory with acquire.lua and release.lua (whole
# scripts, as lockd loads them, or bodies with the `-- @shared-rules` line,
# put together as lockd's are) measured beside the repository's;
# RECORD_KEY (environment) is the suffix of the key a variant's release
# gets as KEYS[2] (default :meta; bench/variants/README.md).
# Usage: bench/script-instructions.sh [CYCLES] [VARIANT...]  (default 600)
set -euo pipefail
cd "$(dirname "$0")/.."
cycles=${1:-600}
shift $(($# < 1 ? $# : 1))
. bench/lib.sh
scripts/ensure-deps.sh redis-server redis-cli python3 valgrind
scratch
start_callgrind_redis
export DUMPS=$work
printf '%-32s %-9s %10s\n' script names "instr./cycle"
for names in distinct reused; do
  for length in "${HISTORY_LENGTH:-20}" 0; do
    HISTORY_LENGTH=$length python3 bench/script_cycle.py "$redis_port" "$redis_pid" "$cycles" \
      "$names" "repository, history $length"
    for variant in "$@"; do
      HISTORY_LENGTH=$length python3 bench/script_cycle.py "$redis_port" "$redis_pid" "$cycles" \
        "$names" "$(basename "$variant"), history $length" \
        "$variant/acquire.lua" "$variant/release.lua"
    done
  done
done
