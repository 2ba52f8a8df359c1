"""The logic the sync and the async clients share, with no I/O of its own:
checking input, building requests, reading answers, mapping problem
documents to exceptions, pacing retries, deciding renewals, parsing SSE.

The two clients (``_sync.Lockd``, ``_async.AsyncLockd``) only send what is
built here and sleep for as long as it says.
"""

from __future__ import annotations

import json
import random
import re
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union
from urllib.parse import quote

from ._errors import PROBLEM, LeaseLost, LockdError, LockHeld, NotOwner, Unavailable, error_class
from ._models import (
    Attempt,
    Event,
    Holder,
    Lease,
    LockStatus,
    Mode,
    Permit,
    SemaphoreStatus,
)

VERSION = "0.1.0"
USER_AGENT = f"lockd-client-python/{VERSION}"

#: Added to every HTTP call's timeout beyond the server's own limits, in ms:
#: the network's time, so that the client never gives up on an answer (a
#: grant) the server is still making.
SLACK_MS = 2_000

#: How long a watch may stay silent before it counts as lost, in ms: the
#: server sends a keep-alive comment after 15 s of silence.
WATCH_IDLE_TIMEOUT_MS = 45_000

Held = Union[Lease, Permit, Attempt]
Body = Dict[str, Any]


# --- Input ---------------------------------------------------------------


def check_ms(option: str, value: object, least: int = 0) -> Optional[int]:
    """``value`` when it is ``None`` or a whole number of milliseconds,
    ``least`` or more; else :class:`ValueError` (lockd would refuse it, or,
    for a float, a timer would misbehave)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{option} must be a whole number of milliseconds, {least} or more: got {value!r}")
    return value


def check_retention(retention_ms: object) -> Optional[int]:
    """A run's ``retention_ms``: ``None``, or a whole number of milliseconds,
    1 or more (lockd refuses 0). Its most, the server's
    ``--run-retention-ms``, is not known here: lockd judges it when the
    result is stored."""
    return check_ms("retention_ms", retention_ms, least=1)


def check_count(option: str, value: object) -> int:
    """``value`` when it is a whole number, 1 or more; else :class:`ValueError`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{option} must be a whole number, 1 or more: got {value!r}")
    return value


def check_name(what: str, name: object) -> str:
    """``name`` when a URL can carry it; else :class:`ValueError`.

    An empty name, ``.`` and ``..`` are refused here: URLs normalise the
    last two away (escaped or not), so no request could name them. lockd
    judges every other name (a 400 for a bad one)."""
    if not isinstance(name, str):
        raise ValueError(f"a {what} is a string: got {name!r}")
    if name in ("", ".", ".."):
        raise ValueError(f'a {what} is 1 to 200 characters, and not "." or "..": got {name!r}')
    return name


def check_mode(mode: object) -> Optional[Mode]:
    if mode is None:
        return None
    if mode == "exclusive":
        return "exclusive"
    if mode == "shared":
        return "shared"
    raise ValueError(f'mode is "exclusive" or "shared": got {mode!r}')


def check_api_key(api_key: object) -> Optional[str]:
    """``api_key`` when it is ``None``, empty (no key: nothing is sent) or a
    bearer token lockd can read: printable ASCII without spaces (RFC 6750's
    b64token is a part of that). Else :class:`ValueError`, whose message
    says what is wrong with it and where, never the key itself."""
    if api_key is None:
        return None
    if not isinstance(api_key, str):
        raise ValueError(f"api_key is a string (an API key's secret): got a {type(api_key).__name__}")
    for i, char in enumerate(api_key):
        if "\x21" <= char <= "\x7e":
            continue
        if char == " ":
            what = "a space"
        elif char in "\r\n":
            what = "a line break"
        elif char < "\x80":
            what = "a control character"
        else:
            what = "a non-ASCII character"
        at_end = api_key[i:].strip("\r\n") == ""
        hint = " (a trailing newline, from reading a file?)" if at_end else ""
        raise ValueError(
            "api_key must be printable ASCII without spaces, as a bearer token is (lockd's secrets are "
            f"lockd_ and 43 base64url characters): it has {what} at character {i + 1} of {len(api_key)}{hint}"
        )
    return api_key


