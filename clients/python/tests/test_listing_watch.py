"""Listings (page by page) and watches (SSE) with the sync client."""

from __future__ import annotations

from typing import List

import pytest

from lockd import Event, LockdError, Lockd
from support import Recording, metric, unique, until


def test_list_locks_follows_the_cursor_across_pages(url: str) -> None:
    recording = Recording()
    with Lockd(url, transport=recording) as client:
        prefix = unique("py:list") + ":"
        leases = [client.acquire(f"{prefix}{i}", ttl_ms=20_000, owner=f"o{i}") for i in range(5)]
        listed = list(client.list_locks(prefix=prefix, page_size=2))
        pages = [r for r in recording.seen.requests if r.method == "GET" and r.url.path == "/locks"]
        assert len(pages) >= 3, "5 locks, 2 a page"
        assert pages[0].url.params.get("limit") == "2" and pages[0].url.params.get("prefix") == prefix
        assert "cursor" not in pages[0].url.params and "cursor" in pages[1].url.params
        assert {s.name for s in listed} == {lease.name for lease in leases}
        by_name = {s.name: s for s in listed}
        for lease in leases:
            status = by_name[lease.name]
            assert status.held and status.fence == lease.fence and status.mode == "exclusive"
            assert status.owner == "o" + lease.name.rsplit(":", 1)[1]
        for lease in leases:
            client.release(lease)
        assert list(client.list_locks(prefix=prefix)) == []


def test_list_semaphores(client: Lockd) -> None:
    prefix = unique("py:list-sem") + ":"
    permits = [client.acquire_permit(f"{prefix}{i}", limit=3, ttl_ms=20_000) for i in range(3)]
    listed = list(client.list_semaphores(prefix=prefix, page_size=2))
    assert {s.name for s in listed} == {p.name for p in permits}
    assert all(s.held and s.limit == 3 and s.holders == 1 and len(s.permits) == 1 for s in listed)
    for permit in permits:
        client.release_permit(permit)


def test_a_bad_prefix_is_lockds_400(client: Lockd) -> None:
    with pytest.raises(LockdError) as caught:
        list(client.list_locks(prefix="no spaces"))
    assert caught.value.status == 400


def test_watch_yields_state_then_acquired_extended_released(client: Lockd) -> None:
    name = unique("py:watch")
    with client.watch(name, wait_ms=60_000) as events:
        state = next(events)
        assert state.event == "state" and state.data == {"name": name, "held": False}
        assert state.id == "0-1"
        lease = client.acquire(name, ttl_ms=10_000, owner="watcher")
        acquired = next(events)
        assert acquired.event == "acquired"
        assert acquired.data["fence"] == lease.fence and acquired.data["owner"] == "watcher"
        assert acquired.id.startswith(f"{lease.fence}-")
        client.extend(lease)
        assert next(events).event == "extended"
        client.release(lease)
        released = next(events)
        assert released.event == "released" and released.data == {"name": name, "fence": lease.fence}
        assert all(lease.token not in str(e.data) for e in (state, acquired, released))


def test_watch_reconnects_when_the_stream_ends(client: Lockd) -> None:
    name = unique("py:watch-again")
    lease = client.acquire(name, ttl_ms=20_000)
    seen: List[Event] = []
    # wait_ms: each stream ends after 100 ms; the watch connects again and
    # starts with a fresh state.
    with client.watch(name, wait_ms=100) as events:
        for event in events:
            seen.append(event)
            if len(seen) == 3:
                break
    assert [e.event for e in seen] == ["state", "state", "state"]
    assert all(e.data["held"] is True and e.data["fence"] == lease.fence for e in seen)
    client.release(lease)


def test_watch_a_semaphore_and_a_run(client: Lockd) -> None:
    name = unique("py:watch-sem")
    with client.watch(name, "semaphore", wait_ms=60_000) as events:
        state = next(events)
        assert state.event == "state" and state.data["held"] is False and state.data["permits"] == []
        permit = client.acquire_permit(name, limit=2, ttl_ms=10_000)
        acquired = next(events)
        assert acquired.event == "acquired" and acquired.data["fence"] == permit.fence
        client.release_permit(permit)
        released = next(events)
        assert released.event == "released" and released.data["holders"] == 0

    key = unique("py:watch-run")
    with client.watch(key, "run", wait_ms=60_000) as events:
        state = next(events)
        assert state.event == "state" and state.data == {"key": key, "state": "unknown"}
        client.once(key, lambda attempt: "done")
        assert [next(events).event, next(events).event] == ["started", "completed"]


def test_closing_a_watch_closes_its_stream(client: Lockd, url: str) -> None:
    before = metric(url, "lockd_watchers")
    events = client.watch(unique("py:watch-close"), wait_ms=60_000)
    assert next(events).event == "state"
    until("lockd to count the stream", lambda: metric(url, "lockd_watchers") == before + 1)
    events.close()
    with pytest.raises(StopIteration):
        next(events)
    until("lockd to see the stream closed", lambda: metric(url, "lockd_watchers") == before)


def test_watch_refusals_are_raised(client: Lockd) -> None:
    with client.watch("py:ok", wait_ms=999_999_999) as events:  # over --max-wait-ms: 400
        with pytest.raises(LockdError) as caught:
            next(events)
    assert caught.value.status == 400
