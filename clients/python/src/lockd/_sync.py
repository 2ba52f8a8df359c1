"""The synchronous client, on ``httpx.Client``; renewals run on a thread."""

from __future__ import annotations

import threading
import time
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Callable, Generic, Iterator, List, Optional, Type, TypeVar

import httpx

from . import _core
from ._core import Answer, Config, Keeper, Request
from ._errors import LeaseLost, LockdError, NotOwner, Unavailable
from ._models import Attempt, Event, Lease, LockStatus, Mode, Permit, SemaphoreStatus, WatchKind

T = TypeVar("T")
H = TypeVar("H", Lease, Permit)


class Lockd:
    """A client of one lockd (or of a load balancer in front of several).

    Every duration is in milliseconds (``_ms``). Every call that may change
    a lock is retried on a network error, a 429 or a 503, with the same
    token (so a retry after a lost answer gets the same grant, with the same
    fence), after the answer's ``Retry-After`` (jittered 0.5 to 1.5 times),
    or an exponential backoff from 100 ms for a network error, for up to
    ``retry_for_ms``; then :class:`Unavailable` is raised. Each HTTP call's
    timeout is its ``wait_ms`` + ``request_timeout_ms`` + 2 s, always longer
    than lockd takes to answer.

    One client may be shared by threads. Close it with :meth:`close`, or use
    it as a context manager (``with Lockd(url) as client:``).

    Args:
        url: lockd's base URL, such as ``http://127.0.0.1:8080``.
        api_key: An API key's secret, sent as ``Authorization: Bearer``:
            printable ASCII without spaces. ``None`` or ``""``: no key.
        request_timeout_ms: The server's request time limit
            (``--request-timeout-ms``, default 10 000 ms).
        retry_for_ms: How long retries go on, in ms (default 10 000).
        transport: An ``httpx.BaseTransport`` to send through (a test
            double, a proxy); ignored when ``http_client`` is given.
        http_client: An ``httpx.Client`` of your own (its timeouts are
            overridden per call); it is not closed by :meth:`close`.

    Raises:
        ValueError: a ``url`` that is not ``http(s)://...``, a duration that
            is not a whole number of milliseconds, or an ``api_key`` with a
            space, a line break or a character that is not ASCII (the
            message never shows the key).
    """

    def __init__(
        self,
        url: str,
        *,
        api_key: Optional[str] = None,
        request_timeout_ms: int = 10_000,
        retry_for_ms: int = 10_000,
        transport: Optional[httpx.BaseTransport] = None,
        http_client: Optional[httpx.Client] = None,
    ) -> None:
        self._config = Config.of(url, api_key, request_timeout_ms, retry_for_ms)
        self._owns_http = http_client is None
        self._http = http_client if http_client is not None else httpx.Client(transport=transport)

    def close(self) -> None:
        """Closes the HTTP connections (unless the ``http_client`` was given)."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Lockd:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Lockd({self._config.url!r})"

    # --- Locks -----------------------------------------------------------

    def acquire(
        self,
        name: str,
        *,
        ttl_ms: Optional[int] = None,
        wait_ms: Optional[int] = None,
        token: Optional[str] = None,
        owner: Optional[str] = None,
        mode: Optional[Mode] = None,
    ) -> Lease:
        """Takes the lock ``name`` and returns its lease.

        Args:
            name: The lock's name (1 to 200 of ``A-Z a-z 0-9 . _ - : @``).
            ttl_ms: The lease, in milliseconds (default: the server's, 30 s).
            wait_ms: Wait on the server up to this long, in milliseconds, for
                a held lock (default 0: fail at once).
            token: Your own token (16 to 128 of ``[A-Za-z0-9_-]``); default a
                fresh one, made here so that a retry after a lost answer
                renews the grant that request made (the same fence). The
                same token again renews the lease (a 200, same fence).
            owner: A label for the holder, shown to others (``status``).
            mode: ``exclusive`` (default) or ``shared``.

        Raises:
            LockHeld: another holder has it (after ``wait_ms``);
                ``retry_after_ms`` says when its lease ends.
            Unavailable: lockd or Redis did not answer within ``retry_for_ms``.
                The request may have been granted all the same: with a
                token made here, one release under it is tried first
                (bounded by ``request_timeout_ms``; if lockd is still
                unreachable, such a grant lasts until its TTL ends).
            LockdError: any other refusal (400 for a bad name, 409
                ``mode-mismatch``, 401/403 for API keys, ...).
            ValueError: a bad duration, mode, or a name no URL can carry
                (``""``, ``.``, ``..``), before any request.
        """
        request = _core.acquire_request(name, ttl_ms=ttl_ms, wait_ms=wait_ms, token=token, owner=owner, mode=mode)
        assert request.token is not None
        return _core.lease_of(self._grant(request), request.token)

    def extend(self, lease: Lease, *, ttl_ms: Optional[int] = None) -> Lease:
        """Resets the lease to ``ttl_ms`` (milliseconds) from now (default:
        the lock's own TTL, the one it was granted or last extended with),
        and returns the renewed lease; the one given is left as it was.

        Raises:
            LeaseLost: nobody holds the lock under this token (released, or
                its lease ran out).
            NotOwner: another token holds it.
            Unavailable: no answer within ``retry_for_ms``.
            ValueError: a bad ``ttl_ms``.
        """
        answer = self._call(_core.extend_request(lease, ttl_ms))
        return _core.lease_of(answer, lease.token, lease.mode)

    def release(self, lease: Lease) -> bool:
        """Releases the lease (compare-and-delete on its token).

        Returns True when this call released it, False when it had ended
        already (released, ran out, or since taken by another token): a
        lease that already ran out is no error.

        Raises:
            Unavailable: no answer within ``retry_for_ms``.
            LockdError: another refusal (401/403 for API keys).
        """
        try:
            self._call(_core.release_request(lease))
        except (LeaseLost, NotOwner):
            return False
        return True

    def status(self, name: str) -> LockStatus:
        """The lock's state: who holds it, its fence, TTL left (never a
        token). A free lock is ``LockStatus(held=False)``, not an error.

        Raises:
            Unavailable: no answer within ``retry_for_ms``.
            ValueError: a name no URL can carry.
        """
        try:
            answer = self._call(Request("GET", _core.lock_path(name)))
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
    ) -> AbstractContextManager[Lease]:
        """Holds the lock ``name`` for the body of a ``with``::

            with client.lock("orders:1", ttl_ms=30_000) as lease:
                work(lease.fence)      # check lease.lost in long work

        On entry it acquires (as :meth:`acquire`, raising its errors), then
        renews on a thread every third of the TTL, until ``max_hold_ms``
        (milliseconds after the grant; default: for as long as the body
        runs). When the lease is lost (a renewal refused, or none succeeded
        before the lease's end), ``lease.lost`` turns True and
        ``lease.lost_reason`` says why; on exit, :class:`LeaseLost` is
        then raised instead of releasing (unless the body raised: its
        exception propagates). Otherwise the lease is released on exit, also
        when the body raises; a release that fails is given up silently (the
        lease runs out by itself).

        Raises:
            ValueError: bad input, at once, before any request.
        """
        _core.check_ms("max_hold_ms", max_hold_ms)
        request = _core.acquire_request(name, ttl_ms=ttl_ms, wait_ms=wait_ms, token=token, owner=owner, mode=mode)

        def acquire() -> Lease:
            assert request.token is not None
            return _core.lease_of(self._grant(request), request.token)

        return _Holding(self, acquire, self.release, ttl_ms, max_hold_ms, f"lease of lock {name}")

    # --- Semaphores ------------------------------------------------------

    def acquire_permit(
        self,
        name: str,
        *,
        limit: int,
        ttl_ms: Optional[int] = None,
        wait_ms: Optional[int] = None,
        token: Optional[str] = None,
        owner: Optional[str] = None,
    ) -> Permit:
        """Takes one permit of the semaphore ``name``, which lets at most
        ``limit`` holders in at once.

        Args:
            limit: The semaphore's limit; every holder must name the same
                while any permit is held.
            ttl_ms, wait_ms, token, owner: as for :meth:`acquire`
                (milliseconds; the token is made here unless given).

        Raises:
            SemaphoreFull: every permit is held (after ``wait_ms``);
                ``retry_after_ms`` says when the earliest runs out.
            LockdError: 409 ``limit-mismatch`` (the permits are held under
                another limit, ``problem["limit"]``), 400, 501 in Redlock mode.
            Unavailable: no answer within ``retry_for_ms`` (one release of
                the permit it may have got is tried first, as for
                :meth:`acquire`).
            ValueError: a ``limit`` below 1, a bad duration or name.
        """
        request = _core.permit_request(name, limit=limit, ttl_ms=ttl_ms, wait_ms=wait_ms, token=token, owner=owner)
        assert request.token is not None
        return _core.permit_of(self._grant(request), request.token)

    def extend_permit(self, permit: Permit, *, ttl_ms: Optional[int] = None) -> Permit:
        """Resets the permit's lease to ``ttl_ms`` (milliseconds) from now
        (default: its own TTL), and returns the renewed permit.

        Raises:
            LeaseLost: the permit was given back or ran out (404
                ``permit-not-held``).
            Unavailable: no answer within ``retry_for_ms``.
        """
        answer = self._call(_core.extend_request(permit, ttl_ms))
        return _core.permit_of(answer, permit.token)

    def release_permit(self, permit: Permit) -> bool:
        """Gives the permit back. Returns True when this call did, False
        when it had ended already (no error).

        Raises:
            Unavailable: no answer within ``retry_for_ms``.
        """
        try:
            self._call(_core.release_request(permit))
        except (LeaseLost, NotOwner):
            return False
        return True

    def semaphore_status(self, name: str) -> SemaphoreStatus:
        """The semaphore's limit and permits (never a token); a semaphore
        with no permit held is ``SemaphoreStatus(held=False)``.

        Raises:
            Unavailable: no answer within ``retry_for_ms``.
        """
        try:
            answer = self._call(Request("GET", _core.semaphore_path(name)))
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
    ) -> AbstractContextManager[Permit]:
        """Holds one permit of the semaphore ``name`` for the body of a
        ``with``, renewing and releasing it as :meth:`lock` does a lease
        (``permit.lost``, :class:`LeaseLost` on exit when lost)::

            with client.permit("partner-api", limit=5, ttl_ms=30_000) as permit:
                call_partner()

        Raises:
            SemaphoreFull: on entry, every permit is held (after ``wait_ms``).
            ValueError: bad input, at once.
        """
        _core.check_ms("max_hold_ms", max_hold_ms)
        request = _core.permit_request(name, limit=limit, ttl_ms=ttl_ms, wait_ms=wait_ms, token=token, owner=owner)

        def acquire() -> Permit:
            assert request.token is not None
            return _core.permit_of(self._grant(request), request.token)

        return _Holding(self, acquire, self.release_permit, ttl_ms, max_hold_ms, f"permit of semaphore {name}")

    # --- Runs ------------------------------------------------------------

    def once(
        self,
        key: str,
        fn: Callable[[Attempt], Any],
        *,
        ttl_ms: Optional[int] = None,
        fingerprint: Optional[str] = None,
        wait_ms: Optional[int] = None,
        owner: Optional[str] = None,
        retention_ms: Optional[int] = None,
    ) -> Any:
        """Runs ``fn`` once per ``key``: the first caller runs it and stores its
        result; every later caller gets that result without running it.

        ``POST /runs/{key}``: when the run is done, returns its stored result
        and does not call ``fn``. Else calls ``fn(attempt)`` while renewing
        the attempt's lease on a thread (every third of ``ttl_ms``; check
        ``attempt.lost`` in long work and pass ``attempt.fence`` to what the
        job writes), stores what it returns (``PUT``; it must be
        JSON-serialisable) and returns the stored result, the same value
        every later caller gets. If ``fn`` raises, the attempt is abandoned
        (``DELETE``: the next caller runs it) and the exception propagates.

        Args:
            key: The run's key (a delivery ID, an event ID, ``report:2026-12-02``).
            fn: The job: called with the :class:`Attempt`.
            ttl_ms: The attempt's lease, in milliseconds (default: the server's).
            fingerprint: 1 to 128 printable ASCII characters derived from the
                job's input (a hash of the payload): the same key with another
                fingerprint is refused (:class:`FingerprintMismatch`).
            wait_ms: While another attempt runs, wait up to this long, in
                milliseconds, for it to end (its result, or the attempt).
            owner: A label for the attempt.
            retention_ms: How long lockd keeps the result, in milliseconds, 1
                or more (default and most: the server's
                ``--run-retention-ms``). The most is not known here: one over
                it is refused (a 400 ``LockdError``) when the result is
                stored, after ``fn`` ran, and the attempt is then abandoned,
                so the next caller runs the job.

        Returns:
            The stored result (JSON: dict, list, str, int, float, bool or None).

        Raises:
            RunInProgress: another attempt runs it (after ``wait_ms``).
            FingerprintMismatch: the key was first used with another fingerprint.
            LeaseLost: the attempt's lease was lost while ``fn`` ran, or before
                its result was stored (the ``PUT`` answered 409
                ``not-run-owner`` or 404 ``run-not-found``); nothing is stored
                (``fn``'s side effects stand: pass ``attempt.fence`` to your
                storage).
            TypeError: ``fn`` returned a value JSON cannot carry (the attempt
                is abandoned).
            Unavailable: no answer within ``retry_for_ms``. When the start
                got none, the attempt it may have started is abandoned (one
                try) first.
            ValueError: bad input (a ``retention_ms`` below 1 included),
                before any request.
        """
        _core.check_retention(retention_ms)
        request = _core.start_run_request(key, ttl_ms=ttl_ms, fingerprint=fingerprint, wait_ms=wait_ms, owner=owner)
        answer = self._grant(request)
        if _core.run_is_done(answer):
            return answer.body.get("result")
        assert request.token is not None
        attempt = _core.attempt_of(answer, request.token)
        keeper = Keeper(attempt, ttl_ms=ttl_ms, max_hold_ms=None, what=f"attempt of run {key}")
        renewal = _Renewal(self, keeper)
        try:
            value = fn(attempt)
        except BaseException:
            if renewal.stop() is None:
                self._abandon(attempt)
            raise
        reason = renewal.stop()
        if reason is not None:
            raise reason
        try:
            stored = self._call(_core.complete_request(attempt, value, retention_ms))
        except LockdError as e:
            if _core.attempt_gone(e):
                raise _core.lost_at_completion(attempt, e) from e
            self._abandon(attempt)
            raise
        except BaseException:
            self._abandon(attempt)
            raise
        return stored.body.get("result")

    def _abandon(self, attempt: Attempt) -> None:
        try:
            self._call(_core.release_request(attempt))
        except LockdError:
            pass  # gone already, or lockd unreachable: its lease runs out

    # --- Listing ---------------------------------------------------------

    def list_locks(self, prefix: Optional[str] = None, page_size: Optional[int] = None) -> Iterator[LockStatus]:
        """Every held lock whose name starts with ``prefix`` (default: all),
        fetched ``page_size`` a page (1 to 1000; the server's default 100),
        following ``next_cursor`` until the last page. A name may be listed
        twice (keep names in a set if you count them); never a token.

        Raises:
            LockdError: a bad ``prefix`` (400), or 403 outside an API key's prefixes.
            Unavailable: no answer within ``retry_for_ms``.
            ValueError: a ``page_size`` below 1, at once.
        """
        prefix, page_size = _core.check_listing(prefix, page_size)
        return self._pages("/locks", "locks", prefix, page_size, _core.lock_status_of)

    def list_semaphores(
        self, prefix: Optional[str] = None, page_size: Optional[int] = None
    ) -> Iterator[SemaphoreStatus]:
        """Every semaphore with a permit held whose name starts with
        ``prefix``, as :meth:`list_locks` lists locks.

        Raises:
            LockdError: 400, 403, 501 in Redlock mode.
            Unavailable: no answer within ``retry_for_ms``.
        """
        prefix, page_size = _core.check_listing(prefix, page_size)
        return self._pages("/semaphores", "semaphores", prefix, page_size, _core.semaphore_status_of)

    def _pages(
        self,
        base: str,
        key: str,
        prefix: Optional[str],
        page_size: Optional[int],
        parse: Callable[[Any, str], T],
    ) -> Iterator[T]:
        cursor: Optional[str] = None
        while True:
            answer = self._call(_core.list_request(base, prefix, page_size, cursor))
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
    ) -> EventStream:
        """Follows a lock's (or a semaphore's, or a run's) changes: an
        iterator of :class:`Event`, ``state`` first, then ``acquired``,
        ``extended``, ``released``, ``expired`` (a run: ``started``,
        ``extended``, ``completed``, ``abandoned``, ``expired``).

        When the stream ends or breaks, or stays silent ``idle_timeout_ms``
        (milliseconds; the server sends a keep-alive every 15 s), it connects
        again after a pause that doubles from 100 ms up to 5 s, and goes on
        with a fresh ``state``, until you stop iterating (``break``, or
        :meth:`EventStream.close`; use it in a ``with`` to close the
        connection at once). ``wait_ms`` asks the server to end each stream
        after that many milliseconds (then it connects again).

        Raises:
            LockdError: when iterating, a refusal that retrying cannot cure
                (400, 401, 403, 501 in Redlock mode); 503s and network
                errors are retried for ever.
            ValueError: a bad ``kind``, name or duration, at once.
        """
        request = _core.watch_request(name, kind, wait_ms)
        idle = _core.check_ms("idle_timeout_ms", idle_timeout_ms)
        assert idle is not None
        return EventStream(self._events(request, idle))

    def _events(self, request: Request, idle_timeout_ms: int) -> Iterator[Event]:
        backoff = _core.Backoff()
        timeout = httpx.Timeout(self._config.timeout_s(request), read=idle_timeout_ms / 1000)
        while True:
            pause_ms: Optional[int] = None
            try:
                with self._http.stream(
                    "GET",
                    self._config.url + request.path,
                    params=request.params,
                    headers=self._config.headers(request),
                    timeout=timeout,
                ) as response:
                    if response.status_code != 200:
                        response.read()
                        answer = _core.answer_of(response.status_code, response.headers, response.content, 0.0)
                        pause_ms = _core.watch_refusal_pause_ms(answer)
                    else:
                        parser = _core.SSEParser()
                        for line in response.iter_lines():
                            event = parser.line(line)
                            if event is not None:
                                backoff.reset()
                                yield event
            except httpx.TransportError:
                pass  # the stream broke: connect again
            time.sleep(backoff.next_s(pause_ms))

    # --- Sending ---------------------------------------------------------

    def _grant(self, request: Request) -> Answer:
        """Sends a grant's ``request`` (an acquire, a permit's, a run's start)
        as :meth:`_call` does. When it gives up with :class:`Unavailable`,
        lockd may have made the grant all the same; with a token made for
        this request, one ``DELETE`` under it is tried then (see
        :func:`_core.undo_request`), before the error is raised."""
        try:
            return self._call(request)
        except Unavailable:
            undo = _core.undo_request(request)
            if undo is not None:
                self._send_once(undo)
            raise

    def _send_once(self, request: Request) -> None:
        """Sends ``request`` once, bounded by its timeout, not retried; its
        answer and any failure are ignored (a best effort)."""
        try:
            self._http.request(
                request.method,
                self._config.url + request.path,
                params=request.params,
                headers=self._config.headers(request),
                content=self._config.content(request),
                timeout=self._config.timeout_s(request),
            )
        except Exception:  # noqa: BLE001 - a best effort: lockd unreachable still, say
            pass

    def _call(
        self,
        request: Request,
        *,
        until: Optional[float] = None,
        stop: Optional[threading.Event] = None,
    ) -> Answer:
        """Sends ``request``, retrying as the class says; the first answer
        below 400, or raises its error. ``until`` (time.monotonic()) ends
        the retries earlier, and each try's timeout by then; ``stop`` cuts a
        pause short (and then raises)."""
        retrier = _core.Retrier(self._config, until, bound_timeouts=until is not None)
        url = self._config.url + request.path
        headers = self._config.headers(request)
        content = self._config.content(request)
        while True:
            sent_at = time.monotonic()
            answer: Optional[Answer] = None
            failure: Optional[BaseException] = None
            try:
                response = self._http.request(
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
            pause = retrier.pause_s(answer, failure)
            if stop is None:
                time.sleep(pause)
            elif stop.wait(pause):
                raise retrier.give_up(answer, failure)


class _Renewal:
    """Runs a :class:`Keeper` on a daemon thread until stopped."""

    def __init__(self, client: Lockd, keeper: Keeper) -> None:
        self._client = client
        self._keeper = keeper
        self._stop = threading.Event()
        # Held while the keeper's state changes, so that stop() sees either
        # all of a renewal's outcome or none of it.
        self._mutex = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="lockd-renewal", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        keeper = self._keeper
        while True:
            if self._stop.wait(max(0.0, keeper.wake_at() - time.monotonic())):
                return
            with self._mutex:
                if self._stop.is_set():
                    return
                step = keeper.step(time.monotonic())
            if step == _core.LOST:
                return
            if step == _core.WAIT:
                continue
            try:
                answer = self._client._call(keeper.extend_request(), until=keeper.valid_until, stop=self._stop)
            except Exception as e:  # noqa: BLE001 - any failure is judged by the keeper
                with self._mutex:
                    if self._stop.is_set() or keeper.failed(e):
                        return
                continue
            with self._mutex:
                if self._stop.is_set():
                    return
                keeper.renewed(answer)

    def stop(self) -> Optional[LeaseLost]:
        """Ends the renewals (a renewal in flight is left to end by itself,
        its outcome ignored) and returns why the lease was lost, if it was."""
        with self._mutex:
            self._stop.set()
            return self._keeper.finish(time.monotonic())


class _Holding(Generic[H]):
    """The context manager of :meth:`Lockd.lock` and :meth:`Lockd.permit`:
    ``with`` it to hold a lease (or a permit) for its body."""

    def __init__(
        self,
        client: Lockd,
        acquire: Callable[[], H],
        release: Callable[[H], bool],
        ttl_ms: Optional[int],
        max_hold_ms: Optional[int],
        what: str,
    ) -> None:
        self._client = client
        self._acquire: Callable[[], H] = acquire
        self._release: Callable[[H], bool] = release
        self._ttl_ms = ttl_ms
        self._max_hold_ms = max_hold_ms
        self._what = what
        self._held: Optional[H] = None
        self._renewal: Optional[_Renewal] = None

    def __enter__(self) -> H:
        if self._held is not None:
            raise RuntimeError(f"this {self._what} is held already: call lock() again for another")
        held = self._acquire()
        keeper = Keeper(held, ttl_ms=self._ttl_ms, max_hold_ms=self._max_hold_ms, what=self._what)
        self._held = held
        self._renewal = _Renewal(self._client, keeper)
        return held

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        held, renewal = self._held, self._renewal
        assert held is not None and renewal is not None
        reason = renewal.stop()
        if reason is not None:
            if exc is None:
                raise reason
            return  # the body's exception propagates; the lease is gone anyway
        try:
            self._release(held)
        except LockdError:
            pass  # unreachable past retry_for_ms: the lease runs out by itself


class EventStream:
    """The events of :meth:`Lockd.watch`: iterate it; close it (or leave its
    ``with``) to end the watch and its connection."""

    def __init__(self, events: Iterator[Event]) -> None:
        self._events = events

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> Event:
        return next(self._events)

    def close(self) -> None:
        """Ends the watch, closing its connection."""
        close = getattr(self._events, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()


__all__: List[str] = ["Lockd", "EventStream"]