def check_url(url: object) -> str:
    if not isinstance(url, str) or not re.match(r"^https?://[^/]", url):
        raise ValueError(f"url is lockd's base URL, such as http://127.0.0.1:8080: got {url!r}")
    return url.rstrip("/")


def new_token() -> str:
    """A fresh token: 32 characters of URL-safe base64 from 24 random bytes."""
    return secrets.token_urlsafe(24)


# --- Requests ------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One HTTP request to lockd, before the base URL and headers are added."""

    method: str
    path: str
    # Sent in the Lock-Token header; never in a repr (nor a URL).
    token: Optional[str] = field(default=None, repr=False)
    body: Optional[Body] = None
    params: Optional[Dict[str, str]] = None
    #: The server-side wait this request asks for, in ms (added to its timeout).
    wait_ms: int = 0
    #: A grant's request whose token was made here for it (not the caller's
    #: own): a grant under it is this request's alone, so it may be undone
    #: (:func:`undo_request`).
    made_token: bool = False


@dataclass(frozen=True)
class Config:
    """How to reach lockd: what both clients keep from their constructor."""

    url: str
    api_key: Optional[str]
    request_timeout_ms: int
    retry_for_ms: int

    @staticmethod
    def of(url: object, api_key: Optional[str], request_timeout_ms: object, retry_for_ms: object) -> Config:
        timeout = check_ms("request_timeout_ms", request_timeout_ms)
        retry = check_ms("retry_for_ms", retry_for_ms)
        assert timeout is not None and retry is not None
        return Config(check_url(url), check_api_key(api_key), timeout, retry)

    def headers(self, request: Request) -> Dict[str, str]:
        headers = {"user-agent": USER_AGENT, "accept": "application/json, application/problem+json"}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        if request.token is not None:
            # The token goes in this header, never in the URL (URLs end up
            # in access logs).
            headers["lock-token"] = request.token
        if request.body:
            headers["content-type"] = "application/json"
        return headers

    def content(self, request: Request) -> Optional[bytes]:
        if not request.body:
            return None
        return json.dumps(request.body, separators=(",", ":"), allow_nan=False).encode()

    def timeout_s(self, request: Request) -> float:
        """The HTTP timeout of one try, in seconds: the server's wait plus its
        request time limit plus the network's time, always longer than the
        server takes (a shorter one would give up on a grant the server then
        makes, which would hold the lock, unseen, until its lease ran out)."""
        return (request.wait_ms + self.request_timeout_ms + SLACK_MS) / 1000


def path(base: str, name: str, what: str) -> str:
    return f"{base}/{quote(check_name(what, name), safe='')}"


def lock_path(name: str) -> str:
    return path("/locks", name, "lock name")


def semaphore_path(name: str) -> str:
    return path("/semaphores", name, "semaphore name")


def run_path(key: str) -> str:
    return path("/runs", key, "run key")


def _put(body: Body, key: str, value: object) -> None:
    if value is not None:
        body[key] = value


def acquire_request(
    name: str,
    *,
    ttl_ms: object,
    wait_ms: object,
    token: Optional[str],
    owner: Optional[str],
    mode: object,
) -> Request:
    body: Body = {}
    _put(body, "ttl_ms", check_ms("ttl_ms", ttl_ms, least=1))
    wait = check_ms("wait_ms", wait_ms)
    _put(body, "wait_ms", wait)
    _put(body, "owner", owner)
    _put(body, "mode", check_mode(mode))
    return Request("POST", lock_path(name), token=token or new_token(), body=body, wait_ms=wait or 0, made_token=not token)


def permit_request(
    name: str,
    *,
    limit: object,
    ttl_ms: object,
    wait_ms: object,
    token: Optional[str],
    owner: Optional[str],
) -> Request:
    body: Body = {"limit": check_count("limit", limit)}
    _put(body, "ttl_ms", check_ms("ttl_ms", ttl_ms, least=1))
    wait = check_ms("wait_ms", wait_ms)
    _put(body, "wait_ms", wait)
    _put(body, "owner", owner)
    return Request("POST", semaphore_path(name), token=token or new_token(), body=body, wait_ms=wait or 0, made_token=not token)


