"""Runs (once per key) with the sync client."""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List

import httpx
import pytest

from lockd import Attempt, FingerprintMismatch, LeaseLost, LockdError, LockHeld, Lockd, RunInProgress, Unavailable
from support import DropAnswers, DropFirstAnswer, Servers, assert_grants_undone, metric, unique, until


def test_first_call_runs_and_replays_return_the_stored_result(client: Lockd) -> None:
    key = unique("py:run")
    calls: List[Attempt] = []

    def job(attempt: Attempt) -> Dict[str, Any]:
        calls.append(attempt)
        return {"done": True, "fence": attempt.fence, "items": (1, 2)}

    first = client.once(key, job, ttl_ms=10_000, fingerprint="sha256:aa")
    assert len(calls) == 1
    attempt = calls[0]
    assert attempt.key == key and attempt.attempt == 1 and attempt.fence > 0 and not attempt.lost
    assert first == {"done": True, "fence": attempt.fence, "items": [1, 2]}, "the stored (JSON) result"

    def must_not_run(attempt: Attempt) -> None:
        pytest.fail("a done run ran again")

    assert client.once(key, must_not_run, fingerprint="sha256:aa") == first
    assert client.once(key, must_not_run) == first, "no fingerprint: never refused for it"


def test_fn_raising_abandons_so_the_next_call_runs_it(client: Lockd) -> None:
    key = unique("py:run-fail")

    def failing(attempt: Attempt) -> None:
        raise OSError("the job failed")

    with pytest.raises(OSError, match="the job failed"):
        client.once(key, failing, ttl_ms=30_000)
    attempts: List[int] = []

    def job(attempt: Attempt) -> str:
        attempts.append(attempt.attempt)
        return "second time lucky"

    # Abandoned: the next call runs at once, not after the 30 s lease.
    assert client.once(key, job) == "second time lucky"
    assert attempts == [2]


def test_fingerprint_mismatch(client: Lockd) -> None:
    key = unique("py:run-fp")
    client.once(key, lambda attempt: 1, fingerprint="sha256:one")
    with pytest.raises(FingerprintMismatch) as caught:
        client.once(key, lambda attempt: 2, fingerprint="sha256:two")
    assert caught.value.status == 422 and caught.value.slug == "fingerprint-mismatch"


def test_a_running_run_is_run_in_progress(client: Lockd, url: str) -> None:
    key = unique("py:run-busy")
    seen: List[RunInProgress] = []

    def job(attempt: Attempt) -> str:
        with Lockd(url) as other:
            with pytest.raises(RunInProgress) as caught:
                other.once(key, lambda a: pytest.fail("ran twice at once"))
            seen.append(caught.value)
        return "ok"

    assert client.once(key, job, ttl_ms=20_000) == "ok"
    e = seen[0]
    assert isinstance(e, LockHeld) and e.status == 409 and e.slug == "run-in-progress"
    assert e.retry_after_ms is not None and 0 < e.retry_after_ms <= 20_000


def test_wait_ms_gets_the_result_of_the_running_attempt(client: Lockd, url: str) -> None:
    key = unique("py:run-wait")
    results: List[Any] = []

    def second_caller() -> None:
        with Lockd(url) as second:
            results.append(second.once(key, lambda a: "ran twice", wait_ms=30_000))

    waiter = threading.Thread(target=second_caller)

    def job(attempt: Attempt) -> str:
        waiter.start()
        # The second caller's start is parked on lockd (in flight beside
        # this metrics request) until this attempt completes.
        until("the second caller to wait on lockd", lambda: metric(url, "lockd_http_requests_in_flight") >= 2)
        return "first"

    assert client.once(key, job) == "first"
    waiter.join(timeout=30)
    assert results == ["first"], "the waiting caller got the result, and did not run the job"


def test_the_attempt_is_renewed_while_fn_runs(client: Lockd, url: str) -> None:
    key = unique("py:run-renew")

    def slow(attempt: Attempt) -> int:
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            assert not attempt.lost, attempt.lost_reason
            time.sleep(0.05)
        return attempt.fence

    fence = client.once(key, slow, ttl_ms=700)
    assert isinstance(fence, int)


