"""The state of a worker and its stats: the base of `Worker`.

`Core` makes the task slots, the call pools, the admission places, the runner and the
scheduler, and answers ``zqsync.stats``; the receive loops (``receiving.py``), the stop sequence
(``shutdown.py``) and serving (``server.py``) build on it. What depends on how work reaches the worker
is its intake's (``intake.py``).
"""

from __future__ import annotations

import collections
import logging
import os
import time
from typing import Any, Callable, Optional, Union

import gevent
import gevent.event
import gevent.pool
import zmq

from .. import _common, fdlimit
from ..logs import RateLimitedLog
from ..settings import WorkerSettings
from .admission import ADMISSIONS, HELD_CONFIRMS, Admissions, HeldConfirms
from .inline import Reader, TaskSlots
from .intake import Intake, intake_for
from .listeners import DirectBackend
from .queues import build_queues
from .registry import Registry
from .runner import Runner
from .scheduler import build_scheduler
from .watchdog import Watchdog

#: The worker's log (one logger for every module of the worker core, named as before the split).
log = logging.getLogger("zqsync.worker.server")

#: Counters of what a stop refused or discarded (``zqsync.stats``).
STOP_COUNTERS = ("jobs_discarded_on_stop", "calls_refused_on_stop", "confirms_ignored_on_stop", "tasks_killed_on_stop")
#: Calls waiting for a task slot at once; past it the rpc socket is not read until one starts.
WAITING_CALLS = 1000
#: The worker's own ``zqsync.*`` calls answered at once (they need no task slot).
ADMIN_CALLS = 64
#: ``zqsync.result`` long-polls waiting at once, apart from ADMIN_CALLS: a client multiplexes any number
#: on one connection (``client/waits.py``), and each only sleeps on an event (``status.py``).
LONG_POLLS = 10_000