def start_run_request(
    key: str,
    *,
    ttl_ms: object,
    fingerprint: Optional[str],
    wait_ms: object,
    owner: Optional[str],
) -> Request:
    body: Body = {}
    _put(body, "ttl_ms", check_ms("ttl_ms", ttl_ms, least=1))
    wait = check_ms("wait_ms", wait_ms)
    _put(body, "wait_ms", wait)
    _put(body, "owner", owner)
    _put(body, "fingerprint", fingerprint)
    return Request("POST", run_path(key), token=new_token(), body=body, wait_ms=wait or 0, made_token=True)


def undo_request(grant: Request) -> Optional[Request]:
    """The ``DELETE`` to try once when the grant's request ``grant`` (an
    acquire, a permit's, a run's start) gave up with :class:`Unavailable`.

    lockd, or Redis behind it, may have made the grant all the same (an
    answer lost, Redis stalled past lockd's time limit), and it would hold
    the lock until its TTL ended, under a token nobody else knows; the
    ``DELETE`` with that token releases it (for a run, abandons the
    attempt). ``None`` for a token of the caller's own: it may have held
    the lease before the call (an acquire that renews), which is left alone.
    """
    if not grant.made_token or grant.token is None:
        return None
    return Request("DELETE", grant.path, token=grant.token)


def held_path(held: Held) -> str:
    if isinstance(held, Lease):
        return lock_path(held.name)
    if isinstance(held, Permit):
        return semaphore_path(held.name)
    return run_path(held.key)


def extend_request(held: Held, ttl_ms: object) -> Request:
    ttl = check_ms("ttl_ms", ttl_ms, least=1)
    return Request("PATCH", held_path(held), token=held.token, body=None if ttl is None else {"ttl_ms": ttl})


def release_request(held: Held) -> Request:
    return Request("DELETE", held_path(held), token=held.token)


def complete_request(attempt: Attempt, result: object, retention_ms: object) -> Request:
    """The ``PUT`` that stores ``result``; :class:`TypeError` when it is not
    JSON-serialisable (checked here, before anything is sent)."""
    body: Body = {"result": result}
    _put(body, "retention_ms", check_retention(retention_ms))
    try:
        json.dumps(body, allow_nan=False)  # NaN and Infinity are not JSON
    except (TypeError, ValueError) as e:
        raise TypeError(f"the job's result must be JSON-serialisable: {e}") from e
    return Request("PUT", run_path(attempt.key) + "/result", token=attempt.token, body=body)


def list_request(base: str, prefix: Optional[str], page_size: Optional[int], cursor: Optional[str]) -> Request:
    params: Dict[str, str] = {}
    if prefix:
        params["prefix"] = prefix
    if page_size is not None:
        params["limit"] = str(page_size)
    if cursor is not None:
        params["cursor"] = cursor
    return Request("GET", base, params=params)


def check_listing(prefix: object, page_size: object) -> Tuple[Optional[str], Optional[int]]:
    if prefix is not None and not isinstance(prefix, str):
        raise ValueError(f"prefix is a string: got {prefix!r}")
    return prefix, None if page_size is None else check_count("page_size", page_size)


def watch_request(name: str, kind: object, wait_ms: object) -> Request:
    bases: Mapping[object, Tuple[str, str]] = {
        "lock": ("/locks", "lock name"),
        "semaphore": ("/semaphores", "semaphore name"),
        "run": ("/runs", "run key"),
    }
    if kind not in bases:
        raise ValueError(f'kind is "lock", "semaphore" or "run": got {kind!r}')
    base, what = bases[kind]
    wait = check_ms("wait_ms", wait_ms)
    params = {} if wait is None else {"wait_ms": str(wait)}
    return Request("GET", path(base, name, what) + "/events", params=params)


# --- Answers -------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """One HTTP answer of lockd, its JSON body read."""

    status: int
    # A grant's body holds its token: kept out of the repr.
    body: Body = field(repr=False)
    headers: Mapping[str, str] = field(repr=False)
    #: When the request that got this answer was sent (time.monotonic()).
    sent_at: float


