"""One client runs lockd's exclusive acquire and release scripts back to
back on a Redis whose instructions callgrind counts (driven by
bench/script-instructions.sh): Redis instructions per acquire+release
cycle of the scripts alone, without lockd, in seconds rather than minutes,
so that a change to the Lua can be weighed before it is built.

The scripts are put together as lockd does (src/lock/redis/mod.rs,
`exclusive_source`): fence.lua (acquire only), history.lua, and the body
with the shared-lease rules (tell.lua, semaphore.lua, shared.lua) in place
of its `-- @shared-rules` line. The arguments are those lockd sends for a
lock of 30 s with an owner and metadata, a history of HISTORY_LENGTH
(environment, default 20; 0: off) and lockd's default fence retention.

Usage: script_cycle.py PORT REDIS_PID CYCLES NAMES LABEL [ACQUIRE RELEASE]
  NAMES: reused (one name) or distinct (a new name every cycle);
  ACQUIRE and RELEASE: Lua files to run instead of the repository's: the
  whole script each, as lockd would load it, or a body that still has the
  `-- @shared-rules` line, put together as the repository's are.
  RECORD_KEY (environment, with ACQUIRE and RELEASE): the suffix of the key
  the release is given as KEYS[2]; default `:meta` (the holder hash), as
  lockd does; `:fence` for a variant that keeps the holder's record in
  the fence counter.
Prints `LABEL NAMES INSTRUCTIONS_PER_CYCLE`.
"""

import glob
import os
import socket
import subprocess
import sys
import time

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "src", "lock", "redis", "scripts")
RETENTION_MS = 3_600_000


def lua(name):
    with open(os.path.join(SCRIPTS, name)) as f:
        return f.read()


def exclusive_source(fence, body):
    rules = lua("tell.lua") + lua("semaphore.lua") + lua("shared.lua")
    return (lua("fence.lua") if fence else "") + lua("history.lua") + body.replace(
        "-- @shared-rules\n", rules, 1
    )


class Redis:
    """A bare RESP client: enough for SCRIPT LOAD and EVALSHA."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.file = self.sock.makefile("rb")

    def call(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))
        return self.read()

    def read(self):
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind in b"+:":
            return rest
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.file.read(n + 2)[:-2]
        if kind == b"*":
            return [self.read() for _ in range(max(int(rest), 0))]
        raise RuntimeError("unexpected reply %r" % line)


def main():
    port, pid, cycles, names, label = sys.argv[1:6]
    port, pid, cycles = int(port), int(pid), int(cycles)
    record_key = ":meta"
    if len(sys.argv) > 7:
        acquire_lua, release_lua = (open(p).read() for p in sys.argv[6:8])
        if "-- @shared-rules\n" in acquire_lua:
            acquire_lua = exclusive_source(True, acquire_lua)
        if "-- @shared-rules\n" in release_lua:
            release_lua = exclusive_source(False, release_lua)
        record_key = os.environ.get("RECORD_KEY", record_key)
    else:
        acquire_lua = exclusive_source(True, lua("acquire.lua"))
        release_lua = exclusive_source(False, lua("release.lua"))
    length = os.environ.get("HISTORY_LENGTH", "20")
    redis = Redis(port)
    acquire = redis.call("SCRIPT", "LOAD", acquire_lua)
    release = redis.call("SCRIPT", "LOAD", release_lua)
    run = os.urandom(4).hex()
    token = "t" * 32

    def cycle(i):
        key = "lockd:{%s%s}" % (run, i if names == "distinct" else "")
        now = int(time.time() * 1000)
        keep = 30_000 + (RETENTION_MS if length != "0" else 0)
        granted = redis.call(
            "EVALSHA", acquire, 7, key, key + ":fence", key + ":meta", key + ":shared",
            key + ":readers", key + ":writers", key + ":history",
            token, 30_000, "worker-1", now, RETENTION_MS, key + ":released", "PUBLISH", "", "",
            '{"host":"h","pid":12}', now + 30_000, keep, length, RETENTION_MS, now,
        )
        released = redis.call(
            "EVALSHA", release, 6, key, key + record_key, key + ":shared", key + ":readers",
            key + ":writers", key + ":history",
            token, key + ":released", "PUBLISH", length, RETENTION_MS, now,
        )
        if granted[0] != b"1" or released[0] != b"1":
            raise RuntimeError("cycle %d: acquire %r, release %r" % (i, granted, released))

    for i in range(50):
        cycle("w%d" % i)
    subprocess.run(["callgrind_control", "-z", str(pid)], capture_output=True, check=False)
    for i in range(cycles):
        cycle(i)
    subprocess.run(["callgrind_control", "-d", str(pid)], capture_output=True, check=False)
    dumps = glob.glob(os.path.join(os.environ["DUMPS"], "callgrind.%d.*" % pid))
    total = 0
    with open(max(dumps, key=os.path.getmtime)) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
    print("%-32s %-9s %10d" % (label, names, total // cycles))


if __name__ == "__main__":
    main()
