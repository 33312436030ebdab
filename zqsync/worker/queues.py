"""Named job queues of one worker (``--queue NAME[:CONCURRENCY]=ENDPOINT``), highest priority first.

Each queue binds a jobs (ROUTER, ``stopping.py``) socket of its own and runs its jobs in a
task pool of its own, so a flood on one queue never holds the slots of
another. A queue takes a job only when no queue above it has a job waiting
that it could start now; the worker's ``--bind`` jobs socket ranks last.
Queues take plain jobs; calls and confirmed jobs use the ``--bind`` endpoint.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import gevent
import gevent.pool
import zmq

from ..settings import QueueSpec
from ..wire.curve import server_options
from ..wire.endpoints import parse_endpoint
from .binding import bind, serve_clients
from .stopping import Peers

log = logging.getLogger(__name__)


class JobQueue:
    """One named queue: its socket, its pool and its receive loop.

    :param spec: name, concurrency (``None``: ``default_concurrency``) and endpoint.
    :param higher: the queues that rank above this one.
    """

    def __init__(self, spec: QueueSpec, default_concurrency: int, higher: list["JobQueue"]) -> None:
        self.name = spec.name
        self.spec = spec
        self.concurrency = spec.concurrency or default_concurrency
        self.pool = gevent.pool.Pool(self.concurrency)
        self.higher = list(higher)
        self.sock: Optional[zmq.Socket] = None
        self.endpoint = ""
        self.peers: Optional[Peers] = None

    def bind(self, context: zmq.Context, *, hwm: int, max_message_size: int,
             curve_secret_key: Optional[str], keepalive: tuple[float, float]) -> zmq.Socket:
        """Bind the queue's jobs (ROUTER) socket (its address is then `endpoint`), set up for
        clients with TCP keepalive ``(idle, interval)`` seconds (``binding.serve_clients``); returns it.

        :raises ConfigurationError: the address is taken or not this machine's (`.binding.bind`)."""
        host, port = parse_endpoint(self.spec.endpoint, allow_zero=True)
        sock = self.sock = context.socket(zmq.ROUTER)
        serve_clients(sock, keepalive)
        options: dict[int, object] = {zmq.LINGER: 1000, zmq.RCVHWM: hwm, zmq.MAXMSGSIZE: max_message_size}
        options.update(server_options(curve_secret_key) if curve_secret_key else {})
        for option, value in options.items():
            sock.setsockopt(option, value)
        if port:
            bind(sock, f"{host}:{port}")
        else:
            sock.bind_to_random_port(host, min_port=20000, max_port=60000)
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.peers = Peers(sock, self.endpoint)
        return sock

    def waiting(self) -> bool:
        """Whether a job waits on this queue and a slot is free to start it.

        Reads ``ZMQ_EVENTS`` through the green socket's ``get``, which passes
        the readiness on to the greenlet waiting in ``recv``; the plain
        ``getsockopt`` would consume the edge-triggered wakeup, and that
        receiver would sleep until zmq.green's 11.6 s safety timeout."""
        return bool(self.sock is not None and self.pool.free_count()
                    and int(self.sock.get(zmq.EVENTS)) & zmq.POLLIN)

    def receive(self, run: Callable[[bytes], None]) -> None:
        """Receive and run jobs, forever (the queue's receiver greenlet)."""
        assert self.sock is not None
        while True:
            self.pool.wait_available()
            yield_to_higher(self.higher)
            assert self.peers is not None
            frame = self.peers.receive()
            self.pool.spawn(run, frame)

    def stats(self) -> dict[str, object]:
        """``endpoint``, ``concurrency``, ``running`` (tasks in its pool) and ``waiting``: whether a job
        waits on its socket (how many, ZeroMQ does not say). Reads ``ZMQ_EVENTS`` as `waiting`."""
        waiting = self.sock is not None and bool(int(self.sock.get(zmq.EVENTS)) & zmq.POLLIN)
        return {"endpoint": self.endpoint, "concurrency": self.concurrency, "running": len(self.pool),
                "waiting": waiting}


def yield_to_higher(higher: list[JobQueue]) -> None:
    """Wait while a queue in ``higher`` has a job waiting that it can start."""
    while any(queue.waiting() for queue in higher):
        gevent.sleep(0.001)


def build_queues(specs: tuple[QueueSpec, ...], default_concurrency: int) -> list[JobQueue]:
    """The queues of ``specs``, each knowing those above it."""
    queues: list[JobQueue] = []
    for spec in specs:
        queues.append(JobQueue(spec, default_concurrency, queues))
    return queues
