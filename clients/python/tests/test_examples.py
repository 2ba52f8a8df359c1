"""The examples (clients/python/examples), run against the test lockd."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import subprocess
import sys
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest

import cron
import lambda_handler
import webhook
from lockd import Attempt, Lockd, RunInProgress
from support import DEADLINE_S, EXAMPLES, unique

# --- webhook.py ----------------------------------------------------------


def _delivery(payload: Dict[str, Any]) -> Tuple[Dict[str, str], bytes]:
    body = json.dumps(payload).encode()
    return {"X-GitHub-Delivery": unique("delivery").replace(":", "-"), "X-GitHub-Event": "push"}, body


def test_webhook_runs_a_delivery_once_and_replays_the_stored_result(client: Lockd) -> None:
    ran: List[Dict[str, Any]] = []

    def job(payload: Dict[str, Any], attempt: Attempt) -> Dict[str, Any]:
        ran.append(payload)
        return {"deployed": payload["after"], "fence": attempt.fence}

    headers, body = _delivery({"ref": "refs/heads/main", "after": "abc123"})
    first = webhook.handle(headers, body, client=client, job=job)
    second = webhook.handle(headers, body, client=client, job=job)
    assert first[0] == second[0] == 200
    assert len(ran) == 1, "the redelivery did not run the job"
    assert json.loads(second[1]) == json.loads(first[1])
    assert json.loads(first[1])["result"]["deployed"] == "abc123"

    # The same delivery ID with another payload: refused.
    other = webhook.handle(headers, body.replace(b"abc123", b"evil"), client=client, job=job)
    assert other[0] == 422 and len(ran) == 1


def test_webhook_job_failing_is_500_and_a_redelivery_runs_it(client: Lockd) -> None:
    tries: List[int] = []

    def flaky(payload: Dict[str, Any], attempt: Attempt) -> str:
        tries.append(attempt.attempt)
        if len(tries) == 1:
            raise ConnectionError("the deploy target was down")
        return "deployed"

    headers, body = _delivery({"after": "def456"})
    assert webhook.handle(headers, body, client=client, job=flaky)[0] == 500
    status, answer = webhook.handle(headers, body, client=client, job=flaky)
    assert status == 200 and json.loads(answer)["result"] == "deployed" and tries == [1, 2]


def test_webhook_while_another_copy_runs_is_503(client: Lockd) -> None:
    headers, body = _delivery({"after": "0ff1ce"})
    answers: List[Tuple[int, bytes]] = []

    def job(payload: Dict[str, Any], attempt: Attempt) -> str:
        answers.append(webhook.handle(headers, body, client=client))
        return "ok"

    assert webhook.handle(headers, body, client=client, job=job)[0] == 200
    assert answers[0][0] == 503 and json.loads(answers[0][1])["retry_after_ms"] > 0


def test_webhook_checks_the_signature_and_the_delivery_header(client: Lockd) -> None:
    secret = b"it's a secret"
    headers, body = _delivery({"after": "5e1f"})
    assert webhook.handle(headers, body, client=client, secret=secret)[0] == 401
    signed = dict(headers, **{"X-Hub-Signature-256": "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()})
    assert webhook.handle(signed, body, client=client, secret=secret)[0] == 200
    assert webhook.handle({}, body, client=client)[0] == 400
    assert webhook.handle({"X-GitHub-Delivery": "../x"}, body, client=client)[0] == 400


def test_webhook_wsgi_app(client: Lockd) -> None:
    headers, body = _delivery({"after": "77"})
    app = webhook.make_app(client)
    environ: Dict[str, Any] = {
        "REQUEST_METHOD": "POST",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
        "HTTP_X_GITHUB_DELIVERY": headers["X-GitHub-Delivery"],
    }
    started: List[str] = []

    def start_response(status: str, headers: List[Tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], object]:
        started.append(status)
        return lambda data: None

    chunks = app(environ, start_response)
    assert started == ["200 OK"]
    assert json.loads(b"".join(chunks))["result"]["deployed"] == "77"


# --- lambda_handler.py ---------------------------------------------------


class FakeContext:
    """Lambda's context, with a fixed remaining time."""

    def __init__(self, remaining_ms: int) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


@pytest.fixture
def lambda_env(url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[List[Attempt]]:
    """The handler's module, pointed at the test lockd, recording the attempts."""
    monkeypatch.setenv("LOCKD_URL", url)
    monkeypatch.setattr(lambda_handler, "_client", None)
    attempts: List[Attempt] = []
    original = lambda_handler.process_order

    def recording(order: Dict[str, Any], attempt: Attempt) -> Dict[str, Any]:
        attempts.append(attempt)
        return original(order, attempt)

    monkeypatch.setattr(lambda_handler, "process_order", recording)
    yield attempts
    lambda_handler.client().close()


def test_lambda_handler_ttl_is_the_remaining_time_and_it_runs_once(lambda_env: List[Attempt]) -> None:
    event = {"id": unique("order").replace(":", "-"), "amount": 1250}
    first = lambda_handler.handler(event, FakeContext(remaining_ms=7_000))
    assert first["statusCode"] == 200 and json.loads(first["body"])["charged"] == 1250
    (attempt,) = lambda_env
    assert 6_000 < attempt.ttl_ms <= 6_500, "the remaining time less half a second"
    # Lambda's retry of the same event: the stored result, not a second charge.
    again = lambda_handler.handler(event, FakeContext(remaining_ms=3_000))
    assert again == first and len(lambda_env) == 1


def test_lambda_handler_short_on_time_still_leases_a_second(lambda_env: List[Attempt]) -> None:
    lambda_handler.handler({"id": unique("order").replace(":", "-")}, FakeContext(remaining_ms=200))
    assert 0 < lambda_env[0].ttl_ms <= 1_000


def test_lambda_handler_while_another_invocation_runs_raises(
    lambda_env: List[Attempt], monkeypatch: pytest.MonkeyPatch
) -> None:
    event = {"id": unique("order").replace(":", "-")}
    raised: List[BaseException] = []
    original = lambda_handler.process_order

    def nested(order: Dict[str, Any], attempt: Attempt) -> Dict[str, Any]:
        try:
            lambda_handler.handler(event, FakeContext(remaining_ms=5_000))
        except RunInProgress as e:
            raised.append(e)
        return original(order, attempt)

    monkeypatch.setattr(lambda_handler, "process_order", nested)
    lambda_handler.handler(event, FakeContext(remaining_ms=5_000))
    assert len(raised) == 1


# --- cron.py -------------------------------------------------------------


def _run_cron(url: str, slot: str, python: str = sys.executable, cwd: str = str(EXAMPLES)) -> str:
    done = subprocess.run(
        [python, "cron.py"],
        cwd=cwd,
        env={**os.environ, "LOCKD_URL": url, "CRON_SLOT": slot},
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_cron_does_the_work_only_when_it_gets_the_lock(client: Lockd, url: str) -> None:
    slot = unique("slot").replace(":", "-")
    assert "report written under fence" in _run_cron(url, slot)
    # Another host holds the slot's lock: this one is told, and does nothing.
    lease = client.acquire(f"cron:nightly-report:{slot}", ttl_ms=10_000)
    out = _run_cron(url, slot)
    assert out.startswith("another host runs it; free in at most ") and "report written" not in out
    client.release(lease)


def test_cron_main_in_process(url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("LOCKD_URL", url)
    monkeypatch.setenv("CRON_SLOT", unique("slot").replace(":", "-"))
    assert cron.main() == 0
    assert capsys.readouterr().out.startswith("report written under fence ")
