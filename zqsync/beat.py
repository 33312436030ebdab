"""Periodic jobs: the schedules a registry declares, and ``zqsync beat``, the process that enqueues them.

A beat is only a client. For each tick of a schedule it enqueues a
confirmed job whose id is derived from the task name and the tick time
(`Periodic.job_id`). The job goes to that id's preferred worker, whose
journal acknowledges a second copy as a duplicate without running it, so
two beats, or a beat restarted over a tick it had already sent, never run a
tick twice, as long as they list the same workers (or, with one PostgreSQL
journal shared by the fleet, any of its workers) and the tick's ``done`` row
is still journaled (``--keep-done``, one hour by default).

Ticks are wall-clock times in UTC: ``every=N`` ticks at the multiples of
``N`` seconds since the epoch, and ``cron=`` at the times its expression
matches (``cronsim``, the ``beat`` extra).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, NamedTuple, Optional

from .errors import ConfigurationError, ZqsyncError

log = logging.getLogger(__name__)
#: What a beat does about the ticks it missed while down or late.
CATCH_UP = ("skip", "latest")
#: Ids of periodic jobs start with this.
ID_PREFIX = "beat-"


class Periodic(NamedTuple):
    """The schedule of one periodic task (see `zqsync.worker.Registry.periodic`).

    :ivar task: the task name.
    :ivar every: seconds between ticks, or ``None`` with ``cron``.
    :ivar cron: a five-field cron expression (UTC), or ``None`` with ``every``.
    :ivar catch_up: ``"skip"``: ticks missed while no beat ran are never sent;
        ``"latest"``: the most recent missed tick is sent, once.
    :ivar args: the job's positional arguments.
    :ivar kwargs: the job's keyword arguments.
    """

    task: str
    every: Optional[float]
    cron: Optional[str]
    catch_up: str
    args: tuple
    kwargs: dict

    @classmethod
    def build(cls, task: str, *, every: Optional[float] = None, cron: Optional[str] = None, catch_up: str = "skip",
              args: tuple = (), kwargs: Optional[dict] = None) -> "Periodic":
        """A checked schedule.

        :raises ConfigurationError: neither or both of ``every`` and ``cron``,
            ``every`` under 1 ms or not finite, a cron expression ``cronsim``
            rejects (or ``cronsim`` missing), or an unknown ``catch_up``.
        """
        if (every is None) == (cron is None):
            raise ConfigurationError(f"periodic task {task!r} needs exactly one of every= and cron=", setting="every")
        if every is not None and (isinstance(every, bool) or not isinstance(every, (int, float))
                                  or not math.isfinite(every) or every < 0.001):
            raise ConfigurationError(f"every must be a number of seconds >= 0.001, got {every!r}", setting="every")
        if catch_up not in CATCH_UP:
            raise ConfigurationError(f"catch_up must be one of {CATCH_UP}, got {catch_up!r}", setting="catch_up")
        periodic = cls(task, None if every is None else float(every), cron, catch_up, tuple(args), dict(kwargs or {}))
        if cron is not None:
            periodic._cron(0.0, reverse=False)  # parse it now: a bad expression fails at import, not in the beat
        return periodic

    def next_after(self, now: float) -> float:
        """The first tick strictly after ``now`` (epoch seconds)."""
        if self.every is not None:
            step = round(self.every * 1000)
            return (math.floor(now * 1000) // step + 1) * step / 1000.0
        return self._cron(now, reverse=False)

    def latest_at(self, now: float) -> float:
        """The last tick at or before ``now`` (epoch seconds)."""
        if self.every is not None:
            step = round(self.every * 1000)
            return (math.floor(now * 1000) // step) * step / 1000.0
        return self._cron(now + 1e-3, reverse=True)

    def _cron(self, now: float, *, reverse: bool) -> float:
        try:
            from cronsim import CronSim, CronSimError
        except ImportError:
            raise ConfigurationError("cron= needs the cronsim package: pip install 'zqsync[beat]'",
                                     setting="cron") from None
        start = datetime.fromtimestamp(now, timezone.utc)
        try:
            tick = next(iter(CronSim(str(self.cron), start, reverse=reverse)))
        except (CronSimError, StopIteration) as exc:
            raise ConfigurationError(f"bad cron expression {self.cron!r} for task {self.task!r}: {exc}",
                                     setting="cron") from None
        return (tick - datetime(1970, 1, 1, tzinfo=timezone.utc)) / timedelta(seconds=1)

    def job_id(self, tick: float) -> str:
        """The job id of ``tick``: ``beat-`` + 16 hex digits of the task name's SHA-256 + ``-`` + the tick in ms.

        The same for every beat, so a tick's copies are duplicates of one job."""
        digest = hashlib.sha256(self.task.encode()).hexdigest()[:16]
        return f"{ID_PREFIX}{digest}-{round(tick * 1000)}"


