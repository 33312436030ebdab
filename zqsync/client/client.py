"""Client: ``enqueue`` over pooled job DEALER sockets, ``call`` over pooled DEALER sockets.

A worker at base endpoint ``tcp://HOST:N`` takes jobs (ROUTER) on port N and
calls (ROUTER) on port N+1. Options never mix with task arguments: ``enqueue``
and ``call`` pass ``*args, **kwargs`` to the task, and options travel only
through ``*_with_options`` (dramatiq's ``send`` / ``send_with_options``).
"""

from __future__ import annotations

import datetime
import functools
import logging
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import zmq

from .. import _common
from ..errors import (
    CallTimeout,
    ClientClosed,
    ConfigurationError,
    PoolError,
    Unconfirmed,
    ZqsyncWarning,
)
from ..settings import ClientSettings, check_seconds, default_endpoint
from ..wire import envelope
from ..wire.curve import Curve
from ..wire.endpoints import split_endpoint
from . import announce, discovery, express, health, lookups, notices, transport, waits
from .congestion import STATE as CONGESTION
from .congestion import CongestionControl
from .jobs import Job, JobStatus, expiry
from .lookups import base_of, remote_error_of
from .pool import SocketPool
from .process import new_id
from .rendezvous import FAILOVER_ATTEMPTS, Route
from .routes import Routes

log = logging.getLogger(__name__)
_new_str = str.__new__

