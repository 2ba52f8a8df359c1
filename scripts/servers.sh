# Sourced by the scripts that test lockd against servers of their own
# (scripts/schemathesis.sh, scripts/openapi-check.sh, scripts/client-tests.sh),
# from the repository's root, with $root set to it.
#
# resolve_lockd_bin: sets LOCKD_BIN, unless it is set, to the debug build the
#   cargo tests run, making sure it is there and up to date with
#   `cargo test --no-run` (a no-op right after `cargo test`; `cargo build
#   --bin lockd` would build again, since without the dev-dependencies the
#   features differ, and so do the artifacts). Exits when there is none.
# free_port: prints a loopback port that was free a moment ago.
# start_redis PORT LOG: starts a throwaway redis-server (no persistence) on
#   PORT, logging to LOG, and waits until it answers.
# Every server started with `... & pids+=($!)` is stopped at exit.

resolve_lockd_bin() {
  if [ -z "${LOCKD_BIN:-}" ]; then
    local target_dir=${CARGO_TARGET_DIR:-$root/target}
    case $target_dir in /*) ;; *) target_dir=$root/$target_dir ;; esac
    if command -v cargo >/dev/null; then
      cargo test --locked --no-run --quiet
    fi
    LOCKD_BIN=$target_dir/debug/lockd
  fi
  case $LOCKD_BIN in /*) ;; *) LOCKD_BIN=$root/$LOCKD_BIN ;; esac
  [ -x "$LOCKD_BIN" ] || { echo "error: no lockd binary at $LOCKD_BIN" >&2; exit 1; }
  export LOCKD_BIN
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

start_redis() {
  redis-server --bind 127.0.0.1 --port "$1" --save "" --appendonly no --logfile "$2" &
  pids+=($!)
  for _ in $(seq 50); do redis-cli -p "$1" ping >/dev/null 2>&1 && break; sleep 0.1; done
  redis-cli -p "$1" ping >/dev/null
}
