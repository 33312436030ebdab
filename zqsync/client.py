"""Client: ``enqueue`` over pooled PUSH sockets, ``call`` over pooled DEALER sockets.

A worker at base endpoint ``tcp://HOST:N`` takes jobs (PULL) on port N and
calls (ROUTER) on port N+1. Options never mix with task arguments: ``enqueue``
and ``call`` pass ``*args, **kwargs`` to the task, and options travel only
through ``*_with_options`` (dramatiq's ``send`` / ``send_with_options``).
"""

from __future__ import annotations

import os
import re
import threading
import time
import weakref
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import zmq

from . import protocol, transport
from .auth import Curve
from .congestion import STATE as CONGESTION
from .congestion import CongestionControl
from .errors import (
    CallTimeout,
    ConfigurationError,
    DuplicateJob,
    JournalUnavailable,
    PoolError,
    RemoteError,
    Unconfirmed,
    UnknownTask,
    ZqsyncError,
)
from .pool import SocketPool
from .rendezvous import FAILOVER_ATTEMPTS, Down, Route
from .settings import ClientSettings, default_endpoint

_ENDPOINT = re.compile(r"^tcp://(?P<host>\[[0-9a-fA-F:.]+\]|[^:/\s\[\]]+):(?P<port>\d{1,5})$")
_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()


def parse_endpoint(endpoint: str, *, allow_zero: bool = False) -> tuple[str, int]:
    """Split ``"tcp://HOST:PORT"`` into ``("tcp://HOST", PORT)``.

    :param allow_zero: accept PORT 0 ("pick a free port", for binding).
    :raises ConfigurationError: not ``tcp://HOST:PORT`` with PORT in 1..65534 (or 0 if allowed).
    """
    match = _ENDPOINT.match(endpoint.strip()) if isinstance(endpoint, str) else None
    port = int(match["port"]) if match else -1
    if match is None or not (1 <= port <= 65534 or (allow_zero and port == 0)):
        raise ConfigurationError(
            f"worker endpoint must look like tcp://HOST:PORT (jobs on PORT, rpc on PORT+1), got {endpoint!r}",
            setting="endpoint",
        )
    return f"tcp://{match['host']}", port


def split_endpoint(endpoint: str) -> tuple[str, str]:
    """Map a worker's base endpoint to its ``(jobs, rpc)`` endpoints.

    ``"tcp://127.0.0.1:5555"`` gives ``("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556")``.

    :raises ConfigurationError: not a ``tcp://HOST:PORT`` endpoint with 1 <= PORT <= 65534.
    """
    host, port = parse_endpoint(endpoint)
    return f"{host}:{port}", f"{host}:{port + 1}"