def answer_of(status: int, headers: Mapping[str, str], content: bytes, sent_at: float) -> Answer:
    body: Body = {}
    if content:
        text = content.decode("utf-8", "replace")
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        body = parsed if isinstance(parsed, dict) else {"detail": text.strip()[:500]}
    return Answer(status, body, headers, sent_at)


def request_id(answer: Answer) -> Optional[str]:
    rid = answer.headers.get("x-request-id")
    if rid:
        return rid
    from_body = answer.body.get("request_id")
    return from_body if isinstance(from_body, str) else None


def retry_after_ms(answer: Answer) -> Optional[int]:
    """What the answer says to wait before trying again, in ms: its body's
    ``retry_after_ms``, else its ``Retry-After`` header (seconds)."""
    ms = answer.body.get("retry_after_ms")
    if isinstance(ms, int) and not isinstance(ms, bool) and ms >= 0:
        return ms
    header = answer.headers.get("retry-after")
    if header is not None and header.strip().isdigit():
        return int(header.strip()) * 1000
    return None


def to_error(answer: Answer) -> LockdError:
    """The exception for an error answer, by its problem ``type``."""
    type_ = answer.body.get("type")
    if not isinstance(type_, str):
        type_ = PROBLEM + "unknown"
    detail = answer.body.get("detail")
    if not isinstance(detail, str) or not detail:
        detail = f"lockd answered HTTP {answer.status}"
    slug = type_[len(PROBLEM) :] if type_.startswith(PROBLEM) else type_
    cls = error_class(slug, answer.status)
    kwargs: Dict[str, Any] = {
        "status": answer.status,
        "type": type_,
        "request_id": request_id(answer),
        "problem": answer.body,
    }
    if issubclass(cls, LockHeld):
        return cls(detail, retry_after_ms=retry_after_ms(answer), **kwargs)
    return cls(detail, **kwargs)


def unreachable(url: str, failure: BaseException) -> Unavailable:
    error = Unavailable(
        f"no answer from lockd at {url}: {type(failure).__name__}: {failure}",
        type=PROBLEM + "unreachable",
    )
    error.__cause__ = failure
    return error


def _unexpected(answer: Answer, what: str) -> LockdError:
    return LockdError(
        f"lockd's answer (HTTP {answer.status}) lacks {what}",
        status=answer.status,
        type=PROBLEM + "unexpected-answer",
        request_id=request_id(answer),
        # A grant's answer holds its token: never in an exception.
        problem={k: v for k, v in answer.body.items() if k != "token"},
    )


def _int(answer: Answer, body: Mapping[str, Any], key: str) -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _unexpected(answer, f"an integer {key}")
    return value


def _opt_int(body: Mapping[str, Any], key: str) -> Optional[int]:
    value = body.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_str(body: Mapping[str, Any], key: str) -> Optional[str]:
    value = body.get(key)
    return value if isinstance(value, str) else None


_TIME = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))$"
)


def parse_time(text: object) -> Optional[datetime]:
    """An RFC 3339 time as an aware UTC datetime (Python 3.9's
    ``fromisoformat`` takes neither ``Z`` nor every fraction); ``None`` for
    anything else."""
    if not isinstance(text, str):
        return None
    m = _TIME.match(text)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    micro = int((m.group(7) or "0")[:6].ljust(6, "0"))
    offset = timedelta(0)
    if m.group(9):
        offset = timedelta(hours=int(m.group(10)), minutes=int(m.group(11)))
        if m.group(9) == "-":
            offset = -offset
    moment = datetime(year, month, day, hour, minute, second, micro, tzinfo=timezone(offset))
    return moment.astimezone(timezone.utc)


def _time(answer: Answer, body: Mapping[str, Any], key: str) -> datetime:
    moment = parse_time(body.get(key))
    if moment is None:
        raise _unexpected(answer, f"an RFC 3339 {key}")
    return moment


def _valid_until(answer: Answer, ttl_ms: int) -> float:
    # lockd counts the lease from when it sent the request to Redis, which
    # is after this host sent its request: this end is at or before the
    # real one, whatever the two clocks say.
    return answer.sent_at + ttl_ms / 1000


