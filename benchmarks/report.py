"""The suite's report: every comparison side by side, as one markdown table.

Each scenario module reports detailed :class:`~benchmarks.bench_pool.Row`\\ s.
:data:`COMPARISONS` picks, per comparison, the zqsync row, the peer's row and
(where the module checks one) the ratio row with its target, and turns them
into one :class:`Comparison` whose ``advantage`` always reads the same way:
how many times better zqsync is than the peer (peer time / zqsync time,
zqsync rate / peer rate, peer sockets / zqsync sockets). 1 is parity; above 1,
zqsync is ahead. A module's target (say ``pool / raw <= 1.25``) becomes a
minimum advantage (``>= 0.8``), and its verdict is kept as is.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional, Sequence

from benchmarks.enqueue_floors import ENCODER, PACKB
from benchmarks.harness import Row

#: Statuses of a scenario in a suite run.
OK, SKIPPED, FAILED, PENDING = "ok", "skipped", "failed", "pending"


@dataclasses.dataclass(frozen=True)
class Spec:
    """Where one comparison's figures live in a scenario's rows (see :func:`find`).

    :param ratio: the module's ratio row, or ``None`` to compute the advantage from the figures.
    :param inverted: the ratio row is zqsync over the peer in a lower-is-better unit (a time), so the
        advantage is its inverse.
    """

    scenario: str
    topic: str
    label: str
    peer: str
    zqsync_row: tuple[str, str]
    peer_row: tuple[str, str]
    ratio: Optional[tuple[str, str]] = None
    inverted: bool = False


@dataclasses.dataclass
class Comparison:
    """One line of the report: zqsync against one peer, measured in the same run."""

    scenario: str
    topic: str
    label: str
    peer: str
    zqsync: Optional[float] = None
    peer_value: Optional[float] = None
    unit: str = ""
    advantage: Optional[float] = None
    target: Optional[float] = None  # minimum advantage
    met: Optional[bool] = None
    note: str = ""  # why there is no figure: skipped, pending, failed


_GEVENT_CALLS = "gevent"
#: The prefork variants ``bench_prefork`` runs here: ``--processes 4`` needs 4 CPUs.
PREFORK_PROCESSES = (1, 2, 4) if (os.cpu_count() or 1) >= 4 else (1, 2)
#: The report's comparisons, in the order of the issue.
COMPARISONS: tuple[Spec, ...] = (
    Spec("pool", "call round trip", "plain, sequential (median)", "raw persistent pyzmq DEALER",
         ("plain", "pool: call round trip"), ("plain", "raw: call round trip"),
         ("plain", "pool / raw"), inverted=True),
    Spec("pool", "call round trip", "plain, sequential (median)", "DEALER per request",
         ("plain", "pool: call round trip"), ("plain", "per-request: call round trip"),
         ("plain", "per-request / pool")),
    Spec("pool", "call round trip", "gevent, sequential (median)", "raw persistent pyzmq DEALER",
         (_GEVENT_CALLS, "pool: call round trip"), (_GEVENT_CALLS, "raw: call round trip"),
         (_GEVENT_CALLS, "pool / raw"), inverted=True),
    Spec("pool", "call round trip", "gevent, sequential (median)", "DEALER per request",
         (_GEVENT_CALLS, "pool: call round trip"), (_GEVENT_CALLS, "per-request: call round trip"),
         (_GEVENT_CALLS, "per-request / pool")),
    Spec("worker", "call round trip", "plain, sequential (median): the worker's own cost",
         "raw DEALER to a minimal pyzmq ROUTER echo", ("plain", "call: round trip"),
         ("plain", "raw DEALER to a pyzmq ROUTER echo"), ("plain", "call / raw DEALER to the echo"), inverted=True),
    Spec("zerorpc", "call round trip", "gevent, sequential (median)", "zerorpc",
         (_GEVENT_CALLS, "zqsync: call round trip"), (_GEVENT_CALLS, "zerorpc: call round trip"),
         (_GEVENT_CALLS, "zerorpc / zqsync")),
    Spec("pool", "300 greenlets", "300 greenlets, 10 calls each: wall time", "DEALER per call",
         (_GEVENT_CALLS, "calls, pooled (pool_size"), (_GEVENT_CALLS, "calls, DEALER per call: wall"),
         (_GEVENT_CALLS, "pooled / per-call wall"), inverted=True),
    Spec("pool", "300 greenlets", "300 greenlets: peak sockets", "DEALER per call",
         (_GEVENT_CALLS, "pooled: peak sockets in flight"), (_GEVENT_CALLS, "per-call: peak open sockets")),
    *(Spec("congestion", "enqueue", f"throughput, BLOCK, {mode} (median burst)", f"{sockets} DEALER loop, {encoder}",
           (f"healthy {mode}", "zqsync BLOCK: enqueue throughput"), (f"healthy {mode}", f"{floor}: enqueue throughput"),
           (f"healthy {mode}", f"zqsync BLOCK enqueue rate / {floor} "))
      for mode, sockets in (("plain", "raw pyzmq"), ("gevent", "raw zmq.green"))
      for floor, encoder in ((ENCODER, "zqsync's encoder"), (PACKB, "msgpack.packb of the same dict"))),
    *(Spec("rq", topic, f"throughput, {label}", f"RQ on redis-server ({redis})",
           (mode, f"zqsync {kind}: enqueue throughput"), (mode, f"RQ, {redis}: "),
           (mode, f"zqsync {kind} / RQ, {redis} throughput"))
      for topic, kind, redis in (("enqueue", "enqueue", "no persistence"), ("confirmed enqueue", "confirmed", "AOF everysec"))
      for mode, label in (("sequential", "sequential"), ("greenlets", "concurrent greenlets"))),
    *(Spec("endtoend", "plain jobs end to end", f"enqueued and executed by one worker process, {mode} client",
           f"{peer} on redis-server{workers}",
           (mode, "zqsync: jobs end to end"), (mode, f"{peer}, "), (mode, f"zqsync / {peer} jobs end to end"))
      for mode in ("plain", "gevent")
      for peer, workers in (("dramatiq", ", 1 process x 8 threads"), ("Celery -P gevent", ", 1 process x 8 greenlets"),
                            ("huey", ", 1 process x 8 threads"))),
    Spec("congestion", "DROP, stalled worker", "early drop, enqueue throughput", "DROP without early drop",
         ("stalled", "a. DROP, early drop: enqueue throughput"), ("stalled", "b. DROP, no early drop: enqueue throughput"),
         ("stalled", "a / b throughput")),
    Spec("fork", "fork cycle", "fork, first call in the child, exit (median)", "fresh raw Context + DEALER in the child",
         ("fork", "zqsync: fork cycle"), ("fork", "raw: fork cycle"), ("fork", "zqsync / raw fork cycle"),
         inverted=True),
    *(Spec("prefork", f"--processes {n}", f"{what}, --processes {n}", "one worker process, no supervisor",
           (f"--processes {n}", f"{mode}: "), ("one process", f"{mode}: "),
           (f"--processes {n}", f"{mode}: --processes {n} / one process"))
      for n in PREFORK_PROCESSES for mode, what in (("jobs", "plain jobs end to end"), ("calls", "calls, 50 greenlets"))),
    Spec("gunicorn", "gunicorn -k gevent", "requests/s, an enqueue per request", "a Client per request",
         ("gunicorn", "/enqueue (enqueue): requests/s"), ("gunicorn", "/enqueue-per-request (per-request Client): requests/s"),
         ("gunicorn", "/enqueue (pooled) / per-request Client")),
    Spec("gunicorn", "gunicorn -k gevent", "requests/s, an enqueue per request", "no zqsync at all (/health)",
         ("gunicorn", "/enqueue (enqueue): requests/s"), ("gunicorn", "/health (no zqsync): requests/s"),
         ("gunicorn", "/enqueue (pooled) / /health")),
)


def find(rows: Sequence[Row], where: tuple[str, str]) -> Optional[Row]:
    """The first row whose ``mode`` contains ``where[0]`` and whose ``measure`` contains ``where[1]``."""
    mode, measure = where
    return next((row for row in rows if mode in row.mode and measure in row.measure), None)


def _minimum_advantage(target: Optional[str], inverted: bool) -> Optional[float]:
    """A ratio row's target (``"<= 1.25"``) as the minimum advantage it implies (``0.8``)."""
    if not target:
        return None
    op, goal = target.split()
    if inverted and op == "<=":
        return 1.0 / float(goal)
    return float(goal) if not inverted and op == ">=" else None


