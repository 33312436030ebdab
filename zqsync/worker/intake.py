"""How work reaches a worker: its intake, a strategy chosen once when the worker is made.

The worker's core (``server.py``: task slots, receive loops, the stop sequence, stats) never asks
which mode it runs in; everything that differs lives here (huey's ``Environment`` classes):

`StandaloneIntake`
    binds the jobs (ROUTER) and rpc (ROUTER) sockets on PORT and PORT+1 (``binding.py``), runs the
    CURVE authenticator, counts TCP connections with socket monitors, remembers which clients sent
    jobs, and on a stop sends them the stopping notice, reads what they still send, and unbinds
    (``stopping.py``).
`SupervisedIntake`
    a prefork child (``supervisor.py``): connects a PULL and a ROUTER to its private ``ipc://``
    backends (rpc requests carry the router's routing id in front of the client's), offers work with
    credits (``dispatch.py``), answers its siblings on an admin socket and gathers the whole worker's
    stats over theirs (``fleet.py``); on a stop it reads its backend up to the router's end-of-jobs
    mark and writes how many jobs it read for the supervisor's count.

Both are driven by the core in the same order: `Intake.open` once the core has made the two
sockets; `Intake.start` when it serves; `Intake.read_job` in the jobs receiver;
`Intake.took` when the work of a credit started; `Intake.stop_offering`,
`Intake.stop_taking_jobs` and `Intake.close` on a stop.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Optional, Union

import gevent
import gevent.event
import gevent.pool
import zmq
import zmq.utils.monitor

from ..errors import ConfigurationError
from ..settings import WorkerSettings
from . import fleet
from .auth import GeventAuthenticator, curve_state
from .binding import bind_pair
from .dispatch import ADMIT, CREDITS_MAX, END_OF_JOBS, SLOT
from .inline import Reader
from .listeners import DirectBackend
from .stopping import DRAIN_LIMIT, DRAIN_QUIET, READ_FIRST, Peers, drain

log = logging.getLogger(__name__)


Report = Callable[[], dict[str, Any]]
Keep = Callable[[bytes], None]


def quiesce(peers: Peers, keep: Keep, also: tuple[str, ...] = ()) -> None:
    """Tell every client that sent on a bound jobs socket that this worker stops, read what they still
    send (into ``keep``) until they fall quiet, then unbind (``peers.endpoint`` and the endpoints ``also``
    bound) and read the socket's queue to the end (``stopping.py``). Blocks the calling greenlet, at most
    twice ``DRAIN_LIMIT`` seconds, and ``READ_FIRST`` before the notice."""
    drain(peers.receive, peers.sock, keep, quiet=DRAIN_QUIET, limit=READ_FIRST, pause=gevent.sleep)
    log.info("stopping: told %d job client(s) of %s", peers.notify_all(), peers.endpoint)
    drain(peers.receive, peers.sock, keep, quiet=DRAIN_QUIET, limit=DRAIN_LIMIT, pause=gevent.sleep)
    for endpoint in (peers.endpoint, *also):
        peers.sock.unbind(endpoint)
    drain(peers.receive, peers.sock, keep, quiet=DRAIN_QUIET, limit=DRAIN_LIMIT, pause=gevent.sleep)


class Intake:
    """The part of a worker that depends on how work reaches it (see the module docstring)."""

    #: Frames in front of the body of an rpc message.
    envelope = 1
    #: The jobs socket's type.
    jobs_type = zmq.ROUTER

    def __init__(self) -> None:
        #: Sockets and greenlets of its own (a task's fork disowns and kills them in the child).
        self.sockets: list[zmq.Socket] = []
        self.greenlets: list[gevent.Greenlet] = []
        #: Counters merged into the worker's local stats.
        self.connections: dict[str, int] = {}
        self.endpoint = ""
        #: A socket of work stolen for this worker by a blocked sibling's relay (direct prefork: ``steal.py``).
        self.stolen: Optional[zmq.Socket] = None

    def open(self, context: zmq.Context, jobs: zmq.Socket, rpc: zmq.Socket, report: Report) -> str:
        """Bind or connect ``jobs`` and ``rpc``; returns the endpoint the worker is known by.
        ``report()`` gives this process's ``{"stats", "samples"}`` (for siblings asking)."""
        raise NotImplementedError

    def describe(self) -> str:
        """Where the worker serves, for its startup log line."""
        raise NotImplementedError

    def builtins(self) -> dict[str, Callable[..., Any]]:
        """The ``zqsync.*`` calls of its own, by name, added to the worker's."""
        return {}

    def reader(self, sock: zmq.Socket) -> Reader:
        """The `Reader` of one of its sockets (the jobs, rpc or stolen-work socket), made once the worker serves."""
        return Reader(sock)

    def start(self, slots: gevent.pool.Pool, admissions: Any) -> None:
        """The worker starts serving, with these task slots and admission places."""

    def count_plain(self, run: Callable[[bytes], None]) -> Callable[[bytes], None]:
        """The function that runs a plain job (``Scheduler.run_plain``), counting as this intake needs."""
        return run

    def took_stolen(self) -> None:
        """A plain job stolen for this worker was read from the `stolen` socket (hot path only when stealing)."""

    def read_job(self, reader: Reader) -> Optional[bytes]:
        """Read one job frame from the jobs socket (blocks the calling greenlet); ``None``: a control
        message, no job."""
        raise NotImplementedError

    def took(self, kind: Optional[bytes]) -> None:
        """The work of a ``kind`` credit (``dispatch.py``) has started (hot path: cheap)."""

    def stop_offering(self) -> None:
        """Stop asking for work (the worker is stopping)."""

    def stop_taking_jobs(self, keep: Keep) -> str:
        """Unbind or disconnect the jobs socket, every job still readable passed to ``keep``; returns
        where the jobs came from, for the log. Blocks the calling greenlet."""
        raise NotImplementedError

    def unwatch(self, sock: zmq.Socket) -> None:
        """``sock`` is about to close: stop watching it."""

    def stats(self, local: Report, report: Report) -> dict[str, Any]:
        """The answer to ``zqsync.stats``, from this process's ``local()`` stats (and ``report()``)."""
        return local()

    def close(self) -> None:
        """Kill its greenlets and close its sockets (the worker has stopped)."""
        gevent.killall(self.greenlets)
        for sock in self.sockets:
            sock.close(linger=0)


