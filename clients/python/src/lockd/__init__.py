"""lockd-client: the Python client of lockd, distributed locks over HTTP
(held in Redis), on httpx.

::

    from lockd import Lockd

    with Lockd("http://127.0.0.1:8080") as client:
        with client.lock("orders:1", ttl_ms=30_000) as lease:
            work(lease.fence)  # renewed in the background; released at the end

Every duration is in milliseconds (its name ends in ``_ms``). Every grant
has an unguessable ``token`` (sent in the ``Lock-Token`` header, never in a
URL, never in a ``repr``) and a ``fence`` that grows with every grant of the
same name: pass it to your storage so that it can refuse a holder whose
lease lapsed.

:class:`Lockd` is the synchronous client (renewals on a thread),
:class:`AsyncLockd` the asynchronous one (asyncio; renewals on a task), with
the same methods: locks (``acquire``, ``extend``, ``release``, ``status``,
``lock``), semaphores (``acquire_permit``, ``extend_permit``,
``release_permit``, ``semaphore_status``, ``permit``), runs (``once``),
listings (``list_locks``, ``list_semaphores``) and watches (``watch``).
"""

from ._async import AsyncEventStream, AsyncLockd
from ._core import VERSION as __version__
from ._errors import (
    FingerprintMismatch,
    LeaseLost,
    LockdError,
    LockHeld,
    NotOwner,
    RunInProgress,
    SemaphoreFull,
    Unavailable,
)
from ._models import (
    Attempt,
    Event,
    Holder,
    Lease,
    LockStatus,
    Mode,
    Permit,
    SemaphoreStatus,
    WatchKind,
)
from ._sync import EventStream, Lockd

__all__ = [
    "__version__",
    "Lockd",
    "AsyncLockd",
    "EventStream",
    "AsyncEventStream",
    "Lease",
    "Permit",
    "Attempt",
    "Holder",
    "LockStatus",
    "SemaphoreStatus",
    "Event",
    "Mode",
    "WatchKind",
    "LockdError",
    "LockHeld",
    "SemaphoreFull",
    "RunInProgress",
    "NotOwner",
    "LeaseLost",
    "Unavailable",
    "FingerprintMismatch",
]