class Client:
    """Enqueue jobs and call tasks on one or more zqsync workers.

    :param endpoints: a worker's base endpoint ``"tcp://HOST:PORT"``, or a
        list of them; ZeroMQ balances across the workers that are connected.
    :param pool_size: sockets per (process, hub or thread, endpoint set);
        default ``ZQSYNC_POOL_SIZE`` (4).
    :param call_timeout: default ``call`` deadline, seconds; default
        ``ZQSYNC_CALL_TIMEOUT`` (10.0).
    :param send_timeout: ``enqueue`` deadline under BLOCK, seconds; default
        ``ZQSYNC_SEND_TIMEOUT`` (1.0).
    :param congestion: ``CongestionControl.BLOCK`` or ``DROP`` (or
        ``"block"``/``"drop"``); default ``ZQSYNC_CONGESTION`` (block).
    :param wait_before_drop: DROP's wait before dropping, seconds; default
        ``ZQSYNC_WAIT_BEFORE_DROP`` (0.001).
    :param linger: seconds ``close()`` lets queued jobs flush; default ``ZQSYNC_LINGER`` (1.0).
    :param hwm: high-water mark per socket, messages; default ``ZQSYNC_HWM`` (1000).
    :param max_sockets: the pools' context ``MAX_SOCKETS``; default ``ZQSYNC_MAX_SOCKETS``.
    :param lease_timeout: bound on waiting for a pooled socket, seconds;
        default ``ZQSYNC_LEASE_TIMEOUT`` (5.0).
    :param confirm_timeout: deadline of ``confirm=True`` enqueues, seconds;
        default ``ZQSYNC_CONFIRM_TIMEOUT`` (10.0).
    :param confirm_retry: seconds one confirm attempt waits for its
        acknowledgement before retrying; default ``ZQSYNC_CONFIRM_RETRY`` (1.0).
    :param curve: :class:`zqsync.Curve` keys, for workers that require CURVE
        (``Curve.from_files("worker.key", "client.key_secret")``).
    :raises ConfigurationError: a malformed endpoint or setting.

    Building a client opens nothing: sockets are opened on first use, per
    process and per gevent hub (per thread outside gevent), and reused. One
    client may be shared by every greenlet and thread of a process, and
    survives ``fork``: the child opens its own sockets. Usable as a context
    manager, which closes it.
    """

    def __init__(
        self,
        endpoints: Union[str, Sequence[str]],
        *,
        pool_size: Optional[int] = None,
        call_timeout: Optional[float] = None,
        send_timeout: Optional[float] = None,
        congestion: Union[CongestionControl, str, None] = None,
        wait_before_drop: Optional[float] = None,
        linger: Optional[float] = None,
        hwm: Optional[int] = None,
        max_sockets: Optional[int] = None,
        lease_timeout: Optional[float] = None,
        confirm_timeout: Optional[float] = None,
        confirm_retry: Optional[float] = None,
        curve: Optional[Curve] = None,
    ) -> None:
        names = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not names:
            raise ConfigurationError("Client needs at least one worker endpoint", setting="endpoints")
        pairs = [split_endpoint(name) for name in names]
        self.endpoints: tuple[str, ...] = tuple(jobs for jobs, _ in pairs)
        self._jobs_address = self.endpoints if len(pairs) > 1 else self.endpoints[0]
        rpc = tuple(rpc for _, rpc in pairs)
        self._rpc_address = rpc if len(pairs) > 1 else rpc[0]
        self._rpc_endpoints = rpc
        self._down = Down()
        self.settings = ClientSettings.from_env(
            pool_size=pool_size,
            call_timeout=call_timeout,
            send_timeout=send_timeout,
            congestion=congestion,
            wait_before_drop=wait_before_drop,
            linger=linger,
            hwm=hwm,
            max_sockets=max_sockets,
            lease_timeout=lease_timeout,
            confirm_timeout=confirm_timeout,
            confirm_retry=confirm_retry,
        )
        self.congestion = CongestionControl.parse(self.settings.congestion)
        options = curve.client_options() if curve else None
        self._push = SocketPool(zmq.PUSH, settings=self.settings, peers=len(pairs), options=options)
        self._dealer = SocketPool(zmq.DEALER, settings=self.settings, peers=len(pairs), options=options)
        self._counts = dict.fromkeys(
            ("enqueued", "dropped", "confirmed", "confirm_retries", "calls", "call_errors", "call_timeouts"), 0
        )
        self._closed = False
        _clients.add(self)

    # -- enqueue -----------------------------------------------------------

    def enqueue(self, task: str, *args: Any, **kwargs: Any) -> str:
        """Send a job, at most once, over a pooled PUSH socket.

        :param task: registered task name; ``args``/``kwargs`` go to the task
            and must be msgpack-serialisable.
        :returns: the job id (32 hex characters).
        :raises Congested: BLOCK and no worker took the job within ``send_timeout``.
        :raises ProtocolError: an argument cannot be serialised.
        :raises PoolError: no pooled socket came free within ``lease_timeout``.

        Blocks (cooperatively under gevent) only while the worker's high-water
        mark is full, bounded by the congestion settings.
        """
        return self.enqueue_with_options(task, args=args, kwargs=kwargs)

    def enqueue_with_options(
        self,
        task: str,
        *,
        args: Iterable[Any] = (),
        kwargs: Optional[Mapping[str, Any]] = None,
        confirm: bool = False,
        congestion: Union[CongestionControl, str, None] = None,
        send_timeout: Optional[float] = None,
        job_id: Optional[str] = None,
    ) -> str:
        """Send a job with per-call options; see :meth:`enqueue`.

        :param args: positional task arguments (sequence).
        :param kwargs: keyword task arguments (mapping with str keys).
        :param confirm: send over DEALER and wait until a worker acknowledges
            that the job is durable in its journal: the job then runs at least
            once, even if worker processes are killed. An attempt that gets
            no acknowledgement within ``confirm_retry`` seconds is retried
            with the same job id (workers drop duplicates) until
            ``confirm_timeout``. With several workers, every attempt goes to
            the job id's preferred worker (rendezvous hashing), and to the
            next one only after ``5 * confirm_retry`` seconds without an answer
            (``zqsync/rendezvous.py``). Congestion control does not apply.
        :param congestion: overrides the client's congestion control for this job.
        :param send_timeout: overrides this job's deadline, seconds: BLOCK's
            send deadline, or with ``confirm=True`` the confirm deadline.
        :param job_id: an id of your own (at most 64 characters) instead of a new one.
        :returns: the job id. Under DROP a dropped job's id is still returned;
            the drop is counted in :meth:`stats` and logged.
        :raises Unconfirmed: ``confirm=True`` and no worker acknowledged in time.
        :raises RemoteError: ``confirm=True`` and the worker refused the job
            (``UnknownTask``, or ``NoJournal`` when it runs without ``--state-dir``);
            :class:`JournalUnavailable` when its journal cannot be written (the cause is in the message);
            :class:`DuplicateJob` when ``job_id`` is already journaled as dead-lettered.
        """
        self._check_open()
        job_id = job_id or os.urandom(16).hex()
        kind = "confirm" if confirm else "job"
        frame = protocol.encode_request(kind, job_id, _task_name(task), tuple(args), dict(kwargs or {}))
        if confirm:
            total = self.settings.confirm_timeout if send_timeout is None else send_timeout
            self._confirm(frame, job_id, task, total)
            self._counts["confirmed"] += 1
            return job_id
        mode = self.congestion if congestion is None else CongestionControl.parse(congestion)
        timeout = self.settings.send_timeout if send_timeout is None else send_timeout
        with self._push.lease(self._jobs_address) as sock:
            sent = CONGESTION.send(
                sock, frame, self._jobs_address, mode,
                send_timeout=timeout, wait_before_drop=self.settings.wait_before_drop,
            )
        self._counts["enqueued" if sent else "dropped"] += 1
        return job_id

    def _confirm(self, frame: bytes, job_id: str, task: str, total: float) -> None:
        """Send to the job's preferred worker, and retry there; fail over only past a bound (``rendezvous.py``)."""
        deadline = time.monotonic() + total
        reason = ""
        route = Route(job_id, self._rpc_endpoints, FAILOVER_ATTEMPTS * self.settings.confirm_retry, self._down)
        while True:
            attempt = min(self.settings.confirm_retry, deadline - time.monotonic())
            if attempt <= 0:
                raise Unconfirmed(job_id, total, reason)
            try:
                reply = self._request(frame, job_id, task, attempt, address=route.endpoint)
            except (CallTimeout, PoolError) as exc:
                reason = f"{route.endpoint}: {exc}"
                self._counts["confirm_retries"] += 1
                route.unanswered()
                continue
            if not reply.ok:
                raise _remote_error(reply)
            return

    # -- call --------------------------------------------------------------

    def call(self, task: str, *args: Any, **kwargs: Any) -> Any:
        """Run a task on a worker and return its result.

        :param task: registered task name; ``args``/``kwargs`` go to the task.
        :returns: the task's return value, as msgpack decodes it (tuples come back as lists).
        :raises RemoteError: the task raised (``remote_type``, ``remote_message``,
            ``remote_traceback`` describe it); :class:`UnknownTask` if no such task.
        :raises CallTimeout: no reply within the client's ``call_timeout``.
        :raises ProtocolError: the reply could not be decoded.

        Blocks the calling greenlet (or thread) until the reply or the deadline.
        A ``gevent.Timeout`` of the caller's own propagates unchanged, and the
        socket it interrupted is discarded, never reused.
        """
        return self.call_with_options(task, args=args, kwargs=kwargs)

    def call_with_options(
        self,
        task: str,
        *,
        args: Iterable[Any] = (),
        kwargs: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = None,
    ) -> Any:
        """Call with per-call options; see :meth:`call`.

        :param timeout: deadline for this call, seconds (default: ``call_timeout``).
        """
        self._check_open()
        timeout = self.settings.call_timeout if timeout is None else float(timeout)
        request_id = os.urandom(16).hex()
        name = _task_name(task)
        frame = protocol.encode_request("call", request_id, name, tuple(args), dict(kwargs or {}))
        self._counts["calls"] += 1
        try:
            reply = self._request(frame, request_id, name, timeout)
        except CallTimeout:
            self._counts["call_timeouts"] += 1
            raise
        if reply.ok:
            return reply.result
        self._counts["call_errors"] += 1
        raise _remote_error(reply)

    def _request(
        self, frame: bytes, request_id: str, task: str, timeout: float, *, address: Optional[str] = None
    ) -> protocol.Reply:
        """One request/reply on a pooled DEALER socket (to ``address``, default every worker), within
        ``timeout`` seconds in all."""
        deadline = time.monotonic() + timeout
        target = address if address is not None and len(self._rpc_endpoints) > 1 else self._rpc_address
        with self._dealer.lease(target, timeout=min(timeout, self.settings.lease_timeout)) as sock:
            return self._round_trip(sock, frame, request_id, task, timeout, deadline)

    def _round_trip(
        self, sock: zmq.Socket, frame: bytes, request_id: str, task: str, timeout: float, deadline: float
    ) -> protocol.Reply:
        if not transport.send(sock, frame, max(0.0, deadline - time.monotonic())):
            raise CallTimeout(task, timeout)
        while True:
            data = transport.recv(sock, max(0.0, deadline - time.monotonic()))
            if data is None:
                raise CallTimeout(task, timeout)
            reply = protocol.decode_reply(data)
            if reply.id == request_id or (reply.id == "" and not reply.ok):
                return reply
            self._dealer.note_stale_reply()  # a reply to an abandoned request: never delivered

    # -- lifecycle ---------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters of this client in this process.

        :returns: ``{"enqueued", "dropped", "confirmed", "confirm_retries", "calls",
            "call_errors", "call_timeouts"}``
            as ints, plus ``"push"`` and ``"dealer"``: each pool's
            :meth:`SocketPool.stats`.
        """
        result: dict[str, Any] = dict(self._counts)
        result["push"] = self._push.stats()
        result["dealer"] = self._dealer.stats()
        return result

    def close(self, *, linger: Optional[float] = None) -> None:
        """Close every pooled socket of this process. Idempotent.

        :param linger: seconds queued jobs may take to flush (default: the
            client's ``linger``). Returns within about that even when no
            worker is reachable.
        """
        self._closed = True
        self._push.close(linger=linger)
        self._dealer.close(linger=0 if linger is None else linger)

    def _check_open(self) -> None:
        if self._closed:
            raise ZqsyncError("this Client is closed")

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<zqsync.Client {list(self.endpoints)}>"


def _remote_error(reply: protocol.Reply) -> RemoteError:
    error = reply.error or {}
    kind, message, trace = error.get("type", "?"), error.get("message", ""), error.get("traceback", "")
    if kind in ("JournalUnavailable", "DuplicateJob"):
        job_error = JournalUnavailable if kind == "JournalUnavailable" else DuplicateJob
        return job_error(kind, message, trace, job_id=reply.id)
    return (UnknownTask if kind == "UnknownTask" else RemoteError)(kind, message, trace)


def _task_name(task: str) -> str:
    if not isinstance(task, str) or not task:
        raise ConfigurationError(f"task name must be a non-empty str, got {task!r}", setting="task")
    return task


_default_lock = threading.Lock()
_default: Optional[Client] = None


def default_client() -> Client:
    """The process-wide client for ``ZQSYNC_ENDPOINT``, built at first use.

    :raises ConfigurationError: ``ZQSYNC_ENDPOINT`` is unset or malformed.
    """
    global _default
    client = _default
    if client is None:
        with _default_lock:
            if _default is None:
                _default = Client(default_endpoint())
            client = _default
    return client


def enqueue(task: str, *args: Any, **kwargs: Any) -> str:
    """:meth:`Client.enqueue` on :func:`default_client`."""
    return default_client().enqueue(task, *args, **kwargs)


def call(task: str, *args: Any, **kwargs: Any) -> Any:
    """:meth:`Client.call` on :func:`default_client`."""
    return default_client().call(task, *args, **kwargs)


def all_clients() -> list[Client]:
    """Every client built in this process and not garbage-collected (for metrics)."""
    return list(_clients)


def close_all(*, linger: Optional[float] = None) -> None:
    """Close every client of this process (for gunicorn's ``worker_exit``).

    :param linger: seconds each may spend flushing queued jobs.
    """
    for client in all_clients():
        client.close(linger=linger)