class StandaloneIntake(Intake):
    """A worker on its own: binds ``settings.bind`` (see the module docstring)."""

    def __init__(self, settings: WorkerSettings) -> None:
        super().__init__()
        self.settings = settings
        self._authenticator: Any = None
        self._peers: Optional[Peers] = None
        self._watched: list[zmq.Socket] = []

    def open(self, context: zmq.Context, jobs: zmq.Socket, rpc: zmq.Socket, report: Report) -> str:
        if self.settings.allow_client_keys:
            self._authenticator = GeventAuthenticator(context, self.settings.allow_client_keys)
            self._authenticator.start()
        self.endpoint, jobs_endpoint = self._bind(jobs, rpc)
        self._peers = Peers(jobs, jobs_endpoint)
        self._watch_connections(jobs, "jobs")
        self._watch_connections(rpc, "rpc")
        return self.endpoint

    def _bind(self, jobs: zmq.Socket, rpc: zmq.Socket) -> tuple[str, str]:
        """Bind both sockets; returns the worker's base endpoint and the jobs endpoint its notices name."""
        endpoint = bind_pair(jobs, rpc, self.settings.bind, curve_secret_key=self.settings.curve_secret_key,
                             keepalive=self.settings.keepalive)
        return endpoint, jobs.getsockopt_string(zmq.LAST_ENDPOINT)

    def describe(self) -> str:
        return f"on {self.endpoint} (rpc on port +1), {curve_state(self._authenticator)}"

    def _watch_connections(self, sock: zmq.Socket, name: str) -> None:
        """Count TCP connections accepted and lost per socket: the peer-side view of client
        socket reuse (few connections) and discard (a disconnection)."""
        monitor = sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self.sockets.append(monitor)
        self._watched.append(sock)
        keys: dict[int, str] = {
            int(zmq.EVENT_ACCEPTED): f"connections_{name}", int(zmq.EVENT_DISCONNECTED): f"disconnections_{name}",
        }
        for key in keys.values():
            self.connections[key] = 0

        def watch() -> None:
            try:
                while True:
                    event = zmq.utils.monitor.recv_monitor_message(monitor)
                    key = keys.get(event["event"])
                    if key:
                        self.connections[key] += 1
            finally:
                monitor.close(linger=0)

        self.greenlets.append(gevent.spawn(watch))

    def read_job(self, reader: Reader) -> Optional[bytes]:
        assert self._peers is not None
        return self._peers.frame(reader.recv_multipart())

    def stop_taking_jobs(self, keep: Keep) -> str:
        assert self._peers is not None
        quiesce(self._peers, keep)
        return self._peers.endpoint

    def unwatch(self, sock: zmq.Socket) -> None:
        if sock in self._watched:
            self._watched.remove(sock)
            sock.disable_monitor()

    def close(self) -> None:
        super().close()
        for sock in list(self._watched):
            self.unwatch(sock)
        if self._authenticator is not None:
            self._authenticator.stop()