def compare(spec: Spec, status: str, reason: str, rows: Sequence[Row]) -> Comparison:
    """The comparison ``spec`` asks for, from a scenario's ``status`` and ``rows``."""
    result = Comparison(spec.scenario, spec.topic, spec.label, spec.peer)
    if status != OK:
        result.note = f"{status}: {reason}" if reason else status
        return result
    mine, theirs = find(rows, spec.zqsync_row), find(rows, spec.peer_row)
    if mine is None or mine.value is None:
        result.note = "no figure: the scenario did not report it"
        return result
    result.zqsync, result.unit = mine.value, mine.unit
    if theirs is None or theirs.value is None:
        result.note = theirs.measure.split(": ", 1)[-1] if theirs is not None else "no figure for the peer"
        return result
    result.peer_value = theirs.value
    ratio = find(rows, spec.ratio) if spec.ratio else None
    if ratio is not None and ratio.value:
        result.advantage = 1.0 / ratio.value if spec.inverted else ratio.value
        result.target = _minimum_advantage(ratio.target, spec.inverted)
        result.met = ratio.met
    elif mine.value and theirs.value:
        higher_is_better = mine.unit.endswith("/s")
        result.advantage = mine.value / theirs.value if higher_is_better else theirs.value / mine.value
    return result


def build(outcomes: dict[str, dict[str, Any]]) -> list[Comparison]:
    """Every comparison of :data:`COMPARISONS` whose scenario was asked for in ``outcomes``
    (scenario name -> ``{"status", "reason", "rows"}``)."""
    return [compare(spec, outcomes[spec.scenario]["status"], outcomes[spec.scenario]["reason"],
                    outcomes[spec.scenario]["rows"])
            for spec in COMPARISONS if spec.scenario in outcomes]


