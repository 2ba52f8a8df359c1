"""The asynchronous client, on ``httpx.AsyncClient`` under asyncio;
renewals run on a task."""

from __future__ import annotations

import asyncio
import time
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Generic,
    List,
    Optional,
    Type,
    TypeVar,
)

import httpx

from . import _core
from ._core import Answer, Config, Keeper, Request
from ._errors import LeaseLost, LockdError, NotOwner, Unavailable
from ._models import Attempt, Event, Lease, LockStatus, Mode, Permit, SemaphoreStatus, WatchKind

T = TypeVar("T")
H = TypeVar("H", Lease, Permit)


class AsyncLockd:
    """The asynchronous client (asyncio): the methods of :class:`Lockd`, as
    coroutines, with the same arguments, retries, timeouts and errors.

    Close it with :meth:`aclose`, or use it as an async context manager
    (``async with AsyncLockd(url) as client:``).

    Args:
        url: lockd's base URL, such as ``http://127.0.0.1:8080``.
        api_key: An API key's secret, sent as ``Authorization: Bearer``:
            printable ASCII without spaces. ``None`` or ``""``: no key.
        request_timeout_ms: The server's request time limit
            (``--request-timeout-ms``, default 10 000 ms).
        retry_for_ms: How long retries go on, in ms (default 10 000).
        transport: An ``httpx.AsyncBaseTransport`` to send through; ignored
            when ``http_client`` is given.
        http_client: An ``httpx.AsyncClient`` of your own (not closed by
            :meth:`aclose`).

    Raises:
        ValueError: a bad ``url``, duration or ``api_key`` (the message
            never shows the key).
    """

    def __init__(
        self,
        url: str,
        *,
        api_key: Optional[str] = None,
        request_timeout_ms: int = 10_000,
        retry_for_ms: int = 10_000,
        transport: Optional[httpx.AsyncBaseTransport] = None,
        http_client: Optional[httpx.AsyncClient] = None,
    ) -> None:
        self._config = Config.of(url, api_key, request_timeout_ms, retry_for_ms)
        self._owns_http = http_client is None
        self._http = http_client if http_client is not None else httpx.AsyncClient(transport=transport)

    async def aclose(self) -> None:
        """Closes the HTTP connections (unless the ``http_client`` was given)."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncLockd:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncLockd({self._config.url!r})"

    # --- Locks -----------------------------------------------------------

    async def acquire(
        self,
        name: str,
        *,
        ttl_ms: Optional[int] = None,
        wait_ms: Optional[int] = None,
        token: Optional[str] = None,
        owner: Optional[str] = None,
        mode: Optional[Mode] = None,
    ) -> Lease:
        """Takes the lock ``name``: see :meth:`Lockd.acquire` (milliseconds;
        raises :class:`LockHeld`, :class:`Unavailable` after one release of
        the grant it may have made, :class:`LockdError`, ``ValueError``)."""
        request = _core.acquire_request(name, ttl_ms=ttl_ms, wait_ms=wait_ms, token=token, owner=owner, mode=mode)
        assert request.token is not None
        return _core.lease_of(await self._grant(request), request.token)

    async def extend(self, lease: Lease, *, ttl_ms: Optional[int] = None) -> Lease:
        """Resets the lease to ``ttl_ms`` (ms) from now and returns the
        renewed lease: see :meth:`Lockd.extend` (raises :class:`LeaseLost`,
        :class:`NotOwner`, :class:`Unavailable`)."""
        answer = await self._call(_core.extend_request(lease, ttl_ms))
        return _core.lease_of(answer, lease.token, lease.mode)

    async def release(self, lease: Lease) -> bool:
        """Releases the lease: True when this call did, False when it had
        ended already (no error). See :meth:`Lockd.release`."""
        try:
            await self._call(_core.release_request(lease))
        except (LeaseLost, NotOwner):
            return False
        return True

    async def status(self, name: str) -> LockStatus:
        """The lock's state; a free lock is ``held=False``. See :meth:`Lockd.status`."""
        try:
            answer = await self._call(Request("GET", _core.lock_path(name)))
        except LeaseLost:
            return LockStatus(name=name, held=False)
        return _core.lock_status_of(answer.body, name)

    def lock(
        self,
        name: str,
        *,
        ttl_ms: Optional[int] = None,
        wait_ms: Optional[int] = None,
        max_hold_ms: Optional[int] = None,
        owner: Optional[str] = None,
        mode: Optional[Mode] = None,
        token: Optional[str] = None,
    ) -> AbstractAsyncContextManager[Lease]:
        """Holds the lock ``name`` for the body of an ``async with``, renewing
        it on a task every third of the TTL until ``max_hold_ms`` (ms), as
        :meth:`Lockd.lock` does on a thread::

            async with client.lock("orders:1", ttl_ms=30_000) as lease:
                await work(lease.fence)

        ``lease.lost`` turns True when the lease is lost, and :class:`LeaseLost`
        is raised on exit then; else it is released on exit (also when the
        body raises). On exit a renewal in flight is cancelled.

        Raises:
            ValueError: bad input, at once.
        """
        _core.check_ms("max_hold_ms", max_hold_ms)
        request = _core.acquire_request(name, ttl_ms=ttl_ms, wait_ms=wait_ms, token=token, owner=owner, mode=mode)

        async def acquire() -> Lease:
            assert request.token is not None
            return _core.lease_of(await self._grant(request), request.token)

        return _AsyncHolding(self, acquire, self.release, ttl_ms, max_hold_ms, f"lease of lock {name}")

    # --- Semaphores ------------------------------------------------------

    async def acquire_permit(
        self,
        name: str,
        *,
        limit: int,
        ttl_ms: Optional[int] = None,
        wait_ms: Optional[int] = None,
        token: Optional[str] = None,
        owner: Optional[str] = None,
    ) -> Permit:
        """Takes one permit of the semaphore ``name``: see
        :meth:`Lockd.acquire_permit` (raises :class:`SemaphoreFull`, ...)."""
        request = _core.permit_request(name, limit=limit, ttl_ms=ttl_ms, wait_ms=wait_ms, token=token, owner=owner)
        assert request.token is not None
        return _core.permit_of(await self._grant(request), request.token)

    async def extend_permit(self, permit: Permit, *, ttl_ms: Optional[int] = None) -> Permit:
        """Resets the permit's lease to ``ttl_ms`` (ms) from now: see
        :meth:`Lockd.extend_permit` (raises :class:`LeaseLost`, ...)."""
        answer = await self._call(_core.extend_request(permit, ttl_ms))
        return _core.permit_of(answer, permit.token)

    async def release_permit(self, permit: Permit) -> bool:
        """Gives the permit back: True when this call did, False when it had
        ended already."""
        try:
            await self._call(_core.release_request(permit))
        except (LeaseLost, NotOwner):
            return False
        return True

    async def semaphore_status(self, name: str) -> SemaphoreStatus:
        """The semaphore's limit and permits; ``held=False`` with none held."""
        try:
            answer = await self._call(Request("GET", _core.semaphore_path(name)))
        except LockdError as e:
            if e.status == 404 and e.slug == "semaphore-free":
                return SemaphoreStatus(name=name, held=False)
            raise
        return _core.semaphore_status_of(answer.body, name)

    def permit(
        self,
        name: str,
        *,
        limit: int,
        ttl_ms: Optional[int] = None,
        wait_ms: Optional[int] = None,
        max_hold_ms: Optional[int] = None,
        owner: Optional[str] = None,
        token: Optional[str] = None,
    ) -> AbstractAsyncContextManager[Permit]:
        """Holds one permit for the body of an ``async with``, as :meth:`lock`
        holds a lease (raises :class:`SemaphoreFull` on entry when every
        permit is held, :class:`LeaseLost` on exit when it was lost)."""
        _core.check_ms("max_hold_ms", max_hold_ms)
        request = _core.permit_request(name, limit=limit, ttl_ms=ttl_ms, wait_ms=wait_ms, token=token, owner=owner)

        async def acquire() -> Permit:
            assert request.token is not None
            return _core.permit_of(await self._grant(request), request.token)

        return _AsyncHolding(self, acquire, self.release_permit, ttl_ms, max_hold_ms, f"permit of semaphore {name}")

    # --- Runs ------------------------------------------------------------

    async def once(
        self,
        key: str,
        fn: Callable[[Attempt], Awaitable[Any]],
        *,
        ttl_ms: Optional[int] = None,
        fingerprint: Optional[str] = None,
        wait_ms: Optional[int] = None,
        owner: Optional[str] = None,
        retention_ms: Optional[int] = None,
    ) -> Any:
        """Runs the async function ``fn`` once per ``key``, as :meth:`Lockd.once`
        does (the attempt's lease renewed on a task while it runs): returns
        the stored result; raises :class:`RunInProgress`,
        :class:`FingerprintMismatch`, :class:`LeaseLost`, ``TypeError``,
        :class:`Unavailable`, ``ValueError``."""
        _core.check_retention(retention_ms)
        request = _core.start_run_request(key, ttl_ms=ttl_ms, fingerprint=fingerprint, wait_ms=wait_ms, owner=owner)
        answer = await self._grant(request)
        if _core.run_is_done(answer):
            return answer.body.get("result")
        assert request.token is not None
        attempt = _core.attempt_of(answer, request.token)
        keeper = Keeper(attempt, ttl_ms=ttl_ms, max_hold_ms=None, what=f"attempt of run {key}")
        renewal = _AsyncRenewal(self, keeper)
        try:
            value = await fn(attempt)
        except BaseException:
            if await renewal.stop() is None:
                await self._abandon(attempt)
            raise
        reason = await renewal.stop()
        if reason is not None:
            raise reason
        try:
            stored = await self._call(_core.complete_request(attempt, value, retention_ms))
        except LockdError as e:
            if _core.attempt_gone(e):
                raise _core.lost_at_completion(attempt, e) from e
            await self._abandon(attempt)
            raise
        except BaseException:
            await self._abandon(attempt)
            raise
        return stored.body.get("result")

    async def _abandon(self, attempt: Attempt) -> None:
        try:
            await self._call(_core.release_request(attempt))
        except LockdError:
            pass  # gone already, or lockd unreachable: its lease runs out

    # --- Listing ---------------------------------------------------------

    def list_locks(self, prefix: Optional[str] = None, page_size: Optional[int] = None) -> AsyncIterator[LockStatus]:
        """Every held lock whose name starts with ``prefix``, page by page
        (``async for status in client.list_locks(...)``): see :meth:`Lockd.list_locks`."""
        prefix, page_size = _core.check_listing(prefix, page_size)
        return self._pages("/locks", "locks", prefix, page_size, _core.lock_status_of)

    def list_semaphores(
        self, prefix: Optional[str] = None, page_size: Optional[int] = None
    ) -> AsyncIterator[SemaphoreStatus]:
        """Every semaphore with a permit held whose name starts with
        ``prefix``: see :meth:`Lockd.list_semaphores`."""
        prefix, page_size = _core.check_listing(prefix, page_size)
        return self._pages("/semaphores", "semaphores", prefix, page_size, _core.semaphore_status_of)

    async def _pages(
        self,
        base: str,
        key: str,
        prefix: Optional[str],
        page_size: Optional[int],
        parse: Callable[[Any, str], T],
    ) -> AsyncIterator[T]:
        cursor: Optional[str] = None
        while True:
            answer = await self._call(_core.list_request(base, prefix, page_size, cursor))
            items, cursor = _core.page_of(answer, key)
            for item in items:
                yield parse(item, "")
            if cursor is None:
                return

    # --- Watching --------------------------------------------------------

    def watch(
        self,
        name: str,
        kind: WatchKind = "lock",
        *,
        wait_ms: Optional[int] = None,
        idle_timeout_ms: int = _core.WATCH_IDLE_TIMEOUT_MS,
    ) -> AsyncEventStream:
        """Follows a lock's (semaphore's, run's) changes as an async iterator
        of :class:`Event`, reconnecting as :meth:`Lockd.watch` does::

            async with client.watch("leader") as events:
                async for event in events:
                    ...

        Leaving the ``async with`` (or :meth:`AsyncEventStream.aclose`) closes
        the connection at once."""
        request = _core.watch_request(name, kind, wait_ms)
        idle = _core.check_ms("idle_timeout_ms", idle_timeout_ms)
        assert idle is not None
        return AsyncEventStream(self._events(request, idle))

    async def _events(self, request: Request, idle_timeout_ms: int) -> AsyncIterator[Event]:
        backoff = _core.Backoff()
        timeout = httpx.Timeout(self._config.timeout_s(request), read=idle_timeout_ms / 1000)
        while True:
            pause_ms: Optional[int] = None
            try:
                async with self._http.stream(
                    "GET",
                    self._config.url + request.path,
                    params=request.params,
                    headers=self._config.headers(request),
                    timeout=timeout,
                ) as response:
                    if response.status_code != 200:
                        await response.aread()
                        answer = _core.answer_of(response.status_code, response.headers, response.content, 0.0)
                        pause_ms = _core.watch_refusal_pause_ms(answer)
                    else:
                        parser = _core.SSEParser()
                        async for line in response.aiter_lines():
                            event = parser.line(line)
                            if event is not None:
                                backoff.reset()
                                yield event
            except httpx.TransportError:
                pass  # the stream broke: connect again
            await asyncio.sleep(backoff.next_s(pause_ms))

    # --- Sending ---------------------------------------------------------

    async def _grant(self, request: Request) -> Answer:
        """Sends a grant's ``request`` as :meth:`_call` does; when it gives up
        with :class:`Unavailable`, tries one ``DELETE`` under a token made
        for it, as :meth:`Lockd._grant` does, before the error is raised."""
        try:
            return await self._call(request)
        except Unavailable:
            undo = _core.undo_request(request)
            if undo is not None:
                await self._send_once(undo)
            raise

    async def _send_once(self, request: Request) -> None:
        """Sends ``request`` once, bounded by its timeout, not retried; its
        answer and any failure are ignored (a cancellation is not)."""
        try:
            await self._http.request(
                request.method,
                self._config.url + request.path,
                params=request.params,
                headers=self._config.headers(request),
                content=self._config.content(request),
                timeout=self._config.timeout_s(request),
            )
        except Exception:  # noqa: BLE001 - a best effort: lockd unreachable still, say
            pass

    async def _call(self, request: Request, *, until: Optional[float] = None) -> Answer:
        """Sends ``request``, retrying as :class:`Lockd` does; the first
        answer below 400, or raises its error."""
        retrier = _core.Retrier(self._config, until, bound_timeouts=until is not None)
        url = self._config.url + request.path
        headers = self._config.headers(request)
        content = self._config.content(request)
        while True:
            sent_at = time.monotonic()
            answer: Optional[Answer] = None
            failure: Optional[BaseException] = None
            try:
                response = await self._http.request(
                    request.method,
                    url,
                    params=request.params,
                    headers=headers,
                    content=content,
                    timeout=retrier.timeout_s(request),
                )
                answer = _core.answer_of(response.status_code, response.headers, response.content, sent_at)
            except httpx.TransportError as e:
                failure = e
            if answer is not None and answer.status < 400:
                return answer
            await asyncio.sleep(retrier.pause_s(answer, failure))