class SupervisedIntake(Intake):
    """A prefork child: connects to the router's ``backend`` pair ``(jobs, rpc)`` (see the module docstring).

    :param endpoint: the supervisor's public endpoint (the worker's name in the journal).
    :param ready_file: the child's ready file; on a stop, ``READY.drained`` gets the jobs it read.
    :raises ConfigurationError: named queues are configured (they need a single process).
    """

    envelope = 2
    jobs_type = zmq.PULL

    def __init__(self, backend: tuple[str, str], endpoint: str, ready_file: Optional[str],
                 queues: tuple[Any, ...] = ()) -> None:
        super().__init__()
        if queues:
            raise ConfigurationError("named queues need a single worker process (no --processes)", setting="queues")
        self.backend, self.endpoint, self.ready_file = backend, endpoint, ready_file
        self._directory = fleet.admin_dir(backend)
        self._context: Optional[zmq.Context] = None
        self._jobs: Optional[zmq.Socket] = None
        self._credits: Optional[zmq.Socket] = None
        # Set when the work of the last slot / admit credit was received and started (dispatch.py).
        self._taken = {SLOT: gevent.event.Event(), ADMIT: gevent.event.Event()}
        self._started = {SLOT: 0, ADMIT: 0}  # pieces of work started since the offering loop last looked
        self._started_total = {SLOT: 0, ADMIT: 0}  # and since the child began: its credit messages say
        self._offering: list[gevent.Greenlet] = []
        self._jobs_read = 0  # jobs read from the backend (its credit messages say)
        self._jobs_ended = False  # END_OF_JOBS was read: the router sends no more

    def open(self, context: zmq.Context, jobs: zmq.Socket, rpc: zmq.Socket, report: Report) -> str:
        self._context, self._jobs = context, jobs
        jobs.connect(self.backend[0])
        rpc.connect(self.backend[1])
        serve_siblings(self, context, self._directory, report)
        self._credits = context.socket(zmq.PUSH)
        self._credits.connect(f"ipc://{self._directory}/credits")
        self.sockets.append(self._credits)
        return self.endpoint

    def describe(self) -> str:
        return f"behind the supervisor's {self.endpoint}"

    def start(self, slots: gevent.pool.Pool, admissions: Any) -> None:
        self._offering = [gevent.spawn(self._offer_work, SLOT, slots), gevent.spawn(self._offer_work, ADMIT, admissions)]
        self.greenlets += self._offering

    def _offer_work(self, kind: bytes, pool: Any) -> None:
        """Keep up to `CREDITS_MAX` ``kind`` credits (``dispatch.py``)
        outstanding, never more than ``pool`` has free slots.

        After work of its credits has started, it sends one message that both
        acknowledges it (the router prefers children that acknowledge promptly)
        and carries the new credits, possibly none. The receivers count the
        start right after running or spawning that work, and gevent runs
        callbacks in order, so the task runs before this greenlet wakes: a task
        that blocks the hub from its start blocks the acknowledgement too.
        """
        assert self._credits is not None
        name, taken = self.backend[0].encode(), self._taken[kind]
        outstanding = 0
        while True:
            outstanding = max(0, outstanding - self._started[kind])
            self._started[kind] = 0
            room = max(0, min(CREDITS_MAX, pool.free_count()) - outstanding)
            self._credits.send_multipart([name, kind, b"%d" % room, b"%d" % self._jobs_read,
                                          b"%d" % self._started_total[kind]])
            outstanding += room
            if outstanding:
                taken.wait()
                taken.clear()
            else:
                pool.wait_available()

    def read_job(self, reader: Reader) -> Optional[bytes]:
        return self._keep(reader.recv())

    def _keep(self, frame: bytes) -> Optional[bytes]:
        if frame == END_OF_JOBS:  # the router sends no more (dispatch.py)
            self._jobs_ended = True
            return None
        self._jobs_read += 1
        return frame

    def took(self, kind: Optional[bytes]) -> None:
        if kind is not None:
            self._started[kind] += 1
            self._started_total[kind] += 1
            self._taken[kind].set()

    def stop_offering(self) -> None:
        gevent.killall(self._offering)

    def stop_taking_jobs(self, keep: Keep) -> str:
        """Read the backend up to the router's `END_OF_JOBS` (at most ``DRAIN_LIMIT`` seconds),
        disconnect, and write how many jobs were read (the supervisor counts what it sent and this did not read)."""
        assert self._jobs is not None

        def kept(frame: bytes) -> None:
            job = self._keep(frame)
            if job is not None:
                keep(job)

        drain(self._jobs.recv, self._jobs, kept, quiet=DRAIN_LIMIT, limit=DRAIN_LIMIT, pause=gevent.sleep,
              done=lambda: self._jobs_ended)
        if not self._jobs_ended:
            log.warning("stopping: no end of jobs from the supervisor within %.0f s; it counts the jobs "
                        "it sent here that were not read as lost", DRAIN_LIMIT)
        self._jobs.disconnect(self.backend[0])
        if self.ready_file:
            with open(f"{self.ready_file}.drained", "w") as drained:
                drained.write(str(self._jobs_read))
        return "the supervisor"

    def stats(self, local: Report, report: Report) -> dict[str, Any]:
        """The whole worker's stats, gathered from every child (``fleet.py``; blocks the calling greenlet
        up to ``fleet.GATHER_TIMEOUT`` seconds for a child that does not answer)."""
        assert self._context is not None
        return whole_worker_stats(self._context, self._directory, report)


