"""The intake of a direct-mode prefork child (``Supervisor(direct=True)``, ``zqsync worker --processes N --direct``).

The child is a standalone worker (``intake.StandaloneIntake``: CURVE, connection counts, the stopping
notice, drain and unbind) whose ROUTERs bind the listening sockets its supervisor holds
(``listeners.py``), through ``ZMQ_USE_FD``: the public pair, shared with its siblings, and its slot's own
pair. No message crosses the supervisor. Besides, as a supervised child does, it answers its siblings on
an admin socket and answers ``zqsync.stats`` for the whole worker (``fleet.py``), and it answers
``zqsync.endpoints`` with every slot's base port, which a client with ``expand_prefork`` turns into one
endpoint per child (``client/announce.py``).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import zmq

from ..errors import ConfigurationError
from ..settings import WorkerSettings
from .binding import configure_pair
from .intake import Keep, Report, StandaloneIntake, quiesce, serve_siblings, whole_worker_stats
from .listeners import DirectBackend, bind_inherited


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

    def open(self, context: zmq.Context, jobs: zmq.Socket, rpc: zmq.Socket, report: Report) -> str:
        self._context = context
        endpoint = super().open(context, jobs, rpc, report)
        serve_siblings(self, context, self.backend.directory, report)
        return endpoint

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
        """As a standalone worker; but retired by a rolling restart (the supervisor's ``READY.retiring``), its
        notice names no endpoint: its replacement already serves the same addresses, and a client that left
        them out would have none to send to while every child is replaced in turn."""
        assert self._peers is not None
        if self.ready_file and os.path.exists(f"{self.ready_file}.retiring"):
            self._peers.named = ""
        quiesce(self._peers, keep, also=(self._public_jobs,))
        if self.ready_file:  # a rolling restart waits for it (supervisor.py)
            with open(f"{self.ready_file}.drained", "w") as drained:
                drained.write("direct")
        return f"{self._peers.endpoint} and {self._public_jobs}"

    def stats(self, local: Report, report: Report) -> dict[str, Any]:
        """The whole worker's stats, gathered from every child (``fleet.py``; blocks the calling greenlet
        up to ``fleet.GATHER_TIMEOUT`` seconds for a child that does not answer)."""
        assert self._context is not None
        return whole_worker_stats(self._context, self.backend.directory, report)
