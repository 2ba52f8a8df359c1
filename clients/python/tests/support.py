"""Helpers of the tests: the servers they run against, waiting for an event,
unique names, and transports that drop or refuse answers on the way to the
real lockd (the locks themselves are always lockd's, in the real Redis)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable, List, Optional

import httpx

#: The repository's root (this file is clients/python/tests/support.py).
ROOT = Path(__file__).resolve().parents[3]
#: clients/python.
CLIENT_DIR = Path(__file__).resolve().parents[1]
EXAMPLES = CLIENT_DIR / "examples"

#: How long any wait for an event may take before the test fails: generous,
#: for a busy 2-core machine. Every wait ends as soon as its event happens.
DEADLINE_S = 30.0


def lockd_bin() -> Path:
    """$LOCKD_BIN, else the debug build: $CARGO_TARGET_DIR/debug/lockd, else
    <repo>/target/debug/lockd."""
    if os.environ.get("LOCKD_BIN"):
        return Path(os.environ["LOCKD_BIN"])
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    if not target.is_absolute():
        target = ROOT / target
    return target / "debug" / "lockd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def until(what: str, check: Callable[[], object], within_s: float = DEADLINE_S) -> None:
    """Waits until ``check()`` is truthy (an exception counts as not yet),
    polling every 20 ms; fails the test after ``within_s``."""
    end = time.monotonic() + within_s
    last: Optional[BaseException] = None
    while True:
        try:
            if check():
                return
        except Exception as e:  # noqa: BLE001 - not yet
            last = e
        if time.monotonic() > end:
            raise AssertionError(f"{what} did not happen within {within_s} s (last error: {last!r})")
        time.sleep(0.02)


async def until_async(what: str, check: Callable[[], Awaitable[object]], within_s: float = DEADLINE_S) -> None:
    """:func:`until` for an async check."""
    import asyncio

    end = time.monotonic() + within_s
    while True:
        if await check():
            return
        if time.monotonic() > end:
            raise AssertionError(f"{what} did not happen within {within_s} s")
        await asyncio.sleep(0.02)


def metric(url: str, name: str) -> float:
    """The value of one unlabelled metric of lockd's /metrics."""
    text = httpx.get(url + "/metrics", timeout=DEADLINE_S).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"lockd has no metric {name}")


def unique(prefix: str) -> str:
    """A name no other test uses: ``prefix:<12 hex digits>``."""
    return f"{prefix}:{uuid.uuid4().hex[:12]}"