def serve_siblings(intake: Intake, context: zmq.Context, directory: str, report: Report) -> None:
    """Bind this child's admin socket in the supervisor's ``directory`` and answer its siblings' stats
    requests with ``report()`` from a greenlet of ``intake`` (``fleet.py``)."""
    admin = context.socket(zmq.ROUTER)
    admin.bind(fleet.admin_endpoint(directory, os.getpid()))
    intake.sockets.append(admin)
    intake.greenlets.append(gevent.spawn(fleet.serve_admin, admin, report))


def whole_worker_stats(context: zmq.Context, directory: str, report: Report) -> dict[str, Any]:
    """The stats of every child of the supervisor whose private directory is ``directory``, merged
    (``fleet.py``; blocks the calling greenlet up to ``fleet.GATHER_TIMEOUT`` seconds)."""
    return fleet.merge(fleet.gather(context, directory, report()), fleet.read_supervisor_file(directory))


def intake_for(settings: WorkerSettings, backend: Union[None, tuple[str, str], DirectBackend],
               ready_file: Optional[str]) -> Intake:
    """The intake of a worker: standalone without a ``backend``; a direct-mode child with a
    `DirectBackend` (``direct.py``); else supervised, connecting to the
    ``backend`` pair.

    :raises ConfigurationError: named queues under a supervisor.
    """
    if backend is None:
        return StandaloneIntake(settings)
    if isinstance(backend, DirectBackend):
        from .direct import DirectIntake

        return DirectIntake(settings, backend, ready_file)
    return SupervisedIntake(backend, settings.bind, ready_file, settings.queues)