class _AsyncRenewal:
    """Runs a :class:`Keeper` on an asyncio task until stopped."""

    def __init__(self, client: AsyncLockd, keeper: Keeper) -> None:
        self._client = client
        self._keeper = keeper
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        keeper = self._keeper
        while True:
            await asyncio.sleep(max(0.0, keeper.wake_at() - time.monotonic()))
            step = keeper.step(time.monotonic())
            if step == _core.LOST:
                return
            if step == _core.WAIT:
                continue
            try:
                answer = await self._client._call(keeper.extend_request(), until=keeper.valid_until)
            except Exception as e:  # noqa: BLE001 - any failure is judged by the keeper
                if keeper.failed(e):
                    return
                continue
            keeper.renewed(answer)

    async def stop(self) -> Optional[LeaseLost]:
        """Cancels the renewals (one in flight included) and returns why the
        lease was lost, if it was."""
        self._task.cancel()
        # wait() does not raise the task's CancelledError, and lets a
        # cancellation of the caller through.
        await asyncio.wait({self._task})
        return self._keeper.finish(time.monotonic())


class _AsyncHolding(Generic[H]):
    """The async context manager of :meth:`AsyncLockd.lock` and
    :meth:`AsyncLockd.permit`."""

    def __init__(
        self,
        client: AsyncLockd,
        acquire: Callable[[], Awaitable[H]],
        release: Callable[[H], Awaitable[bool]],
        ttl_ms: Optional[int],
        max_hold_ms: Optional[int],
        what: str,
    ) -> None:
        self._client = client
        self._acquire: Callable[[], Awaitable[H]] = acquire
        self._release: Callable[[H], Awaitable[bool]] = release
        self._ttl_ms = ttl_ms
        self._max_hold_ms = max_hold_ms
        self._what = what
        self._held: Optional[H] = None
        self._renewal: Optional[_AsyncRenewal] = None

    async def __aenter__(self) -> H:
        if self._held is not None:
            raise RuntimeError(f"this {self._what} is held already: call lock() again for another")
        held = await self._acquire()
        keeper = Keeper(held, ttl_ms=self._ttl_ms, max_hold_ms=self._max_hold_ms, what=self._what)
        self._held = held
        self._renewal = _AsyncRenewal(self._client, keeper)
        return held

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        held, renewal = self._held, self._renewal
        assert held is not None and renewal is not None
        reason = await renewal.stop()
        if reason is not None:
            if exc is None:
                raise reason
            return
        try:
            await self._release(held)
        except LockdError:
            pass  # unreachable past retry_for_ms: the lease runs out by itself


class AsyncEventStream:
    """The events of :meth:`AsyncLockd.watch`: ``async for`` over it; leave
    its ``async with`` (or :meth:`aclose` it) to end the watch."""

    def __init__(self, events: AsyncIterator[Event]) -> None:
        self._events = events

    def __aiter__(self) -> AsyncEventStream:
        return self

    async def __anext__(self) -> Event:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        """Ends the watch, closing its connection."""
        aclose = getattr(self._events, "aclose", None)
        if aclose is not None:
            await aclose()

    async def __aenter__(self) -> AsyncEventStream:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.aclose()


__all__: List[str] = ["AsyncLockd", "AsyncEventStream"]
