"""The exceptions of the lockd client: one per problem type a caller acts on."""

from __future__ import annotations

from typing import Any, Mapping, Optional

#: The prefix of every problem type lockd sends (`urn:lockd:problem:<slug>`).
PROBLEM = "urn:lockd:problem:"


class LockdError(Exception):
    """An error answer of lockd (an RFC 9457 problem document), or a failure
    the client saw itself.

    Attributes:
        status: The HTTP status; 0 when the client saw the failure itself (no
            answer came, or a lease ran out before a renewal).
        type: The problem type, such as ``urn:lockd:problem:lock-held``; for a
            failure the client saw itself ``urn:lockd:problem:unreachable`` (no
            answer) or ``urn:lockd:problem:lease-lost`` (no renewal before the
            lease's end).
        request_id: The answer's ``x-request-id`` header (quote it when
            reporting a problem: lockd's log lines name it); ``None`` when no
            answer came.
        detail: The problem's ``detail``, which says what was wrong.
        problem: The whole problem document (``{}`` when there was none), for
            its other fields (``limit`` of a ``limit-mismatch``, say).
    """

    status: int
    type: str
    request_id: Optional[str]
    detail: str
    problem: Mapping[str, Any]

    def __init__(
        self,
        detail: str,
        *,
        status: int = 0,
        type: str = PROBLEM + "unknown",
        request_id: Optional[str] = None,
        problem: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.type = type
        self.request_id = request_id
        self.problem = dict(problem or {})

    @property
    def slug(self) -> str:
        """The problem type without its ``urn:lockd:problem:`` prefix (``lock-held``)."""
        return self.type[len(PROBLEM) :] if self.type.startswith(PROBLEM) else self.type

    def __str__(self) -> str:
        where = f"{self.status} {self.slug}" if self.status else self.slug
        if self.request_id:
            where += f", request {self.request_id}"
        return f"{self.detail} ({where})"


class LockHeld(LockdError):
    """409 ``lock-held``: another holder has the lock (after ``wait_ms``, when
    one was given).

    Attributes:
        retry_after_ms: When the holder's lease ends at the latest, in
            milliseconds (a holder that renews keeps it longer); ``None`` when
            lockd did not say.
    """

    retry_after_ms: Optional[int]

    def __init__(self, detail: str, *, retry_after_ms: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__(detail, **kwargs)
        self.retry_after_ms = retry_after_ms


class SemaphoreFull(LockHeld):
    """409 ``semaphore-full``: every permit of the semaphore is held (after
    ``wait_ms``, when one was given). ``retry_after_ms`` is when the earliest
    permit runs out, in milliseconds; ``problem["limit"]`` the semaphore's limit."""


class RunInProgress(LockHeld):
    """409 ``run-in-progress``: another attempt runs the job of this key (after
    ``wait_ms``, when one was given). ``retry_after_ms`` is when its lease
    ends, in milliseconds."""


class NotOwner(LockdError):
    """409 ``not-lock-owner``: the lock is held under another token
    (``extend``). Nothing was changed. (``not-run-owner`` maps here too,
    but ``once`` raises a lost attempt as :class:`LeaseLost`.)"""


class LeaseLost(LockdError):
    """The lease is gone: 404 ``lock-not-held`` or ``permit-not-held`` (it was
    released or ran out), or, seen by the client itself (``status`` 0, type
    ``urn:lockd:problem:lease-lost``), no renewal succeeded before the lease's
    end. Raised by ``extend``, by the ``lock``/``permit`` context managers on
    exit, and by ``once`` when the attempt's lease was lost (a renewal, or
    the ``PUT`` of its result, answered 409 ``not-run-owner`` or 404
    ``run-not-found``: ``status`` and ``type`` are lockd's)."""


class Unavailable(LockdError):
    """503 or 429 (``backend-unavailable``, ``overloaded``, ``rate-limited``,
    ...), or no answer at all (``status`` 0, type
    ``urn:lockd:problem:unreachable``, the network error as ``__cause__``),
    still so when the retries' deadline (``retry_for_ms``) came."""


class FingerprintMismatch(LockdError):
    """422 ``fingerprint-mismatch``: the run's key was first used with another
    ``fingerprint`` (the same key with another payload). Nothing was changed."""


_BY_SLUG: Mapping[str, type[LockdError]] = {
    "lock-held": LockHeld,
    "semaphore-full": SemaphoreFull,
    "run-in-progress": RunInProgress,
    "not-lock-owner": NotOwner,
    "not-run-owner": NotOwner,
    "lock-not-held": LeaseLost,
    "permit-not-held": LeaseLost,
    "fingerprint-mismatch": FingerprintMismatch,
}


def error_class(slug: str, status: int) -> type[LockdError]:
    """The exception class for a problem ``slug`` answered with ``status``."""
    known = _BY_SLUG.get(slug)
    if known is not None:
        return known
    if status in (429, 503):
        return Unavailable
    return LockdError
