"""Locks with the sync client, against the real lockd and Redis."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import httpx
import pytest

from lockd import LeaseLost, LockdError, LockHeld, Lockd, NotOwner, Unavailable
from support import (
    BusyFirst,
    DropAnswers,
    DropFirstAnswer,
    Recording,
    Servers,
    assert_grants_undone,
    free_port,
    unique,
    until,
)


def test_acquire_extend_status_release_with_one_fence(client: Lockd) -> None:
    name = unique("py:basic")
    lease = client.acquire(name, ttl_ms=5_000, owner="test")
    assert lease.name == name
    assert lease.fence > 0
    assert lease.mode == "exclusive"
    assert 0 < lease.ttl_ms <= 5_000
    assert lease.expires_at > datetime.now(timezone.utc)
    assert len(lease.token) >= 32

    status = client.status(name)
    assert status.held and status.fence == lease.fence and status.owner == "test"
    assert status.mode == "exclusive" and status.holder_count == 1
    assert status.granted_at is not None and status.ttl_ms is not None

    extended = client.extend(lease, ttl_ms=8_000)
    assert extended.fence == lease.fence and extended.token == lease.token
    assert 5_000 < extended.ttl_ms <= 8_000
    assert lease.ttl_ms <= 5_000, "extend leaves the lease given as it was"

    assert client.release(extended) is True
    assert client.status(name).held is False
    # A lease that is gone already is no error.
    assert client.release(extended) is False


def test_free_lock_status_is_not_held(client: Lockd) -> None:
    status = client.status(unique("py:free"))
    assert status.held is False
    assert status.fence is None and status.owner is None and status.holder_count == 0


def test_held_lock_is_lock_held_with_retry_after(client: Lockd) -> None:
    name = unique("py:held")
    lease = client.acquire(name, ttl_ms=20_000)
    with pytest.raises(LockHeld) as caught:
        client.acquire(name)
    e = caught.value
    assert e.status == 409 and e.type == "urn:lockd:problem:lock-held" and e.slug == "lock-held"
    assert e.retry_after_ms is not None and 0 < e.retry_after_ms <= 20_000
    assert e.request_id
    assert "held" in e.detail
    assert e.request_id in str(e)
    client.release(lease)


def test_wait_ms_waits_on_the_server_for_a_release(client: Lockd, url: str) -> None:
    name = unique("py:wait")
    first = client.acquire(name, ttl_ms=20_000)
    with Lockd(url) as other:
        # A wait that ends: the lock stays held.
        started = time.monotonic()
        with pytest.raises(LockHeld):
            other.acquire(name, wait_ms=300)
        assert time.monotonic() - started >= 0.3
    client.release(first)
    second = client.acquire(name, wait_ms=1_000)
    assert second.fence > first.fence
    client.release(second)


def test_another_token_is_not_owner(client: Lockd) -> None:
    name = unique("py:owner")
    lease = client.acquire(name, ttl_ms=20_000)
    stranger = client.acquire(unique("py:other"), ttl_ms=1_000)
    stranger.name = name  # the same lock, another token
    with pytest.raises(NotOwner) as caught:
        client.extend(stranger)
    assert caught.value.status == 409 and caught.value.slug == "not-lock-owner"
    assert client.release(stranger) is False
    assert client.status(name).fence == lease.fence, "another token changed nothing"
    client.release(lease)


def test_extend_of_a_released_lease_is_lease_lost(client: Lockd) -> None:
    name = unique("py:gone")
    lease = client.acquire(name, ttl_ms=5_000)
    client.release(lease)
    with pytest.raises(LeaseLost) as caught:
        client.extend(lease)
    assert caught.value.status == 404 and caught.value.slug == "lock-not-held"


def test_own_token_renews_the_grant(client: Lockd) -> None:
    name = unique("py:token")
    token = "my-own-token-" + "x" * 20
    first = client.acquire(name, ttl_ms=5_000, token=token)
    again = client.acquire(name, ttl_ms=9_000, token=token)
    assert again.fence == first.fence and again.token == token
    assert again.ttl_ms > 5_000
    client.release(again)


def test_shared_locks_hold_together(client: Lockd) -> None:
    name = unique("py:shared")
    a = client.acquire(name, ttl_ms=10_000, mode="shared")
    b = client.acquire(name, ttl_ms=10_000, mode="shared")
    assert a.mode == b.mode == "shared" and b.fence > a.fence
    status = client.status(name)
    assert status.mode == "shared" and status.holder_count == 2 and len(status.holders) == 2
    with pytest.raises(LockHeld):
        client.acquire(name)
    assert client.extend(a).mode == "shared"
    client.release(a)
    client.release(b)


def test_retry_after_a_dropped_answer_keeps_the_fence(url: str) -> None:
    dropping = DropFirstAnswer("POST")
    with Lockd(url, transport=dropping) as client:
        name = unique("py:dropped")
        lease = client.acquire(name, ttl_ms=10_000)
        assert dropping.dropped == 1
        posts = [r for r in dropping.seen.requests if r.method == "POST"]
        assert len(posts) == 2, "the acquire was sent again"
        assert posts[0].headers["lock-token"] == posts[1].headers["lock-token"] == lease.token
        with Lockd(url) as other:
            assert other.status(name).fence == lease.fence, "the retry renewed the grant the lost answer made"
        assert client.release(lease)


def test_503_with_retry_after_is_retried(url: str) -> None:
    busy = BusyFirst(retry_after_ms=200)
    with Lockd(url, transport=busy) as client:
        name = unique("py:busy")
        lease = client.acquire(name, ttl_ms=5_000)
        assert busy.refused == 1
        # The pause honoured retry_after_ms, jittered 0.5 to 1.5 times.
        assert busy.next_at - busy.refused_at >= 0.1
        tokens = {r.headers["lock-token"] for r in busy.seen.requests if r.method == "POST"}
        assert tokens == {lease.token}, "the retry sent the same token"
        assert client.status(name).fence == lease.fence
        client.release(lease)


def test_503_retry_after_header_alone_is_honoured(url: str) -> None:
    busy = BusyFirst(retry_after_ms=None)  # Retry-After: 1 (second), nothing in the body
    with Lockd(url, transport=busy) as client:
        lease = client.acquire(unique("py:busy-header"), ttl_ms=5_000)
        assert busy.next_at - busy.refused_at >= 0.5
        client.release(lease)


def test_503_past_retry_for_ms_is_unavailable(url: str) -> None:
    def always_busy(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            503,
            headers={"x-request-id": "rid-1", "retry-after": "1"},
            json={"type": "urn:lockd:problem:backend-unavailable", "status": 503, "detail": "redis is down",
                  "retry_after_ms": 50},
        )

    with Lockd(url, transport=httpx.MockTransport(always_busy), retry_for_ms=300) as client:
        with pytest.raises(Unavailable) as caught:
            client.acquire("py:down")
    assert caught.value.status == 503 and caught.value.slug == "backend-unavailable"
    assert caught.value.request_id == "rid-1" and caught.value.detail == "redis is down"


def test_no_answer_is_unavailable_with_the_network_error_as_cause() -> None:
    with Lockd(f"http://127.0.0.1:{free_port()}", retry_for_ms=300) as client:
        started = time.monotonic()
        with pytest.raises(Unavailable) as caught:
            client.acquire("py:unreachable")
        assert time.monotonic() - started < 5
    e = caught.value
    assert e.status == 0 and e.type == "urn:lockd:problem:unreachable" and e.request_id is None
    assert isinstance(e.__cause__, httpx.TransportError)


def test_http_timeout_is_wait_plus_request_time_plus_2_s(url: str) -> None:
    recording = Recording()
    with Lockd(url, transport=recording, request_timeout_ms=3_000) as client:
        name = unique("py:timeout")
        lease = client.acquire(name, ttl_ms=5_000, wait_ms=1_500)
        client.extend(lease)
        client.release(lease)
    timeouts = [r.extensions["timeout"]["read"] for r in recording.seen.requests]
    assert timeouts == [1.5 + 3 + 2, 3 + 2, 3 + 2]


def test_token_goes_in_a_header_never_in_a_url_nor_a_repr(url: str) -> None:
    recording = Recording()
    with Lockd(url, transport=recording) as client:
        name = unique("py:secret")
        with client.lock(name, ttl_ms=600) as lease:
            until("a renewal", lambda: "PATCH" in recording.seen.methods())
            assert lease.token not in repr(lease)
        assert lease.token not in repr(lease)
    for request in recording.seen.requests:
        assert lease.token not in str(request.url)
        if request.method in ("POST", "PATCH", "DELETE"):
            assert request.headers["lock-token"] == lease.token
            assert lease.token not in request.content.decode()


def test_bad_names_get_lockds_400(client: Lockd) -> None:
    for name in ("a/b", "x" * 300, "with space"):
        with pytest.raises(LockdError) as caught:
            client.acquire(name)
        assert caught.value.status == 400 and caught.value.slug == "invalid-request"


def test_names_are_percent_encoded(url: str) -> None:
    recording = Recording()
    with Lockd(url, transport=recording) as client:
        name = unique("py:enc") + "@x"
        lease = client.acquire(name, ttl_ms=5_000)
        assert lease.name == name
        client.release(lease)
    assert all("%3A" in r.url.raw_path.decode() and "%40x" in r.url.raw_path.decode() for r in recording.seen.requests)


# --- with client.lock ----------------------------------------------------


def test_with_lock_renews_past_the_ttl_and_releases(client: Lockd, url: str) -> None:
    name = unique("py:with")
    recording = Recording()
    with Lockd(url, transport=recording) as renewing:
        with renewing.lock(name, ttl_ms=1_500, owner="with") as lease:
            fence = lease.fence
            first_expiry = lease.expires_at
            # Outlive the TTL twice over: only the renewals keep the lease.
            end = time.monotonic() + 3.2
            while time.monotonic() < end:
                assert not lease.lost, lease.lost_reason
                time.sleep(0.05)
            status = client.status(name)
            assert status.held and status.fence == fence and status.owner == "with"
            assert lease.expires_at > first_expiry, "the lease object follows the renewals"
        assert recording.seen.methods().count("PATCH") >= 2
    assert not lease.lost
    assert client.status(name).held is False, "released on exit"


def test_with_lock_releases_when_the_body_raises(client: Lockd) -> None:
    name = unique("py:raise")
    with pytest.raises(RuntimeError, match="boom"):
        with client.lock(name, ttl_ms=5_000):
            assert client.status(name).held
            raise RuntimeError("boom")
    assert client.status(name).held is False


def test_with_lock_of_a_held_lock_raises_lock_held(client: Lockd) -> None:
    name = unique("py:with-held")
    lease = client.acquire(name, ttl_ms=10_000)
    with pytest.raises(LockHeld):
        with client.lock(name, ttl_ms=1_000):
            pytest.fail("the body ran without the lock")
    client.release(lease)


def test_lease_lost_mid_work_sets_lost_and_raises_on_exit(client: Lockd, servers: Servers) -> None:
    name = unique("py:lost")
    with pytest.raises(LeaseLost) as caught:
        with client.lock(name, ttl_ms=900) as lease:
            servers.redis("DEL", f"lockd:{{{name}}}")
            until("lease.lost", lambda: lease.lost)
            assert lease.lost_reason is not None and "was lost" in lease.lost_reason.detail
    assert caught.value is lease.lost_reason
    assert caught.value.slug == "lock-not-held"
    # Another holder may take it at once.
    other = client.acquire(name, ttl_ms=1_000)
    client.release(other)


def test_lease_lost_and_body_raising_propagates_the_body_exception(client: Lockd, servers: Servers) -> None:
    name = unique("py:lost-raise")
    with pytest.raises(ValueError, match="body"):
        with client.lock(name, ttl_ms=900) as lease:
            servers.redis("DEL", f"lockd:{{{name}}}")
            until("lease.lost", lambda: lease.lost)
            raise ValueError("body")


def test_max_hold_ms_stops_the_renewals(client: Lockd) -> None:
    name = unique("py:max-hold")
    with pytest.raises(LeaseLost, match="max_hold_ms") as caught:
        with client.lock(name, ttl_ms=600, max_hold_ms=700) as lease:
            until("the lease to run out", lambda: lease.lost)
    assert caught.value.status == 0 and caught.value.type == "urn:lockd:problem:lease-lost"
    until("lockd to see it free", lambda: not client.status(name).held)


def test_lease_lost_when_lockd_is_unreachable_past_the_lease(client: Lockd, url: str) -> None:
    """No renewal succeeds before the lease's end: lost, on the client's own
    clock, though lockd never refused anything."""
    name = unique("py:cut")
    cut = {"on": False}
    inner = httpx.HTTPTransport()

    def maybe_cut(request: httpx.Request) -> httpx.Response:
        if cut["on"]:
            raise httpx.ConnectError("cut by the test", request=request)
        response = inner.handle_request(request)
        response.read()
        return response

    with Lockd(url, transport=httpx.MockTransport(maybe_cut)) as flaky:
        with pytest.raises(LeaseLost, match="before a renewal"):
            with flaky.lock(name, ttl_ms=800) as lease:
                cut["on"] = True
                until("lease.lost", lambda: lease.lost)
    inner.close()
    until("the lease to run out", lambda: not client.status(name).held)


def test_a_lock_context_is_used_once(client: Lockd) -> None:
    holding = client.lock(unique("py:twice"), ttl_ms=1_000)
    with holding:
        pass
    with pytest.raises(RuntimeError):
        with holding:
            pass


# --- An acquire that gives up unanswered ---------------------------------


def test_an_unanswered_acquire_is_released_not_left_held_for_its_ttl(client: Lockd, url: str) -> None:
    """lockd grants each try, but no answer comes back before retry_for_ms
    ends: the client raises Unavailable after one release with the token of
    those tries, so the grant is not left held for its 60 s."""
    dropping = DropAnswers("POST")
    name = unique("py:unanswered")
    with Lockd(url, transport=dropping, retry_for_ms=300) as cut_off:
        with pytest.raises(Unavailable) as caught:
            cut_off.acquire(name, ttl_ms=60_000)
    assert caught.value.type == "urn:lockd:problem:unreachable"
    assert isinstance(caught.value.__cause__, httpx.ReadError)
    assert_grants_undone(dropping.seen, dropping.statuses)
    assert client.status(name).held is False, "released, not held for its TTL"


def test_an_unanswered_with_lock_is_released_and_the_body_never_runs(client: Lockd, url: str) -> None:
    dropping = DropAnswers("POST")
    name = unique("py:unanswered-with")
    with Lockd(url, transport=dropping, retry_for_ms=300) as cut_off:
        with pytest.raises(Unavailable):
            with cut_off.lock(name, ttl_ms=60_000, max_hold_ms=1_000):
                pytest.fail("the body ran without an answer")
    assert_grants_undone(dropping.seen, dropping.statuses)
    assert client.status(name).held is False


def test_the_release_after_an_unanswered_acquire_is_one_try_bounded_and_silent(client: Lockd, url: str) -> None:
    """The release's answer is lost too: still one try, whose timeout is the
    request timeout's, and the acquire's Unavailable is what is raised."""
    dropping = DropAnswers("POST", "DELETE")
    name = unique("py:unanswered-twice")
    with Lockd(url, transport=dropping, retry_for_ms=300, request_timeout_ms=3_000) as cut_off:
        with pytest.raises(Unavailable) as caught:
            cut_off.acquire(name, ttl_ms=60_000)
    assert caught.value.type == "urn:lockd:problem:unreachable"
    assert_grants_undone(dropping.seen, dropping.statuses)
    assert dropping.seen.of("DELETE")[0].extensions["timeout"]["read"] == 3 + 2
    assert client.status(name).held is False, "lockd acted on the release whose answer was lost"


def test_an_unanswered_acquire_with_your_own_token_leaves_the_lease_alone(client: Lockd, url: str) -> None:
    """A token of the caller's own may have held the lease before the call
    (an acquire that renews it): it is not released."""
    name = unique("py:unanswered-own")
    token = "my-own-token-" + "y" * 20
    lease = client.acquire(name, ttl_ms=20_000, token=token)
    dropping = DropAnswers("POST")
    with Lockd(url, transport=dropping, retry_for_ms=300) as cut_off:
        with pytest.raises(Unavailable):
            cut_off.acquire(name, ttl_ms=20_000, token=token)
    assert dropping.dropped >= 1 and "DELETE" not in dropping.seen.methods()
    assert client.status(name).fence == lease.fence
    assert client.release(lease)