@dataclass
class Servers:
    """A redis-server and a lockd on it, on loopback ports."""

    url: str
    redis_port: int
    logs: Path

    def redis(self, *args: str) -> str:
        """Runs a redis-cli command against the test Redis; its output."""
        done = subprocess.run(
            ["redis-cli", "-p", str(self.redis_port), *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        )
        return done.stdout.strip()


# --- Transports ----------------------------------------------------------


@dataclass
class Seen:
    """What a transport saw: each request's method, URL, headers and timeout."""

    requests: List[httpx.Request] = field(default_factory=list)

    def methods(self) -> List[str]:
        return [r.method for r in self.requests]

    def of(self, method: str) -> List[httpx.Request]:
        return [r for r in self.requests if r.method == method]


def assert_grants_undone(seen: Seen, statuses: List[int]) -> None:
    """The grant's requests (POSTs, each granted by lockd, each answer
    dropped) were followed by exactly one DELETE, last, with their token."""
    posts, deletes = seen.of("POST"), seen.of("DELETE")
    assert posts and len(statuses) >= len(posts), "every POST reached lockd"
    granted = statuses[: len(posts)]
    assert all(status in (200, 201) for status in granted), f"lockd granted them: {granted}"
    assert len({r.headers["lock-token"] for r in posts}) == 1, "the retries sent the same token"
    assert len(deletes) == 1, f"one release was tried, not retried: {seen.methods()}"
    assert seen.methods()[-1] == "DELETE"
    assert deletes[0].headers["lock-token"] == posts[0].headers["lock-token"]
    assert deletes[0].url.path == posts[0].url.path


def _problem_503(request: httpx.Request, retry_after_ms: Optional[int]) -> httpx.Response:
    body: dict[str, object] = {"type": "urn:lockd:problem:overloaded", "title": "Overloaded", "status": 503}
    if retry_after_ms is not None:
        body["retry_after_ms"] = retry_after_ms
    return httpx.Response(
        503,
        headers={"retry-after": "1", "content-type": "application/problem+json", "x-request-id": "test-503"},
        content=json.dumps(body).encode(),
        request=request,
    )


class Recording(httpx.BaseTransport):
    """Forwards every request to lockd, recording it."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.seen = Seen()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.requests.append(request)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


class DropFirstAnswer(Recording):
    """Forwards the first request of ``method`` to lockd, which acts on it,
    then throws the answer away and raises a network error, as a connection
    lost on the way back would; forwards everything else."""

    def __init__(self, method: str = "POST") -> None:
        super().__init__()
        self.method = method
        self.dropped = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.method == self.method and self.dropped == 0:
            self.dropped += 1
            response.read()
            response.close()
            raise httpx.ReadError("connection reset by peer (dropped by the test)", request=request)
        return response


class DropAnswers(Recording):
    """Forwards every request to lockd, which acts on it; for each one of
    ``methods``, throws the answer away and raises a network error instead,
    every time (as a connection lost on the way back, again and again,
    until the client's retries run out); forwards the others' answers."""

    def __init__(self, *methods: str) -> None:
        super().__init__()
        self.drop = set(methods)
        self.dropped = 0
        #: The statuses lockd answered to the requests whose answers were dropped.
        self.statuses: List[int] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.method in self.drop:
            self.dropped += 1
            self.statuses.append(response.status_code)
            response.read()
            response.close()
            raise httpx.ReadError("connection reset by peer (dropped by the test)", request=request)
        return response


class BusyFirst(Recording):
    """Answers the first request 503 (``Retry-After: 1`` and, unless None,
    ``retry_after_ms`` in the body) without sending it; forwards the rest."""

    def __init__(self, retry_after_ms: Optional[int] = 200) -> None:
        super().__init__()
        self.retry_after_ms = retry_after_ms
        self.refused = 0
        self.refused_at = 0.0
        self.next_at = 0.0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.refused == 0:
            self.refused += 1
            self.refused_at = time.monotonic()
            self.seen.requests.append(request)
            return _problem_503(request, self.retry_after_ms)
        if not self.next_at:
            self.next_at = time.monotonic()
        return super().handle_request(request)


class AsyncRecording(httpx.AsyncBaseTransport):
    """The async :class:`Recording`."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.seen = Seen()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.requests.append(request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class AsyncDropFirstAnswer(AsyncRecording):
    """The async :class:`DropFirstAnswer`."""

    def __init__(self, method: str = "POST") -> None:
        super().__init__()
        self.method = method
        self.dropped = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if request.method == self.method and self.dropped == 0:
            self.dropped += 1
            await response.aread()
            await response.aclose()
            raise httpx.ReadError("connection reset by peer (dropped by the test)", request=request)
        return response


class AsyncDropAnswers(AsyncRecording):
    """The async :class:`DropAnswers`."""

    def __init__(self, *methods: str) -> None:
        super().__init__()
        self.drop = set(methods)
        self.dropped = 0
        self.statuses: List[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if request.method in self.drop:
            self.dropped += 1
            self.statuses.append(response.status_code)
            await response.aread()
            await response.aclose()
            raise httpx.ReadError("connection reset by peer (dropped by the test)", request=request)
        return response


class AsyncBusyFirst(AsyncRecording):
    """The async :class:`BusyFirst`."""

    def __init__(self, retry_after_ms: Optional[int] = 200) -> None:
        super().__init__()
        self.retry_after_ms = retry_after_ms
        self.refused = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.refused == 0:
            self.refused += 1
            self.seen.requests.append(request)
            return _problem_503(request, self.retry_after_ms)
        return await super().handle_async_request(request)
