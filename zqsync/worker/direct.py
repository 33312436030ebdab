"""The intake of a direct-mode prefork child (``Supervisor(direct=True)``, ``zqsync worker --processes N``).

The child is a standalone worker (``intake.StandaloneIntake``: CURVE, connection counts, the stopping
notice, drain and unbind) whose ROUTERs bind the listening sockets its supervisor holds
(``listeners.py``), through ``ZMQ_USE_FD``: the public pair, shared with its siblings, and its slot's own
pair. No message crosses the supervisor. Besides, as a supervised child does, it answers its siblings on
an admin socket and answers ``zqsync.stats`` for the whole worker (``fleet.py``), and it answers
``zqsync.endpoints`` with every slot's base port, which a client with ``expand_prefork`` turns into one
endpoint per child (``client/announce.py``).

It keeps the router's liveness promises without a hop per message (``steal.py``, ``seats.py``): its hub
stamps its seat in the supervisor's shared table every ``STAMP_EVERY`` seconds (freshness, free slots); a
native relay thread steals its work for a free sibling while that stamp is stale (its hub is blocked); a
stolen-work ROUTER takes what siblings' relays steal for it; and it counts the plain jobs it reads and
ends, so the supervisor can count those a SIGKILLed child held.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import gevent
import gevent.pool
import zmq

from .._common import native_lock
from ..errors import ConfigurationError
from ..settings import WorkerSettings
from .binding import configure_pair
from .inline import Reader
from .intake import Keep, Report, StandaloneIntake, quiesce, serve_siblings, whole_worker_stats
from .listeners import DirectBackend, bind_inherited
from .seats import ACCOUNTED, ENDED, FREE, PID, STAMP_EVERY, TAKEN, TICK, WIDTH, now
from .steal import LINGER, Relay, stolen_endpoint


class DirectIntake(StandaloneIntake):
    """A direct-mode child: binds the supervisor's listening sockets of ``backend`` (module docstring).

    :param ready_file: the child's ready file; ``READY.drained`` is written once it stopped taking jobs.
    :raises ConfigurationError: named queues are configured (they need a single process).
    """

    def __init__(self, settings: WorkerSettings, backend: DirectBackend, ready_file: Optional[str]) -> None:
        if settings.queues:
            raise ConfigurationError("named queues need a single worker process (no --processes)", setting="queues")
        super().__init__(settings)
        self.backend, self.ready_file = backend, ready_file
        self._context: Optional[zmq.Context] = None
        self._public_jobs = ""
        self._lock = native_lock()  # every use of the jobs and rpc ROUTERs holds it (steal.py)
        self._row = backend.seat * WIDTH
        self._readers: list[Reader] = []
        self._relay: Optional[Relay] = None
        self._rpc: Optional[zmq.Socket] = None
        self._slots: Optional[gevent.pool.Pool] = None
        self._watchers: list[Any] = []
        self._serving = True

    def open(self, context: zmq.Context, jobs: zmq.Socket, rpc: zmq.Socket, report: Report) -> str:
        self._context, self._rpc = context, rpc
        endpoint = super().open(context, jobs, rpc, report)
        serve_siblings(self, context, self.backend.directory, report)
        self.stolen = context.socket(zmq.ROUTER)
        self.stolen.setsockopt(zmq.LINGER, LINGER)  # the last answers to siblings' relays still go out
        self.stolen.bind(stolen_endpoint(self.backend.directory, os.getpid()))
        self.sockets.append(self.stolen)
        self.backend.seats.ints[self._row + PID] = os.getpid()
        self._relay = Relay(context, jobs, rpc, self._lock, self.backend.seats, self.backend.seat,
                            self.backend.directory, self._wake_hub)
        return endpoint

    def reader(self, sock: zmq.Socket) -> Reader:
        """Its relay also uses the jobs and rpc sockets: their readers hold the lock (``steal.py``)."""
        reader = Reader(sock, self._lock if sock is not self.stolen else None)
        self._readers.append(reader)
        return reader

    def start(self, slots: gevent.pool.Pool, admissions: Any) -> None:
        """Stamp the seat every ``STAMP_EVERY`` seconds (a libev timer: no greenlet), and start the relay."""
        assert self._relay is not None
        self._slots = slots
        loop = gevent.get_hub().loop
        stamp, wake = loop.timer(0.0, STAMP_EVERY), loop.async_()
        stamp.start(self._stamp)
        wake.start(self._look_again)
        self._watchers = [stamp, wake]
        self._stamp()
        self._relay.start()

    def _stamp(self) -> None:
        seats, row = self.backend.seats, self._row
        seats.floats[row + TICK] = now()
        seats.ints[row + FREE] = self._slots.free_count() if self._serving and self._slots is not None else 0

    def _wake_hub(self) -> None:
        """From the relay's thread: the hub's parked readers must look at their sockets (`_look_again`)."""
        if self._watchers:
            self._watchers[1].send()

    def _look_again(self) -> None:
        """In the hub, after the relay used the sockets: remember the clients whose jobs it stole (for the
        stopping notice), and let every parked reader look for input whose announcement it consumed."""
        assert self._relay is not None and self._peers is not None
        senders = self._relay.senders
        while senders:
            self._peers.frame([senders.popleft(), b""])
        for reader in self._readers:
            reader.kick()

    def read_job(self, reader: Reader) -> Optional[bytes]:
        frame = super().read_job(reader)
        self.backend.seats.ints[self._row + TAKEN] += 1
        return frame

    def took_stolen(self) -> None:
        self.backend.seats.ints[self._row + TAKEN] += 1

    def count_plain(self, run: Callable[[bytes], None]) -> Callable[[bytes], None]:
        """``run`` that counts, in the seat, each plain job through its attempt (``seats.py``)."""
        ints, at = self.backend.seats.ints, self._row + ENDED

        def counted(frame: bytes) -> None:
            try:
                run(frame)
            finally:
                ints[at] += 1

        return counted

    def stop_offering(self) -> None:
        self._serving = False
        self._stamp()

    def _bind(self, jobs: zmq.Socket, rpc: zmq.Socket) -> tuple[str, str]:
        """Bind the public pair and the slot's pair; the stopping notice names the slot's jobs endpoint
        (where a client that expanded the slots sent)."""
        configure_pair(jobs, rpc, self.backend.endpoint, curve_secret_key=self.settings.curve_secret_key,
                       keepalive=self.settings.keepalive)
        bound = [bind_inherited(sock, fd, endpoint)
                 for sock, (fd, endpoint) in zip((jobs, rpc, jobs, rpc), self.backend.bindings())]
        self._public_jobs = bound[0]
        return self.backend.endpoint, bound[2]

    def describe(self) -> str:
        slot = self.backend.slots[self.backend.slot]
        return f"on {self.endpoint} (rpc on port +1) and slot {self.backend.slot}'s ports {slot}, {slot + 1}, direct"

    def builtins(self) -> dict[str, Callable[..., Any]]:
        return {"zqsync.endpoints": lambda: {"slots": list(self.backend.slots)}}

    def stop_taking_jobs(self, keep: Keep) -> str:
        """As a standalone worker, its notice naming the public jobs endpoint besides the slot's (``also``); but
        retired by a rolling restart (the supervisor's ``READY.retiring``), its notice names no endpoint: its
        replacement already serves the same addresses, and a client that left them out would have none to send
        to while every child is replaced in turn."""
        assert self._peers is not None and self._relay is not None
        self._relay.stop_stealing()
        self._look_again()
        if self.ready_file and os.path.exists(f"{self.ready_file}.retiring"):
            self._peers.named = ""
        else:  # a client that did not expand the slots sent to the public endpoint: it must find that one named
            self._peers.also = (self._public_jobs,)
        quiesce(self._peers, keep, also=(self._public_jobs,))
        if self.ready_file:  # a rolling restart waits for it (supervisor.py)
            with open(f"{self.ready_file}.drained", "w") as drained:
                drained.write("direct")
        return f"{self._peers.endpoint} and {self._public_jobs}"

    def unwatch(self, sock: zmq.Socket) -> None:
        if sock is self._rpc and self._relay is not None:  # it is about to close: the relay sends no more on it
            self._relay.stop()
        super().unwatch(sock)

    def close(self) -> None:
        """As a standalone intake, after the relay has ended; the seat records that this child accounted
        for its jobs itself (the supervisor then counts none lost with it)."""
        if self._relay is not None:
            self._relay.stop()
        for watcher in self._watchers:
            watcher.stop()
        self._watchers = []
        self.backend.seats.ints[self._row + ACCOUNTED] = 1
        if self.stolen is not None:
            self.stolen.close()  # with its linger, not the intake's 0
        super().close()

    def stats(self, local: Report, report: Report) -> dict[str, Any]:
        """The whole worker's stats, gathered from every child (``fleet.py``; blocks the calling greenlet
        up to ``fleet.GATHER_TIMEOUT`` seconds for a child that does not answer)."""
        assert self._context is not None
        return whole_worker_stats(self._context, self.backend.directory, report)