class Beat:
    """Enqueues each tick of a registry's periodic tasks as a confirmed job.

    :param schedules: the schedules (``registry.periodic_jobs.values()``).
    :param enqueue: ``enqueue(task, args, kwargs, job_id)``; raises
        `ZqsyncError` when the job was not confirmed.
    :param clock: wall-clock epoch seconds (replaceable in tests).
    :param wait: ``wait(seconds)`` sleeps until then or until `stop`
        (default: the stop event's ``wait``; replaceable in tests).
    :param schedule_file: a JSON file of each task's last handled tick (epoch seconds), read at
        `run` and rewritten (atomically, ``os.replace``) after each tick, as Celery beat keeps
        ``celerybeat-schedule``: a beat restarted after downtime counts and logs the ticks that passed
        while none ran. ``None``: a fresh start each time. An unreadable file is logged and ignored.
    """

    def __init__(self, schedules: list[Periodic], enqueue: Callable[[str, tuple, dict, str], Any], *,
                 clock: Callable[[], float] = time.time, wait: Optional[Callable[[float], Any]] = None,
                 schedule_file: Optional[str] = None) -> None:
        if not schedules:
            raise ConfigurationError("no periodic tasks: declare some with @registry.periodic(...)", setting="app")
        self.schedules = list(schedules)
        self.enqueue = enqueue
        self.clock = clock
        self.stopping = threading.Event()
        self.wait = wait or self.stopping.wait
        self.counters = {"ticks_sent": 0, "ticks_failed": 0, "ticks_skipped": 0}
        self.schedule_file = schedule_file
        self._handled: dict[str, float] = {}

    def run(self) -> None:
        """Send ticks until `stop`; blocks (``threading.Event.wait``, cooperative when monkey-patched)."""
        now = self.clock()
        self._handled = self._read_schedule()
        due = [self._first_due(periodic, now) for periodic in self.schedules]
        while not self.stopping.is_set():
            index = min(range(len(due)), key=due.__getitem__)
            wait = due[index] - self.clock()
            if wait > 0:
                self.wait(wait)
                continue
            periodic = self.schedules[index]
            tick, self._handled[periodic.task], due[index] = self._catch_up(periodic, due[index])
            if tick is not None:
                self._send(periodic, tick)
            self._write_schedule()

    def stop(self) -> None:
        """Make `run` return (safe from a signal handler or another thread)."""
        self.stopping.set()

    def _catch_up(self, periodic: Periodic, due: float) -> tuple[Optional[float], float, float]:
        """The tick to send now for ``due`` (or ``None``), the latest tick this handles, and the next one
        to wait for.

        On time (no later tick has passed yet), ``due`` itself. Late (a send blocked, the clock
        jumped, the process was stopped), the ticks from ``due`` to the latest passed one are
        skipped, counted and logged, all of them or, with ``catch_up="latest"``, all but the latest,
        which is sent once: no tick older than one period is ever sent."""
        latest = periodic.latest_at(self.clock())
        if latest <= due:
            return due, due, periodic.next_after(due)
        send = latest if periodic.catch_up == "latest" else None
        skipped = _ticks(periodic, due, latest) - (send is not None)
        if skipped:
            self.counters["ticks_skipped"] += skipped
            log.warning("task %r: skipped %d tick(s) that passed while the beat was late (%s to %s, catch_up=%r)",
                        periodic.task, skipped, _iso(due), _iso(latest), periodic.catch_up)
        return send, latest, periodic.next_after(latest)

    def _first_due(self, periodic: Periodic, now: float) -> float:
        """The first tick to handle: the one after the last handled (the schedule file), which
        `_catch_up` then finds late if ticks passed while no beat ran; on a fresh start, the next
        tick, or with ``catch_up="latest"`` the latest passed one."""
        last = self._handled.get(periodic.task)
        if last is not None and last <= now:
            return periodic.next_after(last)
        return periodic.latest_at(now) if periodic.catch_up == "latest" else periodic.next_after(now)

    def _read_schedule(self) -> dict[str, float]:
        if self.schedule_file is None or not os.path.exists(self.schedule_file):
            return {}
        try:
            with open(self.schedule_file) as source:
                data = json.load(source)
            return {str(task): float(tick) for task, tick in data["last_tick"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring the beat schedule file %s (%s): missed ticks are not counted this start",
                        self.schedule_file, exc)
            return {}

    def _write_schedule(self) -> None:
        if self.schedule_file is None:
            return
        temporary = f"{self.schedule_file}.tmp"
        try:
            with open(temporary, "w") as target:
                json.dump({"last_tick": self._handled}, target)
            os.replace(temporary, self.schedule_file)
        except OSError as exc:
            log.warning("could not write the beat schedule file %s: %s", self.schedule_file, exc)

    def _send(self, periodic: Periodic, tick: float) -> None:
        job_id = periodic.job_id(tick)
        try:
            self.enqueue(periodic.task, periodic.args, periodic.kwargs, job_id)
        except ZqsyncError as exc:
            self.counters["ticks_failed"] += 1
            log.error("task %r, tick %s (job %s) not confirmed: %s", periodic.task, _iso(tick), job_id, exc)
            return
        self.counters["ticks_sent"] += 1
        log.debug("task %r, tick %s sent as job %s", periodic.task, tick, job_id)


def _iso(tick: float) -> str:
    return datetime.fromtimestamp(tick, timezone.utc).isoformat()


def _ticks(periodic: Periodic, first: float, last: float, limit: int = 100_000) -> int:
    """How many ticks lie in ``[first, last]`` (at most ``limit``)."""
    if periodic.every is not None:
        return min(limit, round((last - first) / periodic.every) + 1)
    count, tick = 0, first
    while tick <= last and count < limit:
        count, tick = count + 1, periodic.next_after(tick)
    return count


__all__ = ["CATCH_UP", "Beat", "Periodic"]