def _figure(value: Optional[float], unit: str) -> str:
    if value is None:
        return ""
    if unit in ("us", "ms") or value >= 100:
        return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"
    return f"{value:.3g}"


def _times(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.2f}x" if value < 10 else f"{value:,.0f}x"


def render(comparisons: Sequence[Comparison]) -> str:
    """The comparisons as one markdown table."""
    lines = ["| benchmark | comparison | zqsync | peer | peer's figure | unit | zqsync advantage | target | met |",
             "|---|---|---:|---|---:|---|---:|---:|---|"]
    for item in comparisons:
        met = "" if item.met is None else ("yes" if item.met else "**NO**")
        target = f">= {_times(item.target)}" if item.target is not None else ""
        theirs = _figure(item.peer_value, item.unit) if item.peer_value is not None else item.note
        lines.append(f"| {item.topic} | {item.label} | {_figure(item.zqsync, item.unit)} | {item.peer} | {theirs} | "
                     f"{item.unit} | {_times(item.advantage)} | {target} | {met} |")
    return "\n".join(lines)


def other_checks(outcomes: dict[str, dict[str, Any]], comparisons: Sequence[Comparison]) -> list[str]:
    """One line per checked row of any scenario that is not already a comparison and missed its target."""
    shown = {(spec.scenario, spec.ratio) for spec in COMPARISONS if spec.ratio}
    missed = []
    for name, outcome in outcomes.items():
        for row in outcome["rows"]:
            if row.met is False and not any(name == scenario and find([row], ratio) for scenario, ratio in shown):
                missed.append(f"{name}: {row.mode}: {row.measure} = {row.value:g} {row.unit}, target {row.target}")
    return missed