def test_lease_lost_while_fn_runs_raises_and_stores_nothing(client: Lockd, servers: Servers) -> None:
    key = unique("py:run-lost")

    def job(attempt: Attempt) -> str:
        servers.redis("DEL", f"lockd:run:{{{key}}}:attempt")
        until("attempt.lost", lambda: attempt.lost)
        return "must not be stored"

    with pytest.raises(LeaseLost):
        client.once(key, job, ttl_ms=900)
    attempts: List[int] = []

    def again(attempt: Attempt) -> str:
        attempts.append(attempt.attempt)
        return "stored"

    assert client.once(key, again) == "stored", "nothing was stored: the next call runs it"
    assert len(attempts) == 1


def test_a_result_json_cannot_carry_is_a_type_error_and_abandons(client: Lockd) -> None:
    key = unique("py:run-type")
    with pytest.raises(TypeError, match="JSON"):
        client.once(key, lambda attempt: object())
    with pytest.raises(TypeError, match="JSON"):
        client.once(key, lambda attempt: {"ratio": float("nan")})
    assert client.once(key, lambda attempt: None) is None


def test_a_dropped_answer_to_the_start_is_retried_with_the_same_token(url: str) -> None:
    dropping = DropFirstAnswer("POST")
    key = unique("py:run-drop")
    fences: List[int] = []

    def job(attempt: Attempt) -> str:
        fences.append(attempt.attempt)
        return "ok"

    with Lockd(url, transport=dropping) as client:
        assert client.once(key, job) == "ok"
    assert dropping.dropped == 1 and fences == [1], "the retry got the attempt the lost answer started"


def test_retention_ms_is_sent(url: str) -> None:
    seen: List[httpx.Request] = []
    inner = httpx.HTTPTransport()

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        response = inner.handle_request(request)
        response.read()
        return response

    with Lockd(url, transport=httpx.MockTransport(record)) as client:
        client.once(unique("py:run-keep"), lambda attempt: 1, retention_ms=60_000)
    put = [r for r in seen if r.method == "PUT"][0]
    assert put.url.path.endswith("/result")
    assert b'"retention_ms":60000' in put.content
    inner.close()


def test_an_unanswered_start_is_abandoned_so_the_next_caller_runs_the_job(client: Lockd, url: str) -> None:
    """lockd starts an attempt, but no answer comes back before
    retry_for_ms ends: once raises Unavailable after one abandon (DELETE)
    with the attempt's token, and the next caller runs the job at once
    rather than getting RunInProgress for the attempt's 60 s."""
    dropping = DropAnswers("POST")
    key = unique("py:run-unanswered")
    with Lockd(url, transport=dropping, retry_for_ms=300) as cut_off:
        with pytest.raises(Unavailable):
            cut_off.once(key, lambda attempt: pytest.fail("the job ran without an answer"), ttl_ms=60_000)
    assert_grants_undone(dropping.seen, dropping.statuses)
    attempts: List[int] = []

    def job(attempt: Attempt) -> str:
        attempts.append(attempt.attempt)
        return "ran"

    assert client.once(key, job) == "ran"
    assert attempts == [2], "the unanswered attempt was abandoned"


def test_a_retention_over_the_servers_is_refused_when_storing_and_abandons(client: Lockd) -> None:
    """The client cannot know --run-retention-ms (24 h here): lockd refuses
    a longer retention_ms at the PUT, after the job ran; the attempt is
    abandoned, so the next caller runs the job at once."""
    key = unique("py:run-retention")
    attempts: List[int] = []

    def job(attempt: Attempt) -> int:
        attempts.append(attempt.attempt)
        return attempt.attempt

    with pytest.raises(LockdError) as caught:
        client.once(key, job, ttl_ms=60_000, retention_ms=24 * 3600 * 1000 + 1)
    assert caught.value.status == 400 and "retention_ms" in caught.value.detail
    assert client.once(key, job, retention_ms=60_000) == 2
    assert attempts == [1, 2]


def test_a_run_gone_before_its_result_is_stored_is_lease_lost(client: Lockd, servers: Servers) -> None:
    """The attempt's lease and the run's record are gone when the result is
    PUT (404 run-not-found): LeaseLost, as for 409 not-run-owner."""
    key = unique("py:run-gone")
    seen: List[Attempt] = []

    def job(attempt: Attempt) -> str:
        seen.append(attempt)
        servers.redis("DEL", f"lockd:run:{{{key}}}:attempt", f"lockd:run:{{{key}}}:record")
        return "must not be stored"

    with pytest.raises(LeaseLost) as caught:
        client.once(key, job, ttl_ms=60_000)
    assert caught.value.status == 404 and caught.value.slug == "run-not-found"
    assert seen[0].lost and seen[0].lost_reason is caught.value
    assert client.once(key, lambda attempt: "stored") == "stored"
