"""AsyncClient: ``await enqueue``, ``await call``, ``await result`` from asyncio code, over the sync client's wire.

Requests are the sync client's frames (``zqsync/wire/envelope.py``, built by the same functions) on
``zmq.asyncio`` DEALER sockets from an `AsyncSocketPool` (keyed per running
event loop and per process). Nothing blocks the event loop: every wait is an ``await`` on the
socket's descriptor, bounded by the same deadlines as the sync client's.

What it shares with `zqsync.Client`: the settings (``ClientSettings``), the envelope and
its checks, congestion control for plain jobs (``CongestionState``'s marks, drop counter and
``CONNECT_GRACE``, process-wide), the rendezvous hashing of confirmed jobs and the down-worker
view with its background probes (``health.py``). What it leaves out, documented in
``docs/guides/asyncio.md``: DNS and ``srv://`` endpoints, routes, the express lane, reading
stopping notices, and the probe right after an unanswered confirm attempt (it would block the
loop): a confirmed job fails over when no connection takes an attempt within ``probe_timeout``,
or after ``FAILOVER_ATTEMPTS * confirm_retry`` seconds without an answer.
"""

from __future__ import annotations

import datetime
import functools
import time
import weakref
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional, Sequence, Union

import zmq

from ..client import health
from ..client.client import _task_name, call_result, call_timeout, job_request
from ..client.congestion import STATE as CONGESTION
from ..client.congestion import CongestionControl
from ..client.jobs import JobStatus
from ..client.lookups import remote_error_of
from ..client.pool import SocketPool
from ..client.process import new_id
from ..client.rendezvous import FAILOVER_ATTEMPTS, Route
from ..errors import CallTimeout, ClientClosed, ConfigurationError, PoolError, Unconfirmed
from ..settings import ClientSettings
from ..wire import envelope
from ..wire.curve import Curve
from ..wire.endpoints import split_endpoint
from . import lookups, transport
from .pool import AsyncSocketPool

if TYPE_CHECKING:
    from ..worker.handles import TaskHandle
    from .tasks import AsyncTask, P, R


class AsyncJob(str):
    """A job id as `AsyncClient.enqueue` returns it: a ``str`` with awaitable ``result()``,
    ``status()`` and ``cancel()`` on the client that sent it (pickled as the plain id)."""

    client: "AsyncClient"

    def __new__(cls, job_id: str, client: "AsyncClient") -> "AsyncJob":
        job = super().__new__(cls, job_id)
        job.client = client
        return job

    def __reduce__(self) -> tuple[Any, ...]:
        return (str, (str(self),))

    async def result(self, *, timeout: Optional[float] = None) -> Any:
        """`AsyncClient.result` of this job."""
        return await self.client.result(self, timeout=timeout)

    async def status(self, *, timeout: Optional[float] = None) -> JobStatus:
        """`AsyncClient.job` of this job."""
        return await self.client.job(self, timeout=timeout)

    async def cancel(self, *, timeout: Optional[float] = None) -> JobStatus:
        """`AsyncClient.cancel` of this job."""
        return await self.client.cancel(self, timeout=timeout)


class _AsyncHealth(health.Health):
    """The down-worker view, without the probe right after an unanswered attempt (it blocks): a worker
    that is connected but silent is failed over from at the rendezvous bound only."""

    def check(self, endpoint: str) -> bool:
        return endpoint in self._state()


