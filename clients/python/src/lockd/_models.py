"""What lockd's answers hold: leases, permits, run attempts, states, events."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, Literal, Optional, Tuple

from ._errors import LeaseLost

#: A lock's mode: one holder (``exclusive``) or many readers (``shared``).
Mode = Literal["exclusive", "shared"]

#: What a watch follows: a lock, a semaphore or a run.
WatchKind = Literal["lock", "semaphore", "run"]


@dataclass
class Lease:
    """A lock held: what a grant (or a renewal) answered.

    Inside ``with client.lock(...) as lease:`` the same object is kept up to
    date by the renewals (``ttl_ms``, ``expires_at``), and ``lost`` turns
    true when the lease is lost; the lease's token is never in its ``repr``.

    Attributes:
        name: The lock's name.
        token: The holder's token, the proof of holding: never log it.
        fence: The fencing token of this grant: larger than every earlier
            grant's of this name. Pass it to your storage so that it can
            refuse a holder whose lease lapsed.
        ttl_ms: The lease left when lockd answered, in milliseconds.
        expires_at: When the lease ends at the earliest (UTC), by lockd's clock.
        mode: ``exclusive`` or ``shared``.
        lost: True once the lease is known lost (under ``lock()`` only).
        lost_reason: Why, as the :class:`LeaseLost` that ``lock()`` raises on
            exit; ``None`` while not lost.
    """

    name: str
    token: str = field(repr=False)
    fence: int
    ttl_ms: int
    expires_at: datetime
    mode: Mode = "exclusive"
    lost: bool = False
    lost_reason: Optional[LeaseLost] = None
    # When the lease ends at the earliest on this host's monotonic clock
    # (time.monotonic()): the request's send time plus the ttl_ms answered.
    _valid_until: float = field(default=0.0, init=False, repr=False, compare=False)


@dataclass
class Permit:
    """A permit of a semaphore held: what a grant (or renewal) answered.

    Inside ``with client.permit(...) as permit:`` it is kept up to date as a
    :class:`Lease` is.

    Attributes:
        name: The semaphore's name.
        token: The permit's token: never log it.
        fence: The fencing token of this permit: larger than every earlier
            permit's of this semaphore.
        ttl_ms: The lease left when lockd answered, in milliseconds.
        expires_at: When the permit ends at the earliest (UTC).
        limit: The semaphore's limit: at most this many permits at once.
        lost: True once the permit is known lost (under ``permit()`` only).
        lost_reason: Why, as a :class:`LeaseLost`; ``None`` while not lost.
    """

    name: str
    token: str = field(repr=False)
    fence: int
    ttl_ms: int
    expires_at: datetime
    limit: int
    lost: bool = False
    lost_reason: Optional[LeaseLost] = None
    _valid_until: float = field(default=0.0, init=False, repr=False, compare=False)


@dataclass
class Attempt:
    """One attempt at a run's job, as ``once`` gives it to the job's function.

    Attributes:
        key: The run's key.
        token: The attempt's token: never log it.
        fence: The attempt's fencing token: larger than every earlier
            attempt's of this key; pass it to the storage the job writes.
        attempt: 1 for the first attempt, 2 after one was abandoned or ran
            out, and so on.
        ttl_ms: The attempt's lease left when lockd answered, in milliseconds
            (renewed in the background while the job runs).
        expires_at: When the lease ends at the earliest (UTC).
        lost: True once the attempt's lease is known lost: stop the job, its
            result will not be stored.
        lost_reason: Why, as a :class:`LeaseLost`; ``None`` while not lost.
    """

    key: str
    token: str = field(repr=False)
    fence: int
    attempt: int
    ttl_ms: int
    expires_at: datetime
    lost: bool = False
    lost_reason: Optional[LeaseLost] = None
    _valid_until: float = field(default=0.0, init=False, repr=False, compare=False)


@dataclass(frozen=True)
class Holder:
    """One lease of a shared lock, or one permit of a semaphore (never a token).

    Attributes:
        fence: Its fencing token.
        owner: Its holder's label, or ``None``.
        ttl_ms: Its lease left, in milliseconds; ``None`` when it has no end.
        expires_at: When it ends at the earliest (UTC), or ``None``.
        granted_at: When it was granted (UTC), or ``None`` when unknown.
    """

    fence: int
    owner: Optional[str]
    ttl_ms: Optional[int]
    expires_at: Optional[datetime]
    granted_at: Optional[datetime]


@dataclass(frozen=True)
class LockStatus:
    """A lock's state, as ``GET /locks/{name}`` (or a listing) shows it; never
    a token. A free lock is ``held=False`` with the other fields empty.

    Attributes:
        name: The lock's name.
        held: Whether anyone holds it.
        fence: The holder's fencing token (of a shared lock: of the lease
            that ends last).
        ttl_ms: The lease left, in milliseconds; ``None`` when free, or for a
            key another client set with no TTL.
        expires_at: When the lease ends at the earliest (UTC).
        owner: The holder's label, or ``None``.
        granted_at: When the lease was granted (UTC), or ``None``.
        mode: ``exclusive`` or ``shared``; ``None`` when free.
        holder_count: How many leases hold it (0 when free).
        holders: A shared lock's leases (empty when exclusive, and in listings).
        writer_waiting: Whether an exclusive request waits for the shared
            leases (``False`` in listings).
    """

    name: str
    held: bool
    fence: Optional[int] = None
    ttl_ms: Optional[int] = None
    expires_at: Optional[datetime] = None
    owner: Optional[str] = None
    granted_at: Optional[datetime] = None
    mode: Optional[Mode] = None
    holder_count: int = 0
    holders: Tuple[Holder, ...] = ()
    writer_waiting: bool = False


@dataclass(frozen=True)
class SemaphoreStatus:
    """A semaphore's state, as ``GET /semaphores/{name}`` (or a listing) shows
    it; never a token. A semaphore with no permit held is ``held=False``.

    Attributes:
        name: The semaphore's name.
        held: Whether at least one permit is held.
        limit: The limit the permits are held under; ``None`` when free.
        holders: How many permits are held.
        permits: Each permit held, the first to run out first.
    """

    name: str
    held: bool
    limit: Optional[int] = None
    holders: int = 0
    permits: Tuple[Holder, ...] = ()


@dataclass(frozen=True)
class Event:
    """One Server-Sent Event of a watch.

    Attributes:
        event: Its kind: ``state`` first on every (re)connection, then for a
            lock or semaphore ``acquired``, ``extended``, ``released``,
            ``expired``; for a run ``started``, ``extended``, ``completed``,
            ``abandoned``, ``expired``.
        id: Its ``id`` (``FENCE-SEQ``).
        data: Its JSON data (never a token), such as ``{"name": ..., "fence": ...}``.
    """

    event: str
    id: str
    data: Dict[str, Any]
