# Shell helpers the benchmarks share; source it: `. bench/lib.sh`.

# CPU ticks (user + system) a process has used so far, from /proc/PID/stat.
# The fields are counted after the command name's closing parenthesis, so
# a name with spaces in it does not shift them.
proc_ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }

# The same in seconds of CPU.
proc_cpu_seconds() { echo "$(proc_ticks "$1")" "$(getconf CLK_TCK)" | awk '{ print $1 / $2 }'; }

# A free loopback TCP port.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Builds lockd-bench in release, and lockd too when $1 (how many lockd
# binaries the caller was given) is 0: the caller then measures
# target/release/lockd.
build_bench() {
  if [ "$1" -eq 0 ]; then
    cargo build --release --locked --bin lockd --bin lockd-bench >&2
  else
    cargo build --release --locked --bin lockd-bench >&2
  fi
}

# Starts a redis-server of its own (no persistence) on a free loopback
# port, its files in directory $1, and waits until it answers: sets
# $redis_port and $redis_pid, and adds the pid to $pids (see scratch).
start_redis() {
  redis_port=$(free_port)
  redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$1" >/dev/null 2>&1 &
  redis_pid=$!
  pids+=("$redis_pid")
  until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.05; done
}

# Starts a redis-server of its own as start_redis does, but under
# valgrind's callgrind, which counts the instructions it runs (its dumps
# in $work/callgrind.PID.N; `callgrind_control -z` zeroes the count,
# `-d` dumps it): sets $redis_port and $redis_pid. Needs scratch first.
start_callgrind_redis() {
  redis_port=$(free_port)
  valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.%p" \
    redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work" >"$work/valgrind.log" 2>&1 &
  redis_pid=$!
  pids+=("$redis_pid")
  until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.2; done
}

# Makes a scratch directory, $work, removed at exit, when every process
# whose pid the caller adds to the array $pids is killed.
scratch() {
  work=$(mktemp -d)
  pids=()
  trap 'for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"' EXIT
}