class AsyncClient:
    """Enqueue jobs and call tasks from asyncio code (any number of event loops and threads).

    :param endpoints: a worker's base endpoint ``"tcp://HOST:PORT"`` (jobs on PORT, calls on PORT+1),
        or a list of them. IP addresses or host names that libzmq resolves; not ``srv://``.
    :param settings: a `ClientSettings`; default ``ZQSYNC_*`` variables.
    :param overrides: ``ClientSettings`` fields, as for `zqsync.Client`: ``pool_size`` (sockets
        per event loop, process and endpoint set), ``call_timeout``, ``send_timeout``,
        ``confirm_timeout``, ``confirm_retry``, ``lease_timeout``, ``linger``, ``wait_before_drop``
        (seconds), ``congestion``, ``hwm``, ``heartbeat``, ``connect_timeout``, ``probe_timeout``,
        ``probe_backoff``, ``probe_backoff_max``.
    :param curve: `zqsync.Curve` keys for workers that require CURVE.
    :raises ConfigurationError: no endpoint, a malformed one, an ``srv://`` one, or a bad setting.

    Building it opens nothing. Sockets are opened on first use in each running event loop (and
    process: a forked child opens its own) and reused one request at a time. Usable as an async
    (or plain) context manager, which closes it.
    """

    def __init__(self, endpoints: Union[str, Sequence[str]], *, settings: Optional[ClientSettings] = None,
                 curve: Optional[Curve] = None, **overrides: Any) -> None:
        names = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not names or any(name.startswith("srv://") for name in names):
            raise ConfigurationError("AsyncClient needs one or more tcp:// worker endpoints (no srv://)",
                                     setting="endpoints")
        self.settings = settings.with_overrides(**overrides) if settings else ClientSettings.from_env(**overrides)
        pairs = [split_endpoint(name) for name in names]
        self.endpoints: tuple[str, ...] = tuple(jobs for jobs, _ in pairs)
        self._jobs_address: Any = self.endpoints if len(pairs) != 1 else self.endpoints[0]
        self._rpc_endpoints = tuple(rpc for _, rpc in pairs)
        self._rpc_address: Any = self._rpc_endpoints if len(pairs) != 1 else self._rpc_endpoints[0]
        self.congestion = CongestionControl.parse(self.settings.congestion)
        options = curve.client_options() if curve else None
        self._jobs = AsyncSocketPool(zmq.DEALER, settings=self.settings, options=options, send_only=True)
        self._calls = AsyncSocketPool(zmq.DEALER, settings=self.settings, options=options)
        # Background probes of down workers run in a thread (or a greenlet), on a sync pool of their own.
        self._probes = SocketPool(zmq.DEALER, settings=self.settings, peers=len(names), options=options)
        self._health = _AsyncHealth(
            functools.partial(health.ping, self._probes, timeout=self.settings.probe_timeout),
            backoff=self.settings.probe_backoff, backoff_max=self.settings.probe_backoff_max,
            probe_timeout=self.settings.probe_timeout)
        self._counts = dict.fromkeys(
            ("enqueued", "dropped", "confirmed", "confirm_retries", "calls", "call_errors", "call_timeouts"), 0)
        self._closed = False
        # A client let go without close() still closes its sockets when collected.
        weakref.finalize(self, _close_pools, self._jobs, self._calls, self._probes)

    # -- enqueue ---------------------------------------------------------------

    async def enqueue(self, task: str, *args: Any, **kwargs: Any) -> AsyncJob:
        """Send a plain job, at most once, under the client's congestion control.

        :returns: the job id (32 hex characters) as an `AsyncJob`; under DROP a dropped job's
            id is still returned, and the drop counted (`stats`) and logged.
        :raises Congested: BLOCK, and no worker took the job within ``send_timeout``.
        :raises ProtocolError: an argument cannot be serialised (nothing is sent).
        :raises PoolError: no pooled socket came free within ``lease_timeout``.
        """
        return await self.enqueue_with_options(task, args=args, kwargs=kwargs)

    async def enqueue_with_options(
        self, task: str, *, args: Iterable[Any] = (), kwargs: Optional[Mapping[str, Any]] = None,
        confirm: bool = False, congestion: Union[CongestionControl, str, None] = None,
        send_timeout: Optional[float] = None, job_id: Optional[str] = None, delay: Optional[float] = None,
        eta: Optional[datetime.datetime] = None, store_result: bool = False, deadline: Optional[float] = None,
        expires: Union[float, datetime.datetime, None] = None,
    ) -> AsyncJob:
        """Send a job with per-call options, as `zqsync.Client.enqueue_with_options` documents them.

        With ``confirm=True`` (or ``delay``/``eta``), waits until a worker acknowledges that the job
        is durable in its journal (at least once), retrying with the same id every ``confirm_retry``
        seconds up to ``confirm_timeout`` (or ``send_timeout``), on the job id's preferred worker
        (rendezvous hashing), failing over as the module docstring says.

        :raises Unconfirmed: ``confirm=True`` and no worker acknowledged in time.
        :raises RemoteError: the worker refused a confirmed job (``UnknownTask``, ``NoJournal``, ...).
        :raises ConfigurationError: an option out of range, as for the sync client.
        """
        self._check_open()
        frame, job_id, confirm, send_timeout = job_request(task, args, kwargs, confirm=confirm, job_id=job_id,
                                                           delay=delay, eta=eta, store_result=store_result,
                                                           deadline=deadline, send_timeout=send_timeout,
                                                           expires=expires)
        if confirm:
            await self._confirm(frame, job_id, task, self.settings.confirm_timeout if send_timeout is None
                                else send_timeout)
            self._counts["confirmed"] += 1
            return AsyncJob(job_id, self)
        mode = self.congestion if congestion is None else CongestionControl.parse(congestion)
        timeout = self.settings.send_timeout if send_timeout is None else send_timeout
        async with self._jobs.lease(self._jobs_address) as sock:
            budget = CONGESTION.budget(sock, self._jobs_address, mode, timeout, self.settings.wait_before_drop)
            sent = CONGESTION.outcome(self._jobs_address, mode, await transport.send(sock, frame, budget), timeout)
        self._counts["enqueued" if sent else "dropped"] += 1
        return AsyncJob(job_id, self)

    async def _confirm(self, frame: bytes, job_id: str, task: str, total: float) -> None:
        deadline = time.monotonic() + total
        reason = ""
        route = Route(job_id, self._rpc_endpoints, FAILOVER_ATTEMPTS * self.settings.confirm_retry, self._health)
        send_within = self.settings.probe_timeout if len(self._rpc_endpoints) > 1 else None
        while True:
            attempt = min(self.settings.confirm_retry, deadline - time.monotonic())
            if attempt <= 0:
                raise Unconfirmed(job_id, total, reason)
            try:
                reply = await self._request(frame, job_id, task, attempt, route.endpoint, send_within)
            except (CallTimeout, PoolError) as exc:
                reason = f"{route.endpoint}: {exc}"
                self._counts["confirm_retries"] += 1
                route.unanswered(sent=not isinstance(exc, health.Unsent))
                continue
            if not reply.ok:
                raise remote_error_of(reply)
            return

    # -- call --------------------------------------------------------------------

    async def call(self, task: str, *args: Any, **kwargs: Any) -> Any:
        """Run a task on a worker and return its result.

        :returns: the task's return value, as msgpack decodes it.
        :raises RemoteError: the task raised; `UnknownTask` if no such task.
        :raises CallTimeout: no reply within ``call_timeout``.
        :raises PoolError: no pooled socket came free within ``lease_timeout``.

        Cancelling the awaiting task (``asyncio.CancelledError``, ``asyncio.wait_for``) discards the
        socket: its late reply never reaches another call.
        """
        return await self.call_with_options(task, args=args, kwargs=kwargs)

    async def call_with_options(self, task: str, *, args: Iterable[Any] = (),
                                kwargs: Optional[Mapping[str, Any]] = None, timeout: Optional[float] = None) -> Any:
        """`call` with per-call options.

        :param timeout: seconds for this call (default ``call_timeout``); the request carries it, so a
            worker that reads it too late does not run it.
        :raises ConfigurationError: ``timeout`` is not a finite number above 0.
        """
        self._check_open()
        timeout = self._timeout(timeout)
        self._counts["calls"] += 1
        try:
            reply = await self.call_at(_task_name(task), tuple(args), dict(kwargs or {}), timeout)
        except CallTimeout:
            self._counts["call_timeouts"] += 1
            raise
        return call_result(reply, self._counts)

    def _timeout(self, timeout: Optional[float]) -> float:
        return call_timeout(self.settings, timeout)

    async def call_at(self, name: str, args: tuple, kwargs: dict, timeout: float,
                      address: Optional[str] = None) -> envelope.Reply:
        """One call of ``name`` to ``address`` (an rpc endpoint; default every worker): the worker's reply."""
        request_id = new_id()
        frame = envelope.encode_request("call", request_id, name, args, kwargs, deadline=timeout)
        return await self._request(frame, request_id, name, timeout, address)

    async def _request(self, frame: bytes, request_id: str, task: str, timeout: float, address: Optional[str],
                       send_within: Optional[float] = None) -> envelope.Reply:
        """One request and its reply on a pooled socket, within ``timeout`` seconds in all (``send_within``
        for the send, if given: `health.Unsent` when no connection took it)."""
        deadline = time.monotonic() + timeout
        target = address if address is not None and len(self._rpc_endpoints) > 1 else self._rpc_address
        async with self._calls.lease(target, timeout=min(timeout, self.settings.lease_timeout)) as sock:
            send_for = max(0.0, deadline - time.monotonic())
            if not await transport.send(sock, frame, send_for if send_within is None else min(send_for, send_within)):
                raise (CallTimeout if send_within is None else health.Unsent)(task, timeout, list(self.endpoints))
            while True:
                data = await transport.recv(sock, max(0.0, deadline - time.monotonic()))
                if data is None:
                    raise CallTimeout(task, timeout, list(self.endpoints))
                reply = envelope.decode_reply(data)
                if reply.id == request_id or (reply.id == "" and not reply.ok):
                    return reply

    # -- job handles ---------------------------------------------------------------

    async def job(self, job_id: str, *, timeout: Optional[float] = None) -> JobStatus:
        """The status of ``job_id``, from its preferred worker first (`zqsync.Client.job`)."""
        self._check_open()
        return await lookups.locate(self, job_id, self._timeout(timeout))

    async def result(self, job_id: str, *, timeout: Optional[float] = None) -> Any:
        """Wait until ``job_id`` finishes and return its result (`zqsync.Client.result`): long-polls the
        worker holding it, without blocking the loop.

        :param timeout: seconds in all (default ``call_timeout``).
        :raises RemoteError: the job failed, is dead or was cancelled (`JobCancelled`).
        :raises CallTimeout: it did not finish within ``timeout``.
        """
        self._check_open()
        return await lookups.result(self, job_id, self._timeout(timeout))

    async def cancel(self, job_id: str, *, timeout: Optional[float] = None) -> JobStatus:
        """Cancel ``job_id`` (`zqsync.Client.cancel`); its status after the attempt."""
        self._check_open()
        return await lookups.locate(self, job_id, self._timeout(timeout), admin_call="zqsync.cancel")

    def task(self, handle: "TaskHandle[P, R]") -> "AsyncTask[P, R]":
        """An `AsyncTask` sending ``handle`` (a ``@registry.task``) through this client."""
        from .tasks import AsyncTask

        return AsyncTask(handle, self)

    # -- lifecycle -----------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters of this client in this process: ``enqueued``, ``dropped``, ``confirmed``,
        ``confirm_retries``, ``calls``, ``call_errors``, ``call_timeouts``, and ``"job_sockets"`` /
        ``"call_sockets"``: each pool's `AsyncSocketPool.stats`."""
        return {**self._counts, "job_sockets": self._jobs.stats(), "call_sockets": self._calls.stats()}

    def close(self, *, linger: Optional[float] = None) -> None:
        """Close every idle pooled socket of this process (leased ones close when their request ends).
        Idempotent; returns within about ``linger`` seconds (default the client's)."""
        self._closed = True
        _close_pools(self._jobs, self._calls, self._probes, linger)

    async def aclose(self, *, linger: Optional[float] = None) -> None:
        """`close`, as a coroutine (for ``async with`` and lifespan handlers)."""
        self.close(linger=linger)

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed(f"this AsyncClient of {list(self.endpoints)} is closed")

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def __enter__(self) -> "AsyncClient":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<zqsync.aio.AsyncClient {list(self.endpoints)}>"


def _close_pools(jobs: AsyncSocketPool, calls: AsyncSocketPool, probes: SocketPool,
                 linger: Optional[float] = None) -> None:
    """Close a client's job sockets (their queued jobs get ``linger``, default the client's), then the others."""
    jobs.close(linger=linger)
    calls.close(linger=0)
    probes.close(linger=0)
