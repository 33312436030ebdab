"""Client: ``enqueue`` over pooled PUSH sockets, ``call`` over pooled DEALER sockets.

A worker at base endpoint ``tcp://HOST:N`` takes jobs (PULL) on port N and
calls (ROUTER) on port N+1. Options never mix with task arguments: ``enqueue``
and ``call`` pass ``*args, **kwargs`` to the task, and options travel only
through ``*_with_options`` (dramatiq's ``send`` / ``send_with_options``).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import zmq

from .. import _common
from ..errors import CallTimeout, ClientClosed, ConfigurationError, PoolError, RemoteError, Unconfirmed, remote_error
from ..settings import ClientSettings, check_seconds, default_endpoint
from ..wire import envelope
from ..wire.curve import Curve
from ..wire.endpoints import check_distinct, parse_endpoint, split_endpoint
from . import transport
from .congestion import STATE as CONGESTION
from .congestion import CongestionControl
from .pool import SocketPool
from .rendezvous import FAILOVER_ATTEMPTS, Down, Route


class Client:
    """Enqueue jobs and call tasks on one or more zqsync workers.

    :param endpoints: a worker's base endpoint ``"tcp://HOST:PORT"``, or a
        list of them; ZeroMQ balances across the workers that are connected.
    :param settings: a :class:`~zqsync.settings.ClientSettings` for this
        client and its pools; default: ``ZQSYNC_*`` environment variables,
        then the defaults (the table in ``zqsync/settings.py``).
    :param overrides: ``ClientSettings`` fields that replace those of
        ``settings``: ``pool_size`` (sockets per process, hub or thread, and
        endpoint set), ``call_timeout``, ``send_timeout``, ``confirm_timeout``,
        ``confirm_retry``, ``lease_timeout``, ``linger``, ``wait_before_drop``
        (seconds), ``congestion`` (``CongestionControl`` or ``"block"``/``"drop"``),
        ``hwm`` (messages), ``max_sockets``, ``heartbeat``, ``connect_timeout``.
    :param curve: :class:`zqsync.Curve` keys, for workers that require CURVE
        (``Curve.from_files("worker.key", "client.key_secret")``).
    :raises ConfigurationError: a malformed or unusable endpoint (see
        :func:`parse_endpoint`), an endpoint listed twice or overlapping
        another's port pair, or a setting out of range.

    Building a client opens nothing: sockets are opened on first use, per
    process and per gevent hub (per thread outside gevent), and reused. One
    client may be shared by every greenlet and thread of a process, and
    survives ``fork``: the child opens its own sockets. Usable as a context
    manager, which closes it.

    A client pickles as its configuration (endpoints, settings, CURVE keys;
    key files as their paths), never its sockets or counters: unpickling, in
    a ``multiprocessing`` ``spawn`` child say, builds a fresh client.
    """

    def __init__(
        self,
        endpoints: Union[str, Sequence[str]],
        *,
        settings: Optional[ClientSettings] = None,
        curve: Optional[Curve] = None,
        **overrides: Any,
    ) -> None:
        names = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not names:
            raise ConfigurationError("Client needs at least one worker endpoint", setting="endpoints")
        check_distinct([parse_endpoint(name) for name in names], names)
        pairs = [split_endpoint(name) for name in names]
        self.endpoints: tuple[str, ...] = tuple(jobs for jobs, _ in pairs)
        self._jobs_address = self.endpoints if len(pairs) > 1 else self.endpoints[0]
        rpc = tuple(rpc for _, rpc in pairs)
        self._rpc_address = rpc if len(pairs) > 1 else rpc[0]
        self._rpc_endpoints = rpc
        self._down = Down()
        self.settings = settings.with_overrides(**overrides) if settings else ClientSettings.from_env(**overrides)
        self.congestion = CongestionControl.parse(self.settings.congestion)
        options = curve.client_options() if curve else None
        self._push = SocketPool(zmq.PUSH, settings=self.settings, peers=len(pairs), options=options)
        self._dealer = SocketPool(zmq.DEALER, settings=self.settings, peers=len(pairs), options=options)
        self._counts = dict.fromkeys(
            ("enqueued", "dropped", "confirmed", "confirm_retries", "calls", "call_errors", "call_timeouts"), 0
        )
        self._closed = False
        self._config = (names, self.settings, curve)
        _common.track_client(self)

    def __reduce__(self) -> Any:
        names, settings, curve = self._config
        return _rebuild, (names, settings, curve)

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
            (``zqsync/client/rendezvous.py``). Congestion control does not apply.
        :param congestion: overrides the client's congestion control for this job.
        :param send_timeout: overrides this job's deadline, seconds: BLOCK's
            send deadline, or with ``confirm=True`` the confirm deadline.
        :param job_id: an id of your own (a non-empty str of at most 64 characters) instead of a new one.
        :returns: the job id. Under DROP a dropped job's id is still returned;
            the drop is counted in :meth:`stats` and logged.
        :raises Unconfirmed: ``confirm=True`` and no worker acknowledged in time.
        :raises RemoteError: ``confirm=True`` and the worker refused the job
            (``UnknownTask``, or ``NoJournal`` when it runs without ``--state-dir``);
            :class:`JournalUnavailable` when its journal cannot be written (the cause is in the message);
            :class:`DuplicateJob` when ``job_id`` is already journaled as dead-lettered.
        :raises ProtocolError: the job breaks a limit the worker enforces
            (``zqsync/wire/envelope.py``: 16 MiB frame, nesting, key types, ``job_id``);
            nothing is sent.
        :raises ConfigurationError: ``send_timeout`` negative, NaN or infinite
            (or 0 with ``confirm=True``).
        """
        self._check_open()
        job_id = os.urandom(16).hex() if job_id is None else job_id
        kind = "confirm" if confirm else "job"
        frame = envelope.encode_request(kind, job_id, _task_name(task), tuple(args), dict(kwargs or {}))
        if send_timeout is not None:
            send_timeout = check_seconds("send_timeout", send_timeout, 0.0, inclusive=not confirm)
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
            if sent:
                self._push.note_sent(sock)
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
        :raises CallTimeout: no reply within the client's ``call_timeout``;
            it names the endpoints and the likely causes.
        :raises ProtocolError: the request breaks a limit the worker enforces
            (nothing is sent), or the reply could not be decoded.

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
        :raises ConfigurationError: ``timeout`` is not a finite number above 0.
        """
        self._check_open()
        timeout = self.settings.call_timeout if timeout is None else check_seconds("timeout", timeout, inclusive=False)
        request_id = os.urandom(16).hex()
        name = _task_name(task)
        frame = envelope.encode_request("call", request_id, name, tuple(args), dict(kwargs or {}))
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
    ) -> envelope.Reply:
        """One request/reply on a pooled DEALER socket (to ``address``, default every worker), within
        ``timeout`` seconds in all."""
        deadline = time.monotonic() + timeout
        target = address if address is not None and len(self._rpc_endpoints) > 1 else self._rpc_address
        with self._dealer.lease(target, timeout=min(timeout, self.settings.lease_timeout)) as sock:
            return self._round_trip(sock, frame, request_id, task, timeout, deadline)

    def _round_trip(
        self, sock: zmq.Socket, frame: bytes, request_id: str, task: str, timeout: float, deadline: float
    ) -> envelope.Reply:
        if not transport.send(sock, frame, max(0.0, deadline - time.monotonic())):
            raise CallTimeout(task, timeout, list(self.endpoints))
        while True:
            data = transport.recv(sock, max(0.0, deadline - time.monotonic()))
            if data is None:
                raise CallTimeout(task, timeout, list(self.endpoints))
            reply = envelope.decode_reply(data)
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
            raise ClientClosed(f"this Client of {list(self.endpoints)} is closed")

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<zqsync.Client {list(self.endpoints)}>"


def _remote_error(reply: envelope.Reply) -> RemoteError:
    error = reply.error or {}
    return remote_error(error.get("type", "?"), error.get("message", ""), error.get("traceback", ""), request_id=reply.id)


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


def _rebuild(endpoints: list[str], settings: ClientSettings, curve: Optional[Curve]) -> Client:
    """A fresh :class:`Client` from a pickled one's configuration."""
    return Client(endpoints, settings=settings, curve=curve)


def enqueue(task: str, *args: Any, **kwargs: Any) -> str:
    """:meth:`Client.enqueue` on :func:`default_client`."""
    return default_client().enqueue(task, *args, **kwargs)


def call(task: str, *args: Any, **kwargs: Any) -> Any:
    """:meth:`Client.call` on :func:`default_client`."""
    return default_client().call(task, *args, **kwargs)


def close_all(*, linger: Optional[float] = None) -> None:
    """Close every client of this process (for gunicorn's ``worker_exit``).

    :param linger: seconds each may spend flushing queued jobs.
    """
    for client in _common.live_clients():
        client.close(linger=linger)
