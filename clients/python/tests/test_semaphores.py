"""Semaphores with the sync client."""

from __future__ import annotations

import time

import pytest

from lockd import LeaseLost, LockdError, LockHeld, Lockd, SemaphoreFull, Unavailable
from support import DropAnswers, Servers, assert_grants_undone, unique, until


def test_limit_is_respected_and_a_full_semaphore_is_semaphore_full(client: Lockd) -> None:
    name = unique("py:sem")
    a = client.acquire_permit(name, limit=2, ttl_ms=10_000, owner="a")
    b = client.acquire_permit(name, limit=2, ttl_ms=10_000, owner="b")
    assert a.limit == b.limit == 2 and b.fence > a.fence and a.token != b.token
    with pytest.raises(SemaphoreFull) as caught:
        client.acquire_permit(name, limit=2)
    e = caught.value
    assert isinstance(e, LockHeld), "SemaphoreFull is a LockHeld"
    assert e.status == 409 and e.slug == "semaphore-full"
    assert e.retry_after_ms is not None and 0 < e.retry_after_ms <= 10_000
    assert e.problem["limit"] == 2

    status = client.semaphore_status(name)
    assert status.held and status.limit == 2 and status.holders == 2
    assert sorted(p.owner or "" for p in status.permits) == ["a", "b"]

    extended = client.extend_permit(a, ttl_ms=15_000)
    assert extended.fence == a.fence and 10_000 < extended.ttl_ms <= 15_000

    assert client.release_permit(a) is True
    assert client.release_permit(a) is False, "a permit given back already is no error"
    c = client.acquire_permit(name, limit=2, wait_ms=1_000)
    assert c.fence > b.fence
    client.release_permit(b)
    client.release_permit(c)
    assert client.semaphore_status(name).held is False


def test_another_limit_is_limit_mismatch(client: Lockd) -> None:
    name = unique("py:sem-limit")
    permit = client.acquire_permit(name, limit=2, ttl_ms=10_000)
    with pytest.raises(LockdError) as caught:
        client.acquire_permit(name, limit=3)
    assert caught.value.status == 409 and caught.value.slug == "limit-mismatch"
    assert caught.value.problem["limit"] == 2
    client.release_permit(permit)


def test_extend_of_a_permit_given_back_is_lease_lost(client: Lockd) -> None:
    name = unique("py:sem-gone")
    permit = client.acquire_permit(name, limit=1, ttl_ms=5_000)
    client.release_permit(permit)
    with pytest.raises(LeaseLost) as caught:
        client.extend_permit(permit)
    assert caught.value.status == 404 and caught.value.slug == "permit-not-held"


def test_with_permit_renews_and_gives_back(client: Lockd) -> None:
    name = unique("py:sem-with")
    with client.permit(name, limit=1, ttl_ms=1_200) as permit:
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            assert not permit.lost, permit.lost_reason
            time.sleep(0.05)
        with pytest.raises(SemaphoreFull):
            client.acquire_permit(name, limit=1)
        status = client.semaphore_status(name)
        assert status.holders == 1 and status.permits[0].fence == permit.fence
    assert client.semaphore_status(name).held is False


def test_permit_lost_mid_work(client: Lockd, servers: Servers) -> None:
    name = unique("py:sem-lost")
    with pytest.raises(LeaseLost) as caught:
        with client.permit(name, limit=1, ttl_ms=900) as permit:
            servers.redis("DEL", f"lockd:sem:{{{name}}}:permits", f"lockd:sem:{{{name}}}:holders")
            until("permit.lost", lambda: permit.lost)
    assert caught.value.slug == "permit-not-held"


def test_permit_max_hold_ms(client: Lockd) -> None:
    name = unique("py:sem-max")
    with pytest.raises(LeaseLost, match="max_hold_ms"):
        with client.permit(name, limit=3, ttl_ms=500, max_hold_ms=400) as permit:
            until("the permit to run out", lambda: permit.lost)
    until("the semaphore to be free", lambda: not client.semaphore_status(name).held)


def test_an_unanswered_permit_is_given_back_not_left_held_for_its_ttl(client: Lockd, url: str) -> None:
    """acquire_permit, and permit() on entry, whose every answer is lost
    until retry_for_ms ends: the permit lockd granted is given back."""
    for how in ("acquire_permit", "permit"):
        dropping = DropAnswers("POST")
        name = unique("py:sem-unanswered")
        with Lockd(url, transport=dropping, retry_for_ms=300) as cut_off:
            with pytest.raises(Unavailable):
                if how == "acquire_permit":
                    cut_off.acquire_permit(name, limit=1, ttl_ms=60_000)
                else:
                    with cut_off.permit(name, limit=1, ttl_ms=60_000):
                        pytest.fail("the body ran without an answer")
        assert_grants_undone(dropping.seen, dropping.statuses)
        assert client.semaphore_status(name).held is False, how
