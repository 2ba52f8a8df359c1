"""An AWS Lambda handler that processes each order event once, whatever
the number of times Lambda (or the queue in front of it) delivers it.

The attempt's lease is the invocation's remaining time
(``context.get_remaining_time_in_millis()``, less half a second): a function
killed at its deadline frees the key for the platform's retry at once, and
a live one never loses its lease mid-job. A retry of an event that was
processed gets the stored result; one that comes while another invocation
still processes it raises, so that Lambda retries it later.

Environment: ``LOCKD_URL`` (default ``http://127.0.0.1:8080``) and
``LOCKD_API_KEY``. The client is made once per container and reused by
every invocation it serves.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, Optional, Protocol

from lockd import Attempt, Lockd

_client: Optional[Lockd] = None


class LambdaContext(Protocol):
    """The part of Lambda's context object this handler uses."""

    def get_remaining_time_in_millis(self) -> int: ...


def client() -> Lockd:
    """The container's client, made on first use."""
    global _client
    if _client is None:
        _client = Lockd(
            os.environ.get("LOCKD_URL", "http://127.0.0.1:8080"),
            api_key=os.environ.get("LOCKD_API_KEY"),
            # Give up on lockd well before Lambda gives up on us.
            retry_for_ms=5_000,
        )
    return _client


def process_order(order: Dict[str, Any], attempt: Attempt) -> Dict[str, Any]:
    """The job of this example: pass ``attempt.fence`` to what it writes (a
    payment provider's idempotency key could be the run's key)."""
    return {"order": order["id"], "charged": order.get("amount"), "fence": attempt.fence}


def handler(event: Dict[str, Any], context: LambdaContext) -> Dict[str, Any]:
    """The Lambda entry point: ``event`` is the order (``{"id": ..., ...}``)."""
    ttl_ms = max(1_000, context.get_remaining_time_in_millis() - 500)
    fingerprint = "sha256:" + hashlib.sha256(json.dumps(event, sort_keys=True).encode()).hexdigest()
    # RunInProgress (another invocation has it) and Unavailable propagate:
    # Lambda then retries the event later.
    result = client().once(
        f"orders:{event['id']}",
        lambda attempt: process_order(event, attempt),
        ttl_ms=ttl_ms,
        fingerprint=fingerprint,
    )
    return {"statusCode": 200, "body": json.dumps(result)}
