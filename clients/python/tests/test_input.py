"""Input refused before any request, the version, and the pure logic
(SSE parsing, times, retry pauses) on its own."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, List

import httpx
import pytest

import lockd
from lockd import AsyncLockd, Lease, Lockd, _core
from support import CLIENT_DIR, ROOT, unique


def _refusing() -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"a request was sent: {request.method} {request.url}")

    return httpx.MockTransport(handler)


BAD_MS: List[Any] = [1.5, -1, float("nan"), float("inf"), "1000", True, [1]]


@pytest.mark.parametrize("value", BAD_MS, ids=repr)
def test_bad_durations_are_value_errors_before_any_request(value: Any) -> None:
    with Lockd("http://127.0.0.1:9", transport=_refusing()) as client:
        calls: List[Callable[[], object]] = [
            lambda: client.acquire("a", ttl_ms=value),
            lambda: client.acquire("a", wait_ms=value),
            lambda: client.lock("a", max_hold_ms=value),
            lambda: client.lock("a", ttl_ms=value),
            lambda: client.acquire_permit("a", limit=1, ttl_ms=value),
            lambda: client.once("a", lambda attempt: 1, ttl_ms=value),
            lambda: client.once("a", lambda attempt: 1, retention_ms=value),
            lambda: client.watch("a", wait_ms=value),
        ]
        for call in calls:
            with pytest.raises(ValueError, match="milliseconds"):
                call()


def test_a_ttl_of_0_is_a_value_error_before_any_request() -> None:
    # lockd refuses a lease of 0 ms (a new-user trial got its 400 instead).
    with Lockd("http://127.0.0.1:9", transport=_refusing()) as client:
        lease = Lease(name="a", token="t" * 32, fence=1, ttl_ms=1, expires_at=datetime.now(timezone.utc))
        calls: List[Callable[[], object]] = [
            lambda: client.acquire("a", ttl_ms=0),
            lambda: client.extend(lease, ttl_ms=0),
            lambda: client.lock("a", ttl_ms=0),
            lambda: client.acquire_permit("a", limit=1, ttl_ms=0),
            lambda: client.once("a", lambda attempt: 1, ttl_ms=0),
        ]
        for call in calls:
            with pytest.raises(ValueError, match="1 or more"):
                call()


@pytest.mark.parametrize("name", ["", ".", ".."])
def test_names_no_url_can_carry_are_value_errors(name: str) -> None:
    with Lockd("http://127.0.0.1:9", transport=_refusing()) as client:
        lease = Lease(name=name, token="t" * 32, fence=1, ttl_ms=1, expires_at=datetime.now(timezone.utc))
        calls: List[Callable[[], object]] = [
            lambda: client.acquire(name),
            lambda: client.status(name),
            lambda: client.extend(lease),
            lambda: client.release(lease),
            lambda: client.lock(name),
            lambda: client.acquire_permit(name, limit=1),
            lambda: client.permit(name, limit=1),
            lambda: client.semaphore_status(name),
            lambda: client.once(name, lambda attempt: 1),
            lambda: client.watch(name),
        ]
        for call in calls:
            with pytest.raises(ValueError):
                call()


def test_other_bad_input_is_refused_at_once() -> None:
    with Lockd("http://127.0.0.1:9", transport=_refusing()) as client:
        with pytest.raises(ValueError):
            client.acquire_permit("a", limit=0)
        with pytest.raises(ValueError):
            client.list_locks(page_size=0)
        with pytest.raises(ValueError):
            client.acquire("a", mode="upgrade")  # type: ignore[arg-type]  # refused at run time too
        with pytest.raises(ValueError):
            client.watch("a", kind="queue")  # type: ignore[arg-type]  # refused at run time too
    for url in ("localhost:8080", "ftp://x", ""):
        with pytest.raises(ValueError):
            Lockd(url)
    with pytest.raises(ValueError):
        Lockd("http://x", retry_for_ms=-1)


def test_retention_ms_is_1_ms_or_more_before_the_job_runs() -> None:
    ran: List[object] = []
    with Lockd("http://127.0.0.1:9", transport=_refusing()) as client:
        with pytest.raises(ValueError, match="retention_ms must be a whole number of milliseconds, 1 or more"):
            client.once("a", ran.append, retention_ms=0)
    assert ran == []


@pytest.mark.anyio
async def test_retention_ms_is_1_ms_or_more_before_the_job_runs_async() -> None:
    ran: List[object] = []

    async def job(attempt: object) -> None:
        ran.append(attempt)

    async with AsyncLockd("http://127.0.0.1:9") as client:
        with pytest.raises(ValueError, match="1 or more"):
            await client.once("a", job, retention_ms=0)
    assert ran == []


@pytest.mark.parametrize(
    "key",
    ["s3cr3t-XYZ\n", "s3cr3t-XYZ\r\n", "s3cr3t XYZ", " s3cr3t-XYZ", "s3cr3t\tXYZ", "s3cr3t\x7fXYZ",
     "s3cr3t-\u00e9XYZ", "s3cr3t-\u043aXYZ", "s3cr3t\u00a0XYZ"],
    ids=repr,
)
def test_an_api_key_a_bearer_header_cannot_carry_is_a_value_error_without_the_key(key: str) -> None:
    for make in (Lockd, AsyncLockd):
        with pytest.raises(ValueError) as caught:
            make("http://127.0.0.1:9", api_key=key)
        message = str(caught.value)
        assert message.startswith("api_key must be printable ASCII without spaces"), message
        assert "s3cr3t" not in message and "XYZ" not in message, "the message shows no part of the key"
    if key.endswith("\n"):
        assert "a line break" in message and "trailing newline" in message
    with pytest.raises(ValueError, match="api_key is a string"):
        Lockd("http://127.0.0.1:9", api_key=key.encode("utf-8", "replace"))  # type: ignore[arg-type]


def test_a_bearer_token_api_key_is_taken() -> None:
    # RFC 6750's b64token characters, and lockd's own form; "" is no key.
    for key in ("lockd_" + "Ab9-_" * 8 + "xyz", "a.b~c+d/e==", "", None):
        Lockd("http://127.0.0.1:9", api_key=key).close()


def test_version_follows_lockds_cargo_toml() -> None:
    cargo = (ROOT / "Cargo.toml").read_text()
    match = re.search(r'^\[package\][^\[]*?^version = "([^"]+)"', cargo, re.M | re.S)
    assert match is not None
    pyproject = (CLIENT_DIR / "pyproject.toml").read_text()
    assert f'version = "{match.group(1)}"' in pyproject
    assert lockd.__version__ == match.group(1)


def test_every_public_item_has_a_doc_string() -> None:
    for name in lockd.__all__:
        item = getattr(lockd, name)
        if name in ("__version__", "Mode", "WatchKind"):
            continue
        assert item.__doc__, name
        for attribute, member in vars(item).items() if isinstance(item, type) else []:
            if not attribute.startswith("_") and callable(member):
                assert member.__doc__, f"{name}.{attribute}"


def test_the_api_key_is_a_bearer_header(url: str) -> None:
    seen: List[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(404, json={"type": "urn:lockd:problem:lock-not-held", "status": 404})

    with Lockd(url, api_key="s3cret", transport=httpx.MockTransport(record)) as client:
        assert client.status(unique("py:key")).held is False
    assert seen[0].headers["authorization"] == "Bearer s3cret"
    assert seen[0].headers["user-agent"].startswith("lockd-client-python/")


def test_sse_parser() -> None:
    parser = _core.SSEParser()
    lines = [
        ": keep-alive",
        "",
        "event: acquired",
        "id: 5-2",
        'data: {"name":"x",',
        'data: "fence":5}',
        "",
        "data:plain",
        "",
    ]
    events = [e for e in (parser.line(line) for line in lines) if e is not None]
    assert events[0].event == "acquired" and events[0].id == "5-2" and events[0].data == {"name": "x", "fence": 5}
    assert events[1].event == "message" and events[1].id == "5-2" and events[1].data == {"text": "plain"}


def test_parse_time() -> None:
    utc = timezone.utc
    assert _core.parse_time("2026-12-04T03:59:00.365Z") == datetime(2026, 12, 4, 3, 59, 0, 365000, tzinfo=utc)
    assert _core.parse_time("2026-12-04T03:59:00Z") == datetime(2026, 12, 4, 3, 59, tzinfo=utc)
    assert _core.parse_time("2026-12-04T05:59:00.1234567+02:00") == datetime(
        2026, 12, 4, 3, 59, 0, 123456, tzinfo=utc
    )
    assert _core.parse_time("2026-12-04T03:59:00-01:30") == datetime(2026, 12, 4, 3, 59, tzinfo=utc) + timedelta(
        hours=1, minutes=30
    )
    assert _core.parse_time(None) is None and _core.parse_time("yesterday") is None


def test_retry_pauses() -> None:
    config = _core.Config.of("http://x", None, 10_000, 10_000)
    answer = _core.answer_of(503, {"retry-after": "2"}, b'{"retry_after_ms": 400}', 0.0)
    header_only = _core.answer_of(503, {"retry-after": "2"}, b"", 0.0)
    nothing = _core.answer_of(429, {}, b"", 0.0)
    for _ in range(50):
        retrier = _core.Retrier(config)
        assert 0.2 <= retrier.pause_s(answer, None) <= 0.6
        assert 1.0 <= retrier.pause_s(header_only, None) <= 3.0
        assert 0.5 <= retrier.pause_s(nothing, None) <= 1.5
        network = _core.Retrier(config)
        pauses = [network.pause_s(None, OSError()) for _ in range(7)]
        assert 0.05 <= pauses[0] <= 0.15 and 1.0 <= pauses[6] <= 3.0, "100 ms doubling, at most 2 s"
    with pytest.raises(lockd.LockHeld):
        _core.Retrier(config).pause_s(_core.answer_of(409, {}, b'{"type":"urn:lockd:problem:lock-held"}', 0), None)
    short = _core.Retrier(_core.Config.of("http://x", None, 10_000, 100))
    with pytest.raises(lockd.Unavailable):
        short.pause_s(answer, None)


def test_problems_map_to_exceptions() -> None:
    def error(status: int, slug: str) -> lockd.LockdError:
        body = f'{{"type":"urn:lockd:problem:{slug}","status":{status},"detail":"d"}}'.encode()
        return _core.to_error(_core.answer_of(status, {"x-request-id": "r"}, body, 0.0))

    assert type(error(409, "lock-held")) is lockd.LockHeld
    assert type(error(409, "semaphore-full")) is lockd.SemaphoreFull
    assert type(error(409, "run-in-progress")) is lockd.RunInProgress
    assert type(error(409, "not-lock-owner")) is lockd.NotOwner
    assert type(error(409, "not-run-owner")) is lockd.NotOwner
    assert type(error(404, "lock-not-held")) is lockd.LeaseLost
    assert type(error(404, "permit-not-held")) is lockd.LeaseLost
    assert type(error(422, "fingerprint-mismatch")) is lockd.FingerprintMismatch
    assert type(error(503, "backend-unavailable")) is lockd.Unavailable
    assert type(error(429, "rate-limited")) is lockd.Unavailable
    assert type(error(400, "invalid-request")) is lockd.LockdError
    plain = _core.to_error(_core.answer_of(502, {}, b"<html>bad gateway</html>", 0.0))
    assert plain.status == 502 and plain.type == "urn:lockd:problem:unknown" and "bad gateway" in plain.detail
