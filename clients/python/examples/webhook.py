"""A GitHub webhook handler that runs each delivery's job once.

GitHub names each delivery in the ``X-GitHub-Delivery`` header, and a
delivery sent again (by hand from the settings page, or after a timeout)
has the same ID. ``once`` keyed by it runs the job for the first copy and
answers every later copy with the stored result; the payload's SHA-256 is
the fingerprint, so the same ID with another payload is refused (422).

``handle(headers, body)`` is the whole handler, for any framework;
``make_app()`` wraps it as a WSGI app, and running this file serves it:

    LOCKD_URL=http://127.0.0.1:8080 GITHUB_WEBHOOK_SECRET=... python webhook.py 8000

With ``GITHUB_WEBHOOK_SECRET`` set, a delivery must carry a valid
``X-Hub-Signature-256`` (GitHub's HMAC of the body), else it gets 401.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Mapping, Optional, Tuple

from lockd import Attempt, FingerprintMismatch, LockdError, Lockd, RunInProgress, Unavailable

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

#: The job for one delivery: given the payload and the attempt (pass
#: ``attempt.fence`` to what it writes), returns a JSON-serialisable result.
Job = Callable[[Dict[str, Any], Attempt], Any]

def deploy(payload: Dict[str, Any], attempt: Attempt) -> Dict[str, Any]:
    """The job of this example: it says what it would deploy."""
    return {"deployed": payload.get("after") or payload.get("ref"), "fence": attempt.fence}


def _answer(status: int, body: Mapping[str, Any]) -> Tuple[int, bytes]:
    return status, json.dumps(body).encode()


def handle(
    headers: Mapping[str, str],
    body: bytes,
    *,
    client: Lockd,
    job: Job = deploy,
    secret: Optional[bytes] = None,
) -> Tuple[int, bytes]:
    """Handles one delivery: returns the HTTP status and JSON body to answer.

    200 with the result, the first time (the job ran) and every time after
    (the stored result; the job does not run again); 503 while another copy
    runs it or lockd is unreachable, and 500 when the job failed or lockd
    refused the request (GitHub then shows the delivery as failed; a
    redelivery runs it again); 422 for
    the same delivery ID with another payload; 400 and 401 for a request
    that is not a valid delivery.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    delivery = lowered.get("x-github-delivery", "")
    if not re.fullmatch(r"[A-Za-z0-9-]{1,100}", delivery):
        return _answer(400, {"error": "no usable X-GitHub-Delivery header"})
    if secret is not None:
        expected = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, lowered.get("x-hub-signature-256", "")):
            return _answer(401, {"error": "bad X-Hub-Signature-256"})
    try:
        payload = json.loads(body)
    except ValueError:
        return _answer(400, {"error": "the body is not JSON"})
    fingerprint = "sha256:" + hashlib.sha256(body).hexdigest()
    try:
        result = client.once(
            f"github:{delivery}",
            lambda attempt: job(payload, attempt),
            ttl_ms=60_000,
            fingerprint=fingerprint,
            # The result is kept for lockd's --run-retention-ms (24 h by
            # default, the most a retention_ms may ask): to refuse GitHub's
            # redeliveries for longer, raise it on the server.
        )
    except RunInProgress as e:
        return _answer(503, {"error": "this delivery is being handled now", "retry_after_ms": e.retry_after_ms})
    except FingerprintMismatch:
        return _answer(422, {"error": "this delivery ID came before with another payload"})
    except Unavailable as e:
        return _answer(503, {"error": f"lockd is unavailable: {e}"})
    except LockdError as e:
        return _answer(500, {"error": f"lockd refused: {e}"})
    except Exception as e:  # noqa: BLE001 - the job failed: once() abandoned the attempt
        return _answer(500, {"error": f"the job failed: {type(e).__name__}"})
    return _answer(200, {"delivery": delivery, "result": result})


def make_app(client: Lockd, job: Job = deploy, secret: Optional[bytes] = None) -> WSGIApplication:
    """``handle`` as a WSGI app (for wsgiref, gunicorn, ...), on POST."""

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "POST":
            start_response("405 Method Not Allowed", [("Allow", "POST")])
            return [b""]
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length)
        headers = {key[5:].replace("_", "-"): str(value) for key, value in environ.items() if key.startswith("HTTP_")}
        status, answer = handle(headers, body, client=client, job=job, secret=secret)
        reasons = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 422: "Unprocessable Entity",
                   500: "Internal Server Error", 503: "Service Unavailable"}
        start_response(f"{status} {reasons[status]}", [("Content-Type", "application/json")])
        return [answer]

    return app


if __name__ == "__main__":
    from wsgiref.simple_server import make_server

    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    secret = os.environ.get("GITHUB_WEBHOOK_SECRET")
    with Lockd(os.environ.get("LOCKD_URL", "http://127.0.0.1:8080"), api_key=os.environ.get("LOCKD_API_KEY")) as lockd:
        app = make_app(lockd, secret=secret.encode() if secret else None)
        with make_server("127.0.0.1", port, app) as server:
            print(f"serving GitHub webhooks on http://127.0.0.1:{port}/", flush=True)
            server.serve_forever()