class Client:
    """Enqueue jobs and call tasks on one or more zqsync workers.

    :param endpoints: a worker's base endpoint ``"tcp://HOST:PORT"``, or a
        list of them; ZeroMQ balances across the workers that are connected.
        A HOST that is a DNS name stands for every address it resolves to, and
        ``"srv://NAME"`` for the hosts and ports of ``_zqsync._tcp.NAME``'s SRV
        records; both are looked up at first use and again every
        ``resolve_interval`` seconds (``zqsync/client/discovery.py``).
        May be omitted when ``routes`` has a ``"*"`` route.
    :param routes: ``{task-name pattern: endpoint or [endpoints]}``: the
        tasks whose names match go to those workers, through pools of their
        own (``zqsync/client/routes.py`` gives the precedence: exact names,
        then patterns in order, then ``"*"``, then ``endpoints``).
    :param settings: a `ClientSettings` for this
        client and its pools; default: ``ZQSYNC_*`` environment variables,
        then the defaults (the table in ``zqsync/settings.py``).
    :param overrides: ``ClientSettings`` fields that replace those of
        ``settings``: ``pool_size`` (sockets per process, hub or thread, and
        endpoint set), ``call_timeout``, ``send_timeout``, ``confirm_timeout``,
        ``confirm_retry``, ``lease_timeout``, ``linger``, ``wait_before_drop``
        (seconds), ``congestion`` (``CongestionControl`` or ``"block"``/``"drop"``),
        ``hwm`` (messages), ``max_sockets``, ``heartbeat``, ``connect_timeout``,
        ``resolver`` (a nameserver ``"HOST[:PORT]"``; ``""``: the system's), ``resolve_interval``,
        ``probe_timeout``, ``probe_backoff``, ``probe_backoff_max`` (seconds: how a
        dead worker among several is found and probed, ``zqsync/client/health.py``),
        ``expand_prefork`` (bool: send to the slots a direct prefork worker announces, one endpoint per
        child, ``zqsync/client/announce.py``).
    :param curve: `zqsync.Curve` keys, for workers that require CURVE
        (``Curve.from_files("worker.key", "client.key_secret")``).
    :raises ConfigurationError: a malformed or unusable endpoint (see
        `parse_endpoint`), an endpoint listed twice or overlapping
        another's port pair, a setting out of range, a malformed route, or
        both ``endpoints`` and a ``"*"`` route (or neither); ``srv://`` or
        ``resolver`` without dnspython installed.

    Requests raise `PoolError` while no DNS name of ``endpoints`` has
    resolved to any address yet.

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
        endpoints: Union[str, Sequence[str], None] = None,
        *,
        routes: Optional[Mapping[str, Union[str, Sequence[str]]]] = None,
        settings: Optional[ClientSettings] = None,
        curve: Optional[Curve] = None,
        **overrides: Any,
    ) -> None:
        self._routes = Routes(routes or {})
        if (endpoints is None) == (self._routes.default is None):
            raise ConfigurationError("give a Client its default workers as endpoints or as the '*' route "
                                     "(one of them)", setting="endpoints")
        chosen = endpoints if endpoints is not None else self._routes.default or ()
        names = [chosen] if isinstance(chosen, str) else list(chosen)
        own = tuple(names)
        if not names:
            raise ConfigurationError("Client needs at least one worker endpoint", setting="endpoints")
        self.settings = settings.with_overrides(**overrides) if settings else ClientSettings.from_env(**overrides)
        self._discovery = discovery.discovery_for(names, self.settings, announce=self._announced)
        self._base: tuple[str, ...] = () if self._discovery else own
        self._use(self._base)
        self.congestion = CongestionControl.parse(self.settings.congestion)
        options = curve.client_options() if curve else None
        self._jobs = SocketPool(zmq.DEALER, settings=self.settings, peers=len(names), options=options, send_only=True)
        self._avoided = notices.Avoided()
        self._dealer = SocketPool(zmq.DEALER, settings=self.settings, peers=len(names), options=options)
        self._waits = waits.Waits(self._dealer)  # result() long-polls, outside the pool's cap (waits.py)
        self._health = health.Health(
            functools.partial(health.ping, self._dealer, timeout=self.settings.probe_timeout),
            backoff=self.settings.probe_backoff, backoff_max=self.settings.probe_backoff_max,
            probe_timeout=self.settings.probe_timeout)
        self._counts = dict.fromkeys(
            ("enqueued", "dropped", "confirmed", "confirm_retries", "calls", "call_errors", "call_timeouts"), 0
        )
        self._closed = False
        # A client let go without close() still closes its sockets (with their linger) when collected.
        weakref.finalize(self, _close_pools, self._jobs, self._dealer, self._waits)
        self._config = (names, self.settings, curve)
        _common.track_client(self)
        self._routed = {
            names: Client(list(names), settings=self.settings, curve=curve)
            for names in self._routes.endpoint_sets() if names != own
        }

    def _use(self, base: tuple[str, ...]) -> None:
        """Send to the workers at the ``base`` endpoints from now on."""
        pairs = [split_endpoint(name) for name in base]
        self.endpoints: tuple[str, ...] = tuple(jobs for jobs, _ in pairs)
        self._jobs_address: Any = self.endpoints if len(pairs) != 1 else self.endpoints[0]
        self._rpc_endpoints = tuple(rpc for _, rpc in pairs)
        self._rpc_address: Any = self._rpc_endpoints if len(pairs) != 1 else self._rpc_endpoints[0]

    def _announced(self, endpoint: str) -> Optional[tuple[str, ...]]:
        """The slots the worker at ``endpoint`` announces (``expand_prefork``: ``announce.py``)."""
        return announce.slot_endpoints(self._dealer, endpoint, self.settings.probe_timeout)

    def _rediscover(self) -> None:
        """Follow the endpoints the names resolve to now (``discovery.py``): dial the workers that appeared,
        drain the sockets to those that left (closed with the linger, after the request in flight).

        :raises PoolError: no name resolved to any address yet.
        """
        assert self._discovery is not None
        base = self._discovery.current()
        if base == self._base:
            return
        old = {self._jobs_address, self._rpc_address}
        self._base = base
        self._use(base)
        kept = {*self.endpoints, *self._rpc_endpoints}
        log.info("worker endpoints now %s", ", ".join(base))

        def stale(address: Any) -> bool:
            return address in old or any(name not in kept for name in discovery.members(address))

        self._jobs.drain(stale)
        self._dealer.drain(stale)
        self._waits.drain(stale)

    def route(self, task: str) -> "Client":
        """The client that sends ``task``: this one, or the one of the route its name matches."""
        if not self._routed:  # no routes, or all to this client's endpoints: nothing to match on the hot path
            return self
        names = self._routes.match(_task_name(task))
        return self if names is None else self._routed.get(names, self)

    def __reduce__(self) -> Any:
        names, settings, curve = self._config
        return _rebuild, (names, settings, curve)

    # -- enqueue -----------------------------------------------------------

    def enqueue(self, task: str, *args: Any, **kwargs: Any) -> Job[Any]:
        """Send a job, at most once, over a pooled DEALER socket (the worker only sends stopping notices back).

        :param task: registered task name; ``args``/``kwargs`` go to the task
            and must be msgpack-serialisable.
        :returns: the job id (32 hex characters), as a `Job`: a ``str`` with
            ``result()``, ``status()`` and ``cancel()``.
        :raises Congested: BLOCK and no worker took the job within ``send_timeout``.
        :raises ProtocolError: an argument cannot be serialised.
        :raises PoolError: no pooled socket came free within ``lease_timeout``.

        Blocks (cooperatively under gevent) only while the worker's high-water
        mark is full, bounded by the congestion settings.
        """
        if self._routed or self._closed:  # matching a route, or raising ClientClosed: the general path
            return self.enqueue_with_options(task, args=args, kwargs=kwargs)
        job_id = new_id()
        frame = envelope.encode_request("job", job_id, _task_name(task), args, kwargs)
        job = _new_str(Job, self._send_job(frame, job_id, self.congestion, None))  # Job(...), without its frame
        job.client = self
        return job

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
        delay: Optional[float] = None,
        eta: Optional[datetime.datetime] = None,
        store_result: bool = False,
        expires: Union[float, datetime.datetime, None] = None,
        deadline: Optional[float] = None,
    ) -> Job[Any]:
        """Send a job with per-call options; see `enqueue`.

        :param args: positional task arguments (sequence).
        :param kwargs: keyword task arguments (mapping with str keys).
        :param confirm: send over DEALER and wait until a worker acknowledges
            that the job is durable in its journal: the job then runs at least
            once, even if worker processes are killed. An attempt that gets
            no acknowledgement within ``confirm_retry`` seconds is retried
            with the same job id (workers drop duplicates) until
            ``confirm_timeout``. With several workers, every attempt goes to
            the job id's preferred worker (rendezvous hashing), and to the
            next one only when that one cannot be reached (no connection takes
            the attempt within ``probe_timeout``, or a probe after an unanswered
            attempt finds none) or after ``5 * confirm_retry`` seconds without an
            answer; a worker found unreachable is skipped until a probe, repeated
            with backoff, is answered (``zqsync/client/rendezvous.py``,
            ``health.py``). Congestion control does not apply.
        :param congestion: overrides the client's congestion control for this job.
        :param send_timeout: overrides this job's deadline, seconds: BLOCK's
            send deadline, or with ``confirm=True`` the confirm deadline.
        :param job_id: an id of your own (a non-empty str of at most 64 characters) instead of a new one.
        :param delay: run the job no earlier than ``delay`` seconds from now (float >= 0). Implies
            ``confirm=True``: the worker journals it (its state is ``scheduled``) and starts it at or after its
            due time, in due-time order, even across a restart. Needs a worker with ``--state-dir``.
        :param eta: as ``delay``, but an aware `datetime.datetime` (any time zone) to run at or after.
            The due time travels as epoch seconds: keep client and worker clocks in sync (NTP).
        :param store_result: for a plain job, ask the worker to keep its status and result in memory
            (bounded, ``--keep-done`` seconds) for `job` and `result`, as a task registered with
            ``store_result=True`` does. Confirmed jobs keep theirs in the journal anyway.
        :param expires: seconds from now (float > 0), or an aware `datetime.datetime`, after
            which no worker starts this job (nor a retry of it). A plain job found expired is skipped,
            counted (``jobs_expired`` in the worker's stats) and logged; its budget is stamped on receipt by
            the worker's own clock (``zqsync/wire/envelope.py``). A confirmed (or delayed) job is journaled
            with its expiry as epoch seconds (keep clocks in sync: NTP), and one found expired is
            recorded ``expired``: `result` raises `JobExpired`. ``None``: never.
        :param deadline: the older name of ``expires``, in seconds only; kept as an alias.
        :returns: the job id. Under DROP a dropped job's id is still returned;
            the drop is counted in `stats` and logged.
        :raises Unconfirmed: ``confirm=True`` and no worker acknowledged in time.
        :raises RemoteError: ``confirm=True`` and the worker refused the job
            (``UnknownTask``, or ``NoJournal`` when it runs without ``--state-dir``);
            `JournalUnavailable` when its journal cannot be written (the cause is in the message);
            `DuplicateJob` when ``job_id`` is already journaled as dead-lettered.
        :raises ProtocolError: the job breaks a limit the worker enforces
            (``zqsync/wire/envelope.py``: 16 MiB frame, nesting, key types, ``job_id``);
            nothing is sent.
        :raises ConfigurationError: ``send_timeout`` negative, NaN or infinite
            (or 0 with ``confirm=True``); ``delay`` not a number of seconds >= 0, ``eta`` not an aware
            datetime, or both given; ``expires`` (or ``deadline``) not above 0, a naive or past datetime,
            or both given.
        :raises NoJournal: ``delay``/``eta`` (or ``confirm``) and the worker keeps no journal.
        """
        self._check_open()
        routed = self.route(task)
        if routed is not self:
            return routed.enqueue_with_options(task, args=args, kwargs=kwargs, confirm=confirm, congestion=congestion,
                                               send_timeout=send_timeout, job_id=job_id, delay=delay, eta=eta,
                                               store_result=store_result, expires=expires, deadline=deadline)
        frame, job_id, confirm, send_timeout = job_request(task, args, kwargs, confirm=confirm, job_id=job_id,
                                                           delay=delay, eta=eta, store_result=store_result,
                                                           expires=expires, deadline=deadline,
                                                           send_timeout=send_timeout)
        if confirm:
            return self.send_confirmed(frame, job_id, task, send_timeout)
        mode = self.congestion if congestion is None else CongestionControl.parse(congestion)
        return Job(self._send_job(frame, job_id, mode, send_timeout), self)

    def send_confirmed(self, frame: bytes, job_id: str, task: str, send_timeout: Optional[float] = None) -> Job[Any]:
        """Send a confirmed job's ``frame`` (`job_request`) until a worker acknowledges it
        (``enqueue_with_options(confirm=True)``; ``zqsync.canvas`` sends its steps so, through `route`).

        :raises Unconfirmed: no worker acknowledged it in time.
        :raises RemoteError: a worker refused it (as `enqueue_with_options` says).
        """
        total = self.settings.confirm_timeout if send_timeout is None else send_timeout
        self._confirm(frame, job_id, task, total)
        self._counts["confirmed"] += 1
        return Job(job_id, self)

    def _send_job(self, frame: bytes, job_id: str, mode: CongestionControl, send_timeout: Optional[float]) -> str:
        """Send a plain job's frame: the express lane (``express.py``) first, else a lease under congestion control."""
        if self._discovery is not None:
            self._rediscover()
        avoided = self._avoided
        address = avoided.address(self.endpoints, self._jobs_address) if avoided.until else self._jobs_address
        if not CONGESTION.is_marked(self._jobs_address) and express.try_send(self._jobs, address, frame):
            self._counts["enqueued"] += 1
            return job_id
        timeout = self.settings.send_timeout if send_timeout is None else send_timeout
        with self._jobs.lease(address) as sock:
            self._check_notice(sock)
            sent = CONGESTION.send(
                sock, frame, self._jobs_address, mode,
                send_timeout=timeout, wait_before_drop=self.settings.wait_before_drop,
            )
            if sent:
                self._jobs.note_sent(sock)
            else:
                self._jobs.check_fds()  # is the worker congested, or is this process out of descriptors?
        self._counts["enqueued" if sent else "dropped"] += 1
        return job_id

    def _check_notice(self, sock: zmq.Socket) -> None:
        """Every few sends, look for a worker's stopping notice (``notices.py``); on one, discard the socket
        after this send (its queue is flushed within the linger) and leave that worker out for a while."""
        if self._jobs.sent_on(sock) % notices.CHECK_EVERY:
            return
        endpoints = notices.stopping_endpoints(sock)
        if endpoints is None:
            return
        self._jobs.retire(sock)
        named = notices.match(endpoints, self.endpoints)
        log.info("worker %s is stopping: new jobs go to the others", named or ", ".join(endpoints) or "?")
        if named is not None:
            self._avoided.add(named)

    def _confirm(self, frame: bytes, job_id: str, task: str, total: float) -> None:
        """Send to the job's preferred worker, and retry there; fail over only when it did not confirm and
        cannot be reached, or past a bound (``rendezvous.py``)."""
        deadline = time.monotonic() + total
        reason = ""
        if self._discovery is not None:
            self._rediscover()
        route = Route(job_id, self._rpc_endpoints, FAILOVER_ATTEMPTS * self.settings.confirm_retry, self._health)
        send_within = self.settings.probe_timeout if len(self._rpc_endpoints) > 1 else None
        while True:
            attempt = min(self.settings.confirm_retry, deadline - time.monotonic())
            if attempt <= 0:
                raise Unconfirmed(job_id, total, reason)
            try:
                reply = self._request(frame, job_id, task, attempt, address=route.endpoint, send_within=send_within,
                                      multiplexed=True)
            except (CallTimeout, PoolError) as exc:
                reason = f"{route.endpoint}: {exc}"
                self._counts["confirm_retries"] += 1
                route.unanswered(sent=not isinstance(exc, health.Unsent))
                continue
            if not reply.ok:
                raise remote_error_of(reply)
            return

    # -- call --------------------------------------------------------------

    def call(self, task: str, *args: Any, **kwargs: Any) -> Any:
        """Run a task on a worker and return its result.

        :param task: registered task name; ``args``/``kwargs`` go to the task.
        :returns: the task's return value, as msgpack decodes it (tuples come back as lists).
        :raises RemoteError: the task raised (``remote_type``, ``remote_message``,
            ``remote_traceback`` describe it); `UnknownTask` if no such task.
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
        """Call with per-call options; see `call`.

        :param timeout: deadline for this call, seconds (default: ``call_timeout``). The request
            carries it, so a worker that reads the call after the caller gave up does not run it
            (``calls_expired`` in its stats).
        :raises ConfigurationError: ``timeout`` is not a finite number above 0.
        """
        self._check_open()
        routed = self.route(task)
        if routed is not self:
            return routed.call_with_options(task, args=args, kwargs=kwargs, timeout=timeout)
        timeout = self._timeout(timeout)
        self._counts["calls"] += 1
        try:
            reply = self._call_at(_task_name(task), tuple(args), dict(kwargs or {}), timeout)
        except CallTimeout:
            self._counts["call_timeouts"] += 1
            raise
        return call_result(reply, self._counts)

    def _timeout(self, timeout: Optional[float]) -> float:
        return call_timeout(self.settings, timeout)

    def _call_at(self, name: str, args: tuple, kwargs: dict, timeout: float,
                 address: Optional[str] = None, multiplexed: bool = False) -> envelope.Reply:
        request_id = new_id()
        frame = envelope.encode_request("call", request_id, name, args, kwargs, deadline=timeout)
        return self._request(frame, request_id, name, timeout, address=address, multiplexed=multiplexed)

    # -- job handles ---------------------------------------------------------

    def job(self, job_id: str, *, timeout: Optional[float] = None) -> JobStatus:
        """The status of job ``job_id`` (``zqsync.job`` admin call).

        Asks the job id's preferred worker first (the rendezvous hashing of confirmed delivery), then the
        others (under gevent at once, once the preferred one says no or is silent for
        `HEDGE` seconds; else in rank), then each route's workers the same
        way, until one holds it; each for up to ``timeout`` seconds (default ``call_timeout``).

        :returns: a `JobStatus`; ``state`` is ``unknown`` when no reachable worker holds the id
            (``zqsync/client/jobs.py`` says what that can mean; ``unanswered`` lists the silent workers).
        :raises ConfigurationError: a bad ``timeout``.
        :raises RemoteError: a worker refused the request (``RequestRejected`` for a malformed id).
        """
        self._check_open()
        return lookups.locate(self, job_id, self._timeout(timeout))[1]

    def result(self, job_id: str, *, timeout: Optional[float] = None) -> Any:
        """Wait until job ``job_id`` finishes, then return its result or raise its error.

        Blocks the calling greenlet (cooperatively under gevent) or thread. It finds the worker holding the
        job (`job`), then long-polls it (``zqsync.result``: the worker answers as soon as the job
        finishes, or after at most `LONG_POLL` s, and the client asks
        again). When every worker that could hold the id answers that none does, a plain ``str`` id
        raises `JobNotFound` at once, while a `Job`
        handle this client returned is long-polled on its preferred worker a second at a time, then
        looked up again: its plain job may still be on its way.

        :param timeout: seconds to wait in all (default ``call_timeout``).
        :returns: the task's return value (as msgpack decodes it). Only confirmed jobs and plain jobs
            stored on request (``store_result``) have one to wait for.
        :raises RemoteError: the job failed or is dead: its task's error (type name and message);
            `JobCancelled` if it was cancelled.
        :raises CallTimeout: it did not finish within ``timeout``. A worker that dies, restarts or stops
            meanwhile does not end the wait: the job is looked for again until ``timeout``.
        :raises JobNotFound: ``job_id`` is a plain ``str`` that every worker answered it does not hold.
        """
        self._check_open()
        return lookups.result(self, job_id, self._timeout(timeout))

    def cancel(self, job_id: str, *, timeout: Optional[float] = None) -> JobStatus:
        """Cancel job ``job_id`` (``zqsync.cancel``): a pending or scheduled job is marked ``cancelled``
        and never starts; a running one is interrupted where it next yields (``gevent.kill``) and recorded
        ``cancelled``. A finished job is left as it is.

        Asks the preferred worker first, then the others, each for up to ``timeout`` seconds.

        :returns: the job's `JobStatus` after the attempt: ``state == "cancelled"`` if it is
            cancelled; ``unknown`` if no reachable worker holds it (a plain job is cancellable only while
            its status is kept, ``store_result``, or while it runs).
        """
        self._check_open()
        return lookups.locate(self, job_id, self._timeout(timeout), admin_call="zqsync.cancel")[1]

    def _request(
        self, frame: bytes, request_id: str, task: str, timeout: float, *, address: Optional[str] = None,
        send_within: Optional[float] = None, multiplexed: bool = False,
    ) -> envelope.Reply:
        """One request/reply on a pooled DEALER socket (to ``address``, default every worker), within
        ``timeout`` seconds in all, and within ``send_within`` for the send if given; ``multiplexed``:
        on the caller's long-poll channel instead, outside the pool's cap (``waits.py``).

        :raises health.Unsent: (a `CallTimeout`) no connection took the request within
            ``send_within`` (a wait for the lease that left less than that raises a plain ``CallTimeout``:
            it says nothing about the worker).
        """
        deadline = time.monotonic() + timeout
        if self._discovery is not None:
            self._rediscover()
        target = address if address is not None and len(self._rpc_endpoints) > 1 else self._rpc_address
        if multiplexed:
            reply = self._waits.request(target, frame, request_id, timeout, send_within)
            if reply is waits.UNSENT:
                raise health.Unsent(task, timeout, list(self.endpoints))
            if not isinstance(reply, envelope.Reply):
                raise CallTimeout(task, timeout, list(self.endpoints))
            return reply
        with self._dealer.lease(target, timeout=min(timeout, self.settings.lease_timeout)) as sock:
            if send_within is not None and deadline - time.monotonic() < min(send_within, timeout) - 0.001:
                send_within = None
            return self._round_trip(sock, frame, request_id, task, timeout, deadline, send_within)

    def _round_trip(
        self, sock: zmq.Socket, frame: bytes, request_id: str, task: str, timeout: float, deadline: float,
        send_within: Optional[float] = None,
    ) -> envelope.Reply:
        send_for = max(0.0, deadline - time.monotonic())
        if not transport.send(sock, frame, send_for if send_within is None else min(send_for, send_within)):
            raise (CallTimeout if send_within is None else health.Unsent)(task, timeout, list(self.endpoints))
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
            as ints, ``"endpoints"``: the workers' base endpoints in use now (a DNS name's
            addresses as last resolved, ``discovery.py``), ``"down"``: those held down now
            (``health.py``: confirmed jobs skip them until a probe is answered), plus ``"jobs"`` (the job
            DEALERs; also under ``"push"``, its name until 0.2.0, for one release) and ``"dealer"``
            (the call DEALERs): each pool's `SocketPool.stats`; with routes, ``"routes"``:
            ``{"ENDPOINT, ...": that route's stats}``.
        """
        result: dict[str, Any] = dict(self._counts)
        result["endpoints"] = list(self.endpoints)
        result["down"] = [base_of(rpc) for rpc in self._health.endpoints_down() if rpc in self._rpc_endpoints]
        result["jobs"] = result["push"] = self._jobs.stats()  # "push": the old name, kept for one release
        result["dealer"] = self._dealer.stats()
        if self._routed:
            result["routes"] = {", ".join(names): routed.stats() for names, routed in self._routed.items()}
        return result

    def close(self, *, linger: Optional[float] = None) -> None:
        """Close every pooled socket of this process. Idempotent.

        :param linger: seconds queued jobs may take to flush (default: the
            client's ``linger``). Returns within about that even when no
            worker is reachable.
        """
        self._closed = True
        for routed in self._routed.values():
            routed.close(linger=linger)
        _close_pools(self._jobs, self._dealer, self._waits, linger)

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed(f"this Client of {list(self.endpoints)} is closed")
        if not _warned_event_loop and _in_event_loop():
            _warn_event_loop()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<zqsync.Client {list(self.endpoints)}>"


_warned_event_loop = False


def _in_event_loop() -> bool:
    """Whether this thread runs an asyncio event loop (asyncio is never imported for the check)."""
    asyncio = sys.modules.get("asyncio")
    return asyncio is not None and asyncio._get_running_loop() is not None


def _warn_event_loop() -> None:
    """Say once per process that a blocking call was made from a thread running an asyncio event loop."""
    global _warned_event_loop
    _warned_event_loop = True
    warnings.warn(
        "zqsync.Client blocks its caller: called from a coroutine, it stalls the asyncio event loop for the whole "
        "call. Use zqsync.aio.AsyncClient (await client.call(...)) or run it in a thread: "
        "await asyncio.to_thread(client.call, ...) (said once per process)",
        ZqsyncWarning, stacklevel=4,
    )


def _close_pools(push: SocketPool, dealer: SocketPool, long_polls: waits.Waits, linger: Optional[float] = None) -> None:
    """Close a client's job pool (queued jobs get ``linger``, default the client's), its long-poll
    channels and its rpc pool."""
    push.close(linger=linger)
    long_polls.close()
    dealer.close(linger=0 if linger is None else linger)


def _due(delay: Optional[float], eta: Optional[datetime.datetime]) -> Optional[float]:
    """The due time of a delayed job, epoch seconds, or ``None`` for a job to run now."""
    if delay is not None and eta is not None:
        raise ConfigurationError("give delay or eta, not both", setting="eta")
    if delay is not None:
        return time.time() + check_seconds("delay", delay)
    if eta is None:
        return None
    if not isinstance(eta, datetime.datetime) or eta.utcoffset() is None:
        raise ConfigurationError(f"eta must be an aware datetime (with a tzinfo), got {eta!r}", setting="eta")
    return eta.timestamp()


def job_request(task: str, args: Iterable[Any], kwargs: Optional[Mapping[str, Any]], *, confirm: bool,
                job_id: Optional[str], delay: Optional[float], eta: Optional[datetime.datetime], store_result: bool,
                deadline: Optional[float], send_timeout: Optional[float],
                expires: Union[float, datetime.datetime, None] = None,
                canvas: Optional[dict[str, Any]] = None) -> tuple[bytes, str, bool, Optional[float]]:
    """A job's frame from ``enqueue_with_options``' arguments (checked as it documents), with its id, whether it
    is confirmed (a delayed job is) and its checked ``send_timeout``; shared by the asyncio client. ``canvas``:
    a confirmed job's successors (``zqsync/worker/canvas.py``)."""
    job_id = new_id() if job_id is None else job_id
    options: dict[str, Any] = {"store": True} if store_result and not confirm else {}
    due = _due(delay, eta)
    if due is not None:
        confirm, options = True, {"due": due}
    kind = "confirm" if confirm else "job"
    budget = expiry(expires, deadline)
    if budget is not None and confirm:
        options["expires"], budget = time.time() + budget, None  # journaled: it outlives processes
    if canvas and confirm:
        options["canvas"] = canvas
    frame = envelope.encode_request(kind, job_id, _task_name(task), tuple(args), dict(kwargs or {}),
                                    options=options, deadline=budget)
    if send_timeout is not None:
        send_timeout = check_seconds("send_timeout", send_timeout, 0.0, inclusive=not confirm)
    return frame, job_id, confirm, send_timeout


def call_timeout(settings: ClientSettings, timeout: Optional[float]) -> float:
    """A call's deadline in seconds: ``timeout``, or the settings' ``call_timeout`` when ``None``.

    :raises ConfigurationError: ``timeout`` is not a finite number above 0.
    """
    return settings.call_timeout if timeout is None else check_seconds("timeout", timeout, inclusive=False)


def call_result(reply: envelope.Reply, counts: dict[str, int]) -> Any:
    """A call's ``reply`` as the task's return value (shared by the sync and asyncio clients).

    :raises RemoteError: the task failed (the matching subclass); counted in ``counts["call_errors"]``.
    """
    if reply.ok:
        return reply.result
    counts["call_errors"] += 1
    raise remote_error_of(reply)


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
    """A fresh `Client` from a pickled one's configuration."""
    return Client(endpoints, settings=settings, curve=curve)


def enqueue(task: str, *args: Any, **kwargs: Any) -> str:
    """`Client.enqueue` on `default_client`."""
    return default_client().enqueue(task, *args, **kwargs)


def call(task: str, *args: Any, **kwargs: Any) -> Any:
    """`Client.call` on `default_client`."""
    return default_client().call(task, *args, **kwargs)


def close_all(*, linger: Optional[float] = None) -> None:
    """Close every client of this process (for gunicorn's ``worker_exit``).

    :param linger: seconds each may spend flushing queued jobs.
    """
    for client in _common.live_clients():
        client.close(linger=linger)
