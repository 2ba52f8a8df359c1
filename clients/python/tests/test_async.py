"""The same essentials with AsyncLockd (on asyncio, through anyio's pytest
plugin)."""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, List

import pytest

from lockd import (
    Attempt,
    AsyncLockd,
    Event,
    FingerprintMismatch,
    LeaseLost,
    LockHeld,
    NotOwner,
    RunInProgress,
    SemaphoreFull,
    Unavailable,
)
from support import (
    AsyncBusyFirst,
    AsyncDropAnswers,
    AsyncDropFirstAnswer,
    AsyncRecording,
    Servers,
    assert_grants_undone,
    unique,
    until_async,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
async def aclient(url: str) -> AsyncIterator[AsyncLockd]:
    async with AsyncLockd(url) as client:
        yield client


async def test_acquire_extend_status_release(aclient: AsyncLockd) -> None:
    name = unique("py:a-basic")
    lease = await aclient.acquire(name, ttl_ms=5_000, owner="async")
    status = await aclient.status(name)
    assert status.held and status.fence == lease.fence and status.owner == "async"
    extended = await aclient.extend(lease, ttl_ms=8_000)
    assert extended.fence == lease.fence and extended.ttl_ms > 5_000
    assert await aclient.release(extended) is True
    assert (await aclient.status(name)).held is False
    assert await aclient.release(extended) is False


async def test_held_lock_and_not_owner(aclient: AsyncLockd) -> None:
    name = unique("py:a-held")
    lease = await aclient.acquire(name, ttl_ms=20_000)
    with pytest.raises(LockHeld) as caught:
        await aclient.acquire(name)
    assert caught.value.retry_after_ms is not None and 0 < caught.value.retry_after_ms <= 20_000
    stranger = await aclient.acquire(unique("py:a-other"), ttl_ms=1_000)
    stranger.name = name
    with pytest.raises(NotOwner):
        await aclient.extend(stranger)
    await aclient.release(lease)


async def test_retry_after_a_dropped_answer_keeps_the_fence(url: str, aclient: AsyncLockd) -> None:
    dropping = AsyncDropFirstAnswer("POST")
    async with AsyncLockd(url, transport=dropping) as client:
        name = unique("py:a-dropped")
        lease = await client.acquire(name, ttl_ms=10_000)
        assert dropping.dropped == 1
        assert (await aclient.status(name)).fence == lease.fence
        await client.release(lease)


async def test_503_with_retry_after_is_retried(url: str) -> None:
    busy = AsyncBusyFirst(retry_after_ms=200)
    async with AsyncLockd(url, transport=busy) as client:
        started = time.monotonic()
        lease = await client.acquire(unique("py:a-busy"), ttl_ms=5_000)
        assert busy.refused == 1 and time.monotonic() - started >= 0.1
        await client.release(lease)


async def test_async_with_lock_renews_past_the_ttl_and_releases(url: str, aclient: AsyncLockd) -> None:
    name = unique("py:a-with")
    recording = AsyncRecording()
    async with AsyncLockd(url, transport=recording) as client:
        async with client.lock(name, ttl_ms=1_500) as lease:
            end = time.monotonic() + 3.2
            while time.monotonic() < end:
                assert not lease.lost, lease.lost_reason
                await asyncio.sleep(0.05)
            assert (await aclient.status(name)).fence == lease.fence
        assert recording.seen.methods().count("PATCH") >= 2
    assert (await aclient.status(name)).held is False


async def test_async_with_lock_releases_when_the_body_is_cancelled(aclient: AsyncLockd) -> None:
    name = unique("py:a-cancel")
    entered = asyncio.Event()

    async def body() -> None:
        async with aclient.lock(name, ttl_ms=5_000):
            entered.set()
            await asyncio.sleep(3600)

    task = asyncio.ensure_future(body())
    await entered.wait()
    task.cancel()
    await asyncio.wait({task})
    assert task.cancelled()
    assert (await aclient.status(name)).held is False


async def test_lease_lost_mid_work(aclient: AsyncLockd, servers: Servers) -> None:
    name = unique("py:a-lost")
    with pytest.raises(LeaseLost) as caught:
        async with aclient.lock(name, ttl_ms=900) as lease:
            servers.redis("DEL", f"lockd:{{{name}}}")

            async def lost() -> bool:
                return lease.lost

            await until_async("lease.lost", lost)
    assert caught.value is lease.lost_reason


async def test_max_hold_ms(aclient: AsyncLockd) -> None:
    name = unique("py:a-max")
    with pytest.raises(LeaseLost, match="max_hold_ms"):
        async with aclient.lock(name, ttl_ms=600, max_hold_ms=700) as lease:

            async def lost() -> bool:
                return lease.lost

            await until_async("the lease to run out", lost)


async def test_semaphores(aclient: AsyncLockd) -> None:
    name = unique("py:a-sem")
    first = await aclient.acquire_permit(name, limit=1, ttl_ms=10_000)
    with pytest.raises(SemaphoreFull):
        await aclient.acquire_permit(name, limit=1)
    assert (await aclient.extend_permit(first)).fence == first.fence
    assert (await aclient.semaphore_status(name)).holders == 1
    assert await aclient.release_permit(first)
    async with aclient.permit(name, limit=1, ttl_ms=900) as permit:
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            assert not permit.lost
            await asyncio.sleep(0.05)
    assert (await aclient.semaphore_status(name)).held is False


async def test_once(aclient: AsyncLockd, url: str) -> None:
    key = unique("py:a-run")
    calls: List[int] = []

    async def job(attempt: Attempt) -> dict[str, int]:
        calls.append(attempt.attempt)
        async with AsyncLockd(url) as other:

            async def never(attempt: Attempt) -> None:
                pytest.fail("ran twice at once")

            with pytest.raises(RunInProgress):
                await other.once(key, never)
        await asyncio.sleep(0.5)  # longer than a renewal's third of the TTL
        return {"fence": attempt.fence}

    first = await aclient.once(key, job, ttl_ms=900, fingerprint="fp1")
    assert calls == [1]

    async def must_not_run(attempt: Attempt) -> None:
        pytest.fail("a done run ran again")

    assert await aclient.once(key, must_not_run, fingerprint="fp1") == first
    with pytest.raises(FingerprintMismatch):
        await aclient.once(key, must_not_run, fingerprint="fp2")


async def test_once_abandons_when_fn_raises(aclient: AsyncLockd) -> None:
    key = unique("py:a-run-fail")

    async def failing(attempt: Attempt) -> None:
        raise KeyError("nope")

    with pytest.raises(KeyError):
        await aclient.once(key, failing, ttl_ms=30_000)

    async def job(attempt: Attempt) -> int:
        return attempt.attempt

    assert await aclient.once(key, job) == 2


async def test_list_locks_across_pages(aclient: AsyncLockd) -> None:
    prefix = unique("py:a-list") + ":"
    leases = [await aclient.acquire(f"{prefix}{i}", ttl_ms=20_000) for i in range(5)]
    names = {status.name async for status in aclient.list_locks(prefix=prefix, page_size=2)}
    assert names == {lease.name for lease in leases}
    permit = await aclient.acquire_permit(prefix + "sem", limit=2, ttl_ms=20_000)
    assert [s.name async for s in aclient.list_semaphores(prefix=prefix)] == [permit.name]
    for lease in leases:
        await aclient.release(lease)
    await aclient.release_permit(permit)


async def test_watch(aclient: AsyncLockd) -> None:
    name = unique("py:a-watch")
    seen: List[Event] = []
    async with aclient.watch(name, wait_ms=60_000) as events:
        async for event in events:
            seen.append(event)
            if event.event == "state":
                lease = await aclient.acquire(name, ttl_ms=10_000)
            elif event.event == "acquired":
                await aclient.release(lease)
            elif event.event == "released":
                break
    assert [e.event for e in seen] == ["state", "acquired", "released"]
    assert seen[1].data["fence"] == lease.fence


async def test_unanswered_grants_are_undone(aclient: AsyncLockd, url: str) -> None:
    """acquire, lock(), acquire_permit, permit() and once's start, each
    granted by lockd but never answered before retry_for_ms ends: each
    raises Unavailable after one DELETE with its token, so nothing is left
    held for its 60 s TTL."""

    async def never(attempt: Attempt) -> None:
        pytest.fail("the job ran without an answer")

    async def acquire(client: AsyncLockd, name: str) -> None:
        await client.acquire(name, ttl_ms=60_000)

    async def lock(client: AsyncLockd, name: str) -> None:
        async with client.lock(name, ttl_ms=60_000):
            pytest.fail("the body ran without an answer")

    async def acquire_permit(client: AsyncLockd, name: str) -> None:
        await client.acquire_permit(name, limit=1, ttl_ms=60_000)

    async def permit(client: AsyncLockd, name: str) -> None:
        async with client.permit(name, limit=1, ttl_ms=60_000):
            pytest.fail("the body ran without an answer")

    async def once(client: AsyncLockd, name: str) -> None:
        await client.once(name, never, ttl_ms=60_000)

    for grant in (acquire, lock, acquire_permit, permit, once):
        dropping = AsyncDropAnswers("POST")
        name = unique(f"py:a-unanswered-{grant.__name__}")
        async with AsyncLockd(url, transport=dropping, retry_for_ms=300) as cut_off:
            with pytest.raises(Unavailable) as caught:
                await grant(cut_off, name)
        assert caught.value.type == "urn:lockd:problem:unreachable", grant.__name__
        assert_grants_undone(dropping.seen, dropping.statuses)
        if grant in (acquire, lock):
            assert (await aclient.status(name)).held is False, grant.__name__
        elif grant in (acquire_permit, permit):
            assert (await aclient.semaphore_status(name)).held is False, grant.__name__
        else:

            async def job(attempt: Attempt) -> int:
                return attempt.attempt

            assert await aclient.once(name, job) == 2, "the unanswered attempt was abandoned"
