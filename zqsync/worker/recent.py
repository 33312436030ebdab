"""The worker's memory of its recent jobs, plain and confirmed: what ran, with what, and how it ended.

The journal keeps confirmed jobs; a plain job leaves no trace once it ends (unless its result is
kept). So that the dashboard can list plain jobs too, each worker process keeps in memory the last
`PER_TASK` outcomes of every task it runs (one ring per task: a flood of one task never pushes
another's failures out), each a short summary: id, task, arguments and result as short reprs
(at most `TEXT` characters), the error's ``Type: message``, attempts and times. Under a flood
only a sample of successes is kept (`SAMPLE_EVERY`), every failure is. The tasks
are those of the registry, so the memory is bounded: ``PER_TASK`` × tasks outcomes of about 0.5 KB
each for a small job and 1 KB with every text at its cap (ASCII; ``docs/dashboard.md`` has the
measurement), lost with the process.

``zqsync.recent`` answers from it, with the jobs running now (arguments and runtime), filtered
by task, state and time. Under ``--processes N`` the call is answered by the child that took it:
each child remembers its own jobs.
"""

from __future__ import annotations

import collections
import itertools
import os
import reprlib
import time
from typing import Any, NamedTuple, Optional

from ..wire.envelope import Request

#: Outcomes kept per task, newest last (older ones dropped).
PER_TASK = 100
#: Longest argument, result or error text kept, characters.
TEXT = 200
#: Seconds between two successes of one task that are remembered: a flood of quick jobs keeps a sample
#: of at most 100 successes a second per task (formatting and keeping every one cost a worker about
#: 30 % of its plain-job rate, and 40-110 us per job below 1,000 jobs/s); every other outcome (failed,
#: dead, cancelled, a retry) is kept.
SAMPLE_EVERY = 0.01
#: Most outcomes one ``zqsync.recent`` answer lists.
MAX_LIST = 1000
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict = 3, 40, 40, 5, 5


def _repr(value: Any) -> str:
    """``repr(value)``, cut short as `reprlib` cuts it; the built-in ``repr`` for small scalars and
    short strings (most arguments: it is several times faster, and this runs for every job)."""
    kind = type(value)
    if kind in (bool, float, type(None)) or (kind is int and -2**63 <= value < 2**63) or (
            kind is str and len(value) <= _SHORT.maxstring):
        return repr(value)
    return _SHORT.repr(value)


def short(value: Any) -> str:
    """A repr of ``value`` of at most `TEXT` characters."""
    return _repr(value)[:TEXT]


def call_text(request: Request) -> str:
    """``1, 'a', key=3``: a short text of a request's arguments (at most `TEXT` characters; the
    first five positional and five keyword arguments)."""
    parts = [_repr(value) for value in request.args[:5]] + (["..."] if len(request.args) > 5 else [])
    parts += [f"{key}={_repr(value)}" for key, value in itertools.islice(request.kwargs.items(), 5)]
    return ", ".join(parts)[:TEXT]


class Outcome(NamedTuple):
    """One finished attempt, as listed by ``zqsync.recent``; times are epoch seconds."""

    id: str
    task: str
    state: str
    args: str
    result: Optional[str]
    error: Optional[str]
    attempts: int
    started_at: float
    finished_at: float
    confirmed: bool


class Recent:
    """The last `PER_TASK` outcomes of each task in this process (see the module docstring)."""

    def __init__(self, per_task: int = PER_TASK) -> None:
        self.per_task = per_task
        self._rings: dict[str, collections.deque[Outcome]] = {}
        self._last_success: dict[str, float] = {}
        #: successes not remembered (`SAMPLE_EVERY`)
        self.unsampled = 0

    def wants(self, task: str, state: str, now: float) -> bool:
        """Whether to remember an outcome of ``task`` in ``state`` that ended at ``now`` (epoch seconds):
        any but a success, and a success `SAMPLE_EVERY` seconds after the last remembered one."""
        if state != "done":
            return True
        if now - self._last_success.get(task, 0.0) < SAMPLE_EVERY:
            self.unsampled += 1
            return False
        self._last_success[task] = now
        return True

    def add(self, outcome: Outcome) -> None:
        """Remember ``outcome``; the task's oldest is dropped past `per_task`."""
        ring = self._rings.get(outcome.task)
        if ring is None:
            ring = self._rings[outcome.task] = collections.deque(maxlen=self.per_task)
        ring.append(outcome)

    def finished(self, task: Optional[str] = None, state: Optional[str] = None, since: Optional[float] = None,
                 until: Optional[float] = None, limit: int = 100) -> list[dict[str, Any]]:
        """Outcomes that match every filter given, newest first, at most ``limit``: ``task`` and ``state``
        equal, ``finished_at`` within ``[since, until]`` (epoch seconds)."""
        rings = [self._rings.get(task, ())] if task else list(self._rings.values())
        found = [outcome for ring in rings for outcome in ring if (state is None or outcome.state == state)
                 and (since is None or outcome.finished_at >= since) and (until is None or outcome.finished_at <= until)]
        found.sort(key=lambda outcome: outcome.finished_at, reverse=True)
        return [{**outcome._asdict(), "runtime": outcome.finished_at - outcome.started_at} for outcome in found[:limit]]


def check_filters(task: Any, state: Any, since: Any, until: Any, limit: Any) -> None:
    """:raises ValueError: a filter of ``zqsync.recent`` or ``zqsync.jobs`` of the wrong type."""
    for name, value in (("task", task), ("state", state)):
        if value is not None and not (isinstance(value, str) and value):
            raise ValueError(f"{name} must be a non-empty str or None, got {value!r}")
    for name, value in (("since", since), ("until", until)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{name} must be epoch seconds or None, got {value!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= MAX_LIST:
        raise ValueError(f"limit must be an int in 1..{MAX_LIST}, got {limit!r}")


def answer(recent: Recent, running: list[dict[str, Any]], task: Optional[str], state: Optional[str],
           since: Optional[float], until: Optional[float], limit: int) -> dict[str, Any]:
    """The ``zqsync.recent`` answer: ``{"now", "pid", "per_task", "unsampled", "running", "finished"}``."""
    check_filters(task, state, since, until, limit)
    now = time.time()
    running = [job for job in running if (task is None or job["task"] == task) and state in (None, "running")
               and (until is None or job["started_at"] <= until)]
    for job in running:
        job["runtime"] = now - job["started_at"]
    finished = [] if state == "running" else recent.finished(task, state, since, until, limit)
    return {"now": now, "pid": os.getpid(), "per_task": recent.per_task, "unsampled": recent.unsampled,
            "running": running[:limit], "finished": finished}