class Core:
    """A worker's state and stats (the parameters are `Worker`'s)."""

    jobs: zmq.Socket
    rpc: zmq.Socket
    #: The readers of the jobs and rpc sockets, and of the intake's stolen-work socket if it has one.
    _readers: tuple[Reader, ...]
    #: Runs a plain job in a slot (the scheduler's, counted as the intake needs: ``Intake.count_plain``).
    _run_plain: Callable[[bytes], None]

    def __init__(
        self,
        registry: Registry,
        *,
        settings: Optional[WorkerSettings] = None,
        ready_file: Optional[str] = None,
        parent_pid: Optional[int] = None,
        backend: Union[None, tuple[str, str], DirectBackend] = None,
        **overrides: Any,
    ) -> None:
        self.settings = (settings or WorkerSettings()).replace(**overrides)
        self.registry = registry
        self.bind_address = self.settings.bind
        self.concurrency = self.settings.concurrency
        self.graceful_timeout = self.settings.graceful_timeout
        self.ready_file = ready_file
        self.max_message_size = self.settings.max_message_size
        self.hwm = self.settings.hwm
        self.parent_pid = parent_pid
        self.curve_secret_key = self.settings.curve_secret_key
        self.intake: Intake = intake_for(self.settings, backend, ready_file)
        self.endpoint: Optional[str] = None
        self.watchdog = Watchdog(hard_grace=self.settings.hard_grace)
        self.runner = Runner(registry, builtins={"zqsync.stats": self.stats, "zqsync.ping": lambda: "pong"},
                             watchdog=self.watchdog, remote_tracebacks=self.settings.remote_tracebacks)
        self.runner.counters.update(dict.fromkeys(STOP_COUNTERS, 0))
        self.identities: collections.Counter[bytes] = collections.Counter()
        self.started_at = time.time()
        self._slots = TaskSlots(self.concurrency)
        self.queues = build_queues(self.settings.queues, self.concurrency)
        self._calls = gevent.pool.Group()
        self._stolen: collections.deque[bytes] = collections.deque()  # stolen plain jobs waiting for a slot
        self._stolen_ready = gevent.event.Event()  # set when one is added (receiving.py)
        self._stolen_starter: list[gevent.Greenlet] = []  # the greenlet that starts them
        self._waiting = gevent.pool.Pool(WAITING_CALLS)
        self._admin = gevent.pool.Pool(ADMIN_CALLS)
        self._long_polls = gevent.pool.Pool(LONG_POLLS)
        self._backlog: collections.deque[bytes] = collections.deque()
        self._stopping = False
        self._replied_at = 0.0
        self._admissions = Admissions(ADMISSIONS)
        self._held = HeldConfirms(HELD_CONFIRMS)
        self._shed_log = RateLimitedLog(log)
        self._admitter: Optional[gevent.Greenlet] = None  # admits the held confirms (_admit_held)
        self.runner.counters["confirms_shed"] = 0
        self.runner.counters["fd_exhausted"] = 0  # server.py's looks that found this process out of descriptors
        self.scheduler = build_scheduler(
            self.runner, self._slots, self.settings.journal_url, synchronous=self.settings.journal_sync,
            busy_timeout=self.settings.journal_busy_timeout, lease=self.settings.journal_lease, keep_done=self.settings.keep_done,
            keep_dead=self.settings.keep_dead,
        )
        self.runner.builtins.update(self.scheduler.book.builtins())
        self.runner.builtins.update(self.intake.builtins())
        self._signals: list[int] = []
        self._stop_deadline: Optional[float] = None
        self._greenlets: list[gevent.Greenlet] = []
        self._receivers: list[gevent.Greenlet] = []
        self._queue_receivers: list[gevent.Greenlet] = []
        self._context: Optional[zmq.Context] = None
        self._sockets: list[zmq.Socket] = []

    def stats(self) -> dict[str, Any]:
        """Counters for ``zqsync.stats`` calls: this process's, or under a prefork supervisor the whole worker's.

        Standalone: `local_stats`. Under a supervisor, every child's
        local stats gathered over their admin sockets (``fleet.py``; blocks
        the calling greenlet up to ``fleet.GATHER_TIMEOUT``, 1.0 s, for a
        child that does not answer) and merged:

        - every counter of `local_stats` (``jobs_*``, ``plain_received``,
          ``confirmed_*``, ``calls_*``, ``in_flight``, ...): the sum over the
          children that answered;
        - ``durations``: per task and ``"*"``, ``count`` and ``p50``/``p90``/``p99``
          seconds over the children's merged samples;
        - ``identities_by_pid`` and ``rate_limited`` (summed per key), ``identities`` and ``clients`` (concatenated);
        - ``pid``, ``uptime``, ``state`` and ``tasks``: those of the child that answered;
        - ``supervisor``: ``{"pid", "started" (epoch seconds), "uptime" (seconds),
          "processes" (configured), "restarts", "jobs_lost_in_children"}`` (plain jobs
          routed to children that exited without reading them: ``supervisor.py``);
        - ``children``: one entry per child, sorted by pid: ``{"pid", "state",
          "uptime", "in_flight", "counters": {its counters}, "durations"}``;
          ``state`` is ``up``, ``busy`` (every slot taken), ``stopping`` or
          ``unreachable`` (no answer within 1.0 s: its hub is blocked, or it is
          stopped; then only ``pid`` and ``state`` are meaningful);
        - ``unreachable``: how many children did not answer.
        """
        return self.intake.stats(self.local_stats, self._report)

    def _report(self) -> dict[str, Any]:
        return {"stats": self.local_stats(), "samples": self.runner.durations.samples()}

    def _state(self) -> str:
        if self._stopping:
            return "stopping"
        return "busy" if not self._slots.free_count() else "up"

    def local_stats(self) -> dict[str, Any]:
        """This process's counters.

        :returns: the runner's counters (see below), ``pid``, ``uptime`` (seconds),
            ``state`` (``up``, ``busy``: every slot taken, ``stopping``), ``tasks`` (names),
            ``identities_by_pid``: ``{client pid: distinct socket identities
            seen on rpc}``, ``identities`` (distinct rpc identities, as str), ``long_polls``
            (``zqsync.result`` calls waiting now),
            when the worker binds its own sockets, ``connections_jobs`` /
            ``connections_rpc`` and ``disconnections_jobs`` /
            ``disconnections_rpc``: TCP connections accepted and lost since start;
            ``nofile``: its ``RLIMIT_NOFILE`` ``{"soft", "hard"}`` (``-1``: unlimited);
            ``durations``: per task and ``"*"``, ``count`` and ``p50``/``p90``/``p99``
            seconds over recent runs; ``clients``: the stats of the
            zqsync clients that tasks in this process use; and ``queues``:
            per named queue, its ``endpoint``, ``concurrency``, ``running`` tasks and ``waiting``
            (whether a job waits on its socket); ``queued`` and ``delayed``: the jobs held here and not
            started yet (``Scheduler.depth``);
            ``rate_limited``: per task with a ``rate_limit`` that has run here, how many of its jobs
            wait for their turn now (``ratelimit.py``).

        Job counters: ``jobs_received`` counts every job this process took in,
        ``plain_received`` (on the jobs socket) plus ``confirmed_accepted``
        (newly journaled; ``confirmed_received`` also counts duplicates and
        refusals); ``jobs_replayed`` the journaled jobs it took over from a
        process that is gone. Each ends as ``jobs_succeeded``, ``jobs_failed``
        (``jobs_dead`` if it had retries), ``unknown_task`` or
        ``jobs_discarded_on_stop``; ``jobs_retried`` counts failed attempts
        run again. ``confirms_shed`` counts confirmed jobs left unacknowledged because the hold of those
        waiting for an admission place was full (``admission.py``; their clients send them again).
        ``fd_exhausted`` counts the looks, one a second, that found this process out of file
        descriptors (``fdlimit.look``; new clients cannot connect meanwhile).
        ``calls_received`` = ``calls_succeeded`` + ``calls_failed``
        (+ those in flight); ``timed_out`` counts both kinds.
        """
        by_pid: collections.Counter[str] = collections.Counter()
        for identity in self.identities:
            parts = identity.split(b"-")
            by_pid[parts[1].decode() if len(parts) == 3 and parts[0] == b"zq" else "?"] += 1
        return {
            **self.runner.counters,
            "pid": os.getpid(),
            "uptime": time.time() - self.started_at,
            "state": self._state(),
            "tasks": self.registry.names(),
            "identities_by_pid": dict(by_pid),
            "identities": [identity.decode("utf-8", "replace") for identity in self.identities],
            "long_polls": len(self._long_polls),
            **self.intake.connections,
            "nofile": fdlimit.limits(),
            "durations": self.runner.durations.percentiles(),
            "clients": [client.stats() for client in _common.live_clients()],
            "queues": {queue.name: queue.stats() for queue in self.queues},
            "rate_limited": self.scheduler.limits.stats(),
            **self.scheduler.depth(),
        }

    def _pools(self) -> list[gevent.pool.Pool]:
        return [self._slots, *(queue.pool for queue in self.queues)]

    def _running(self) -> int:
        return sum(len(pool) for pool in self._pools())