def lease_of(answer: Answer, token: str, mode: Optional[Mode] = None) -> Lease:
    body = answer.body
    ttl = _int(answer, body, "ttl_ms")
    lease = Lease(
        name=str(body.get("name", "")),
        token=token,
        fence=_int(answer, body, "fence"),
        ttl_ms=ttl,
        expires_at=_time(answer, body, "expires_at"),
        mode=mode or ("shared" if body.get("mode") == "shared" else "exclusive"),
    )
    lease._valid_until = _valid_until(answer, ttl)
    return lease


def permit_of(answer: Answer, token: str) -> Permit:
    body = answer.body
    ttl = _int(answer, body, "ttl_ms")
    permit = Permit(
        name=str(body.get("name", "")),
        token=token,
        fence=_int(answer, body, "fence"),
        ttl_ms=ttl,
        expires_at=_time(answer, body, "expires_at"),
        limit=_int(answer, body, "limit"),
    )
    permit._valid_until = _valid_until(answer, ttl)
    return permit


def run_is_done(answer: Answer) -> bool:
    """Whether a start answered a done run (200 ``state: done``), whose
    ``result`` is to be replayed; else it answered an attempt to run."""
    return answer.body.get("state") == "done"


def attempt_of(answer: Answer, token: str) -> Attempt:
    body = answer.body
    ttl = _int(answer, body, "ttl_ms")
    attempt = Attempt(
        key=str(body.get("key", "")),
        token=token,
        fence=_int(answer, body, "fence"),
        attempt=_int(answer, body, "attempt"),
        ttl_ms=ttl,
        expires_at=_time(answer, body, "expires_at"),
    )
    attempt._valid_until = _valid_until(answer, ttl)
    return attempt


def renewed(held: Held, answer: Answer) -> None:
    """Updates ``held`` in place from a renewal's answer."""
    ttl = _int(answer, answer.body, "ttl_ms")
    held.ttl_ms = ttl
    held.expires_at = _time(answer, answer.body, "expires_at")
    held._valid_until = _valid_until(answer, ttl)


def _holder(item: Mapping[str, Any]) -> Holder:
    fence = _opt_int(item, "fence")
    return Holder(
        fence=fence if fence is not None else 0,
        owner=_opt_str(item, "owner"),
        ttl_ms=_opt_int(item, "ttl_ms"),
        expires_at=parse_time(item.get("expires_at")),
        granted_at=parse_time(item.get("granted_at")),
    )


