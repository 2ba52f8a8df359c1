"""Starts a throwaway redis-server and a lockd on it, on free loopback ports,
once for the session; every test runs against them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, List

import httpx
import pytest

from lockd import Lockd
from support import DEADLINE_S, EXAMPLES, Servers, free_port, lockd_bin

# The tests import the examples (webhook, lambda_handler, cron) as modules.
sys.path.insert(0, str(EXAMPLES))


def _wait_until_ready(what: str, ready: Callable[[], bool], process: subprocess.Popen[bytes], log: Path) -> None:
    """Waits until ``ready()``; fails at once, with its log, when the server
    exits, and after DEADLINE_S."""
    end = time.monotonic() + DEADLINE_S
    while True:
        try:
            if ready():
                return
        except (OSError, httpx.HTTPError, subprocess.SubprocessError):
            pass  # not yet
        if process.poll() is not None or time.monotonic() > end:
            text = log.read_text(errors="replace") if log.exists() else "(no log)"
            pytest.fail(f"{what} did not start (exit {process.poll()}):\n{text[-4000:]}", pytrace=False)
        time.sleep(0.05)


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    binary = lockd_bin()
    if not binary.is_file():
        pytest.fail(f"no lockd binary at {binary}: build it, or set LOCKD_BIN", pytrace=False)
    for tool in ("redis-server", "redis-cli"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not on PATH (scripts/ensure-deps.sh redis-server redis-cli)", pytrace=False)
    logs = tmp_path_factory.mktemp("servers")
    children: List[subprocess.Popen[bytes]] = []
    try:
        redis_port = free_port()
        redis_log = logs / "redis.log"
        redis = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(redis_port), "--save", "", "--appendonly", "no",
             "--logfile", str(redis_log)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        children.append(redis)
        servers = Servers(url="", redis_port=redis_port, logs=logs)
        _wait_until_ready("redis-server", lambda: servers.redis("ping") == "PONG", redis, redis_log)

        lockd_port = free_port()
        lockd_log = logs / "lockd.log"
        with lockd_log.open("wb") as out:
            lockd = subprocess.Popen(
                [str(binary), "serve", "--listen", f"127.0.0.1:{lockd_port}",
                 "--redis-url", f"redis://127.0.0.1:{redis_port}"],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        children.append(lockd)
        servers.url = f"http://127.0.0.1:{lockd_port}"
        _wait_until_ready(
            "lockd", lambda: httpx.get(servers.url + "/readyz", timeout=2).status_code == 200, lockd, lockd_log
        )
        yield servers
    finally:
        for child in reversed(children):
            child.terminate()
        for child in children:
            try:
                child.wait(timeout=DEADLINE_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


@pytest.fixture
def url(servers: Servers) -> str:
    return servers.url


@pytest.fixture
def client(url: str) -> Iterator[Lockd]:
    with Lockd(url) as c:
        yield c


@pytest.fixture
def anyio_backend() -> str:
    """The async tests run on asyncio (AsyncLockd's runtime)."""
    return "asyncio"