def _holders(value: object) -> Tuple[Holder, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(_holder(item) for item in value if isinstance(item, dict))


def lock_status_of(body: Mapping[str, Any], name: str) -> LockStatus:
    count = _opt_int(body, "holder_count")
    return LockStatus(
        name=_opt_str(body, "name") or name,
        held=True,
        fence=_opt_int(body, "fence"),
        ttl_ms=_opt_int(body, "ttl_ms"),
        expires_at=parse_time(body.get("expires_at")),
        owner=_opt_str(body, "owner"),
        granted_at=parse_time(body.get("granted_at")),
        mode="shared" if body.get("mode") == "shared" else "exclusive",
        holder_count=1 if count is None else count,
        holders=_holders(body.get("holders")),
        writer_waiting=body.get("writer_waiting") is True,
    )


def semaphore_status_of(body: Mapping[str, Any], name: str) -> SemaphoreStatus:
    permits = _holders(body.get("permits"))
    count = _opt_int(body, "holders")
    return SemaphoreStatus(
        name=_opt_str(body, "name") or name,
        held=True,
        limit=_opt_int(body, "limit"),
        holders=len(permits) if count is None else count,
        permits=permits,
    )


def page_of(answer: Answer, key: str) -> Tuple[List[Mapping[str, Any]], Optional[str]]:
    """The items of one listing page and the next page's cursor (``None`` on
    the last page)."""
    items = answer.body.get(key)
    if not isinstance(items, list):
        raise _unexpected(answer, f"a list of {key}")
    cursor = answer.body.get("next_cursor")
    return [item for item in items if isinstance(item, dict)], cursor if isinstance(cursor, str) else None


# --- Retries -------------------------------------------------------------


def jittered(seconds: float) -> float:
    """``seconds`` times a random factor from 0.5 to 1.5, so that clients
    refused at once do not all come back at once."""
    return seconds * (0.5 + random.random())


class Retrier:
    """Paces the tries of one call: network errors, 429 and 503 are tried
    again (with the same request, so the same token) after a pause, while
    the pause ends before the deadline; anything else is the answer.

    ``until`` (time.monotonic()) replaces the deadline of ``retry_for_ms``
    when it is earlier; with ``bound_timeouts`` each try's HTTP timeout
    also ends by it (a renewal past the lease's end is no use).
    """

    def __init__(self, config: Config, until: Optional[float] = None, bound_timeouts: bool = False) -> None:
        self._config = config
        deadline = time.monotonic() + config.retry_for_ms / 1000
        self.until = deadline if until is None else min(until, deadline)
        self._bound = bound_timeouts
        self._tries = 0

    def timeout_s(self, request: Request) -> float:
        timeout = self._config.timeout_s(request)
        if self._bound:
            timeout = min(timeout, max(0.05, self.until - time.monotonic()))
        return timeout

    def pause_s(self, answer: Optional[Answer], failure: Optional[BaseException]) -> float:
        """The pause before the next try, in seconds; or raises the call's
        error when there is to be none."""
        tries = self._tries
        self._tries += 1
        if answer is not None and answer.status not in (429, 503):
            raise to_error(answer)
        if answer is None:
            base_ms: float = min(100 * 2**tries, 2_000)
        else:
            ms = retry_after_ms(answer)
            base_ms = 1_000 if ms is None else max(50, ms)
        pause = jittered(base_ms / 1000)
        if time.monotonic() + pause >= self.until:
            raise self.give_up(answer, failure)
        return pause

    def give_up(self, answer: Optional[Answer], failure: Optional[BaseException]) -> LockdError:
        if answer is not None:
            return to_error(answer)
        return unreachable(self._config.url, failure or TimeoutError("no answer"))


class Backoff:
    """The pause before a watch connects again: doubling from 100 ms up to
    5 s, back to 100 ms once a stream delivered an event; jittered."""

    def __init__(self) -> None:
        self._ms = 100

    def reset(self) -> None:
        self._ms = 100

    def next_s(self, at_least_ms: Optional[int] = None) -> float:
        ms = max(self._ms, at_least_ms or 0)
        self._ms = min(self._ms * 2, 5_000)
        return jittered(ms / 1000)


def watch_refusal_pause_ms(answer: Answer) -> int:
    """For a watch answered other than 200: how long to wait before trying
    again (503, 429, 5xx), in ms; or raises its error (400, 401, 403, 501:
    trying again cannot cure them)."""
    if answer.status in (429, 503) or (answer.status >= 500 and answer.status != 501):
        ms = retry_after_ms(answer)
        return 1_000 if ms is None else ms
    raise to_error(answer)


# --- Renewals ------------------------------------------------------------

WAIT, RENEW, LOST = "wait", "renew", "lost"


class Keeper:
    """Decides when a held lease (a lock's, a permit's or a run attempt's) is
    renewed, and when it is lost; the sync client runs it on a thread, the
    async one on a task. Times are time.monotonic().

    It renews every third of the lease's TTL, until ``max_hold_ms`` after
    the grant; it declares the lease lost when a renewal is refused (404 or
    409: it ran out, was released, or another holds it) or when the lease's
    end comes before a renewal succeeded.
    """

    def __init__(self, held: Held, *, ttl_ms: Optional[int], max_hold_ms: Optional[int], what: str) -> None:
        self.held = held
        self._ttl_ms = ttl_ms
        self._max_hold_ms = max_hold_ms
        self._what = what
        now = time.monotonic()
        self._started = now
        self._next_renewal = now + self._third_s()

    def _third_s(self) -> float:
        return max(0.001, self.held.ttl_ms / 3000)

    @property
    def valid_until(self) -> float:
        return self.held._valid_until

    def _holding_ended(self, now: float) -> bool:
        return self._max_hold_ms is not None and now - self._started >= self._max_hold_ms / 1000

    def wake_at(self) -> float:
        """When to look next."""
        if self._holding_ended(self._next_renewal):
            return self.valid_until
        return min(self._next_renewal, self.valid_until)

    def step(self, now: float) -> str:
        """What to do now: ``RENEW``, ``WAIT`` (until :meth:`wake_at`) or
        ``LOST`` (the lease's end came: it is now marked lost)."""
        if self.held.lost:
            return LOST
        if now >= self.valid_until:
            self._lose_at_end()
            return LOST
        if self._holding_ended(now) or now < self._next_renewal:
            return WAIT
        return RENEW

    def extend_request(self) -> Request:
        return extend_request(self.held, self._ttl_ms)

    def renewed(self, answer: Answer) -> None:
        renewed(self.held, answer)
        self._next_renewal = answer.sent_at + self._third_s()

    def failed(self, error: BaseException) -> bool:
        """A renewal failed with ``error``. Returns True when the lease is
        lost for it (refused: 404, 409); else the renewal is tried again
        soon, until the lease's end."""
        if isinstance(error, (LeaseLost, NotOwner)) or (
            isinstance(error, LockdError) and error.status in (404, 409)
        ):
            assert isinstance(error, LockdError)
            self._lose(
                LeaseLost(
                    f"the {self._what} was lost: {error.detail}",
                    status=error.status,
                    type=error.type,
                    request_id=error.request_id,
                    problem=error.problem,
                )
            )
            return True
        self._next_renewal = time.monotonic() + min(1.0, self._third_s())
        return False

    def finish(self, now: float) -> Optional[LeaseLost]:
        """The renewals are over (the body ended): the reason the lease was
        lost, if it was, or if its end has come."""
        if not self.held.lost and now >= self.valid_until:
            self._lose_at_end()
        return self.held.lost_reason

    def _lose_at_end(self) -> None:
        if self._max_hold_ms is not None and self._holding_ended(self.valid_until):
            why = f"the {self._what} ran out: renewals stop at max_hold_ms ({self._max_hold_ms} ms)"
        else:
            why = f"the {self._what} ran out before a renewal"
        self._lose(LeaseLost(why, type=PROBLEM + "lease-lost"))

    def _lose(self, reason: LeaseLost) -> None:
        if not self.held.lost:
            self.held.lost_reason = reason
            self.held.lost = True


def attempt_gone(error: LockdError) -> bool:
    """Whether the answer to an attempt's ``PUT`` of its result says the
    attempt is gone: 409 ``not-run-owner`` (its lease ran out, and it may
    have been taken over; or it was abandoned) or 404 ``run-not-found``
    (its lease ran out and the run's record with it)."""
    return isinstance(error, NotOwner) or (error.status == 404 and error.slug == "run-not-found")


def lost_at_completion(attempt: Attempt, error: LockdError) -> LeaseLost:
    reason = LeaseLost(
        f"the attempt of run {attempt.key} was lost before its result was stored: {error.detail}",
        status=error.status,
        type=error.type,
        request_id=error.request_id,
        problem=error.problem,
    )
    attempt.lost_reason = reason
    attempt.lost = True
    return reason


# --- Server-Sent Events --------------------------------------------------


class SSEParser:
    """Turns the lines of a ``text/event-stream`` into events, as the HTML
    standard's parser does: ``event:``, ``data:`` (lines joined by ``\\n``)
    and ``id:`` fields, an event at each blank line, comments (``:``)
    ignored."""

    def __init__(self) -> None:
        self._event = ""
        self._data: List[str] = []
        self._id = ""

    def line(self, line: str) -> Optional[Event]:
        if line == "":
            if not self._data:
                self._event = ""
                return None
            text = "\n".join(self._data)
            event = self._event or "message"
            self._event, self._data = "", []
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = {"text": text}
            data = parsed if isinstance(parsed, dict) else {"value": parsed}
            return Event(event=event, id=self._id, data=data)
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        elif field == "id" and "\0" not in value:
            self._id = value
        return None
