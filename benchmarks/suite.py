"""``zqsync bench``: every benchmark in one run, each peer measured side by side with zqsync.

Run from a checkout::

    zqsync bench [--quick | --smoke] [--json FILE] [--plot FILE.png] [--only NAME ...]

The scenarios are the ``benchmarks/bench_*.py`` modules, each run through its
own ``rows_for(parse_args(flags))`` (the function behind its command line) or,
for ``rq``, its command line in a subprocess (``--json``), in this order:

========== ====================================================================
pool       sequential call round trip against a raw persistent DEALER and a
           DEALER per request (plain and gevent); 300 greenlets: wall time
           and peak sockets
worker     call round trip against a raw DEALER to a minimal pyzmq ROUTER
           echo (same envelope code); the worker's main-thread CPU per call
zerorpc    call round trip against zerorpc (both under gevent)
congestion enqueue throughput against two raw DEALER loops; DROP's early drop with
           a stalled worker
rq         enqueue and confirmed enqueue against RQ on redis-server
endtoend   plain jobs end to end (enqueued and executed, counted at one
           worker process) against dramatiq, Celery -P gevent and huey on
           redis-server (plain and gevent)
fork       a fork cycle: fork, first call in the child, exit
prefork    plain jobs end to end and calls from 50 greenlets, ``--processes 1``,
           ``2`` (and ``4`` with 4 CPUs) against one worker process, as ratios
gunicorn   real ``gunicorn -k gevent`` on ``zqsync/demo/webapp.py`` under wrk:
           requests/s with an enqueue per request, without, and with a
           Client per request
========== ====================================================================

A scenario whose peer is not installed is reported as skipped, with how to
install it; one whose module is not in the checkout yet, as pending; one that
crashed, as failed (its traceback goes to stderr, and the exit status is 1).
Missed targets never change the exit status: this is a benchmark, not a test.

Output: one markdown table of every comparison on stdout (see
:mod:`benchmarks.report`), progress on stderr, every row of every scenario
with ``--json FILE``, and a chart with ``--plot FILE.png`` (see
:mod:`benchmarks.plot`).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from typing import Any, Optional, Sequence

from benchmarks import plot, report
from benchmarks.harness import rows_from_subprocess
from benchmarks.report import FAILED, OK, PENDING, SKIPPED

#: ``--smoke``: every path once with tiny counts; ``--quick``: under 2 minutes; ``full``: the real figures.
SIZES = {"smoke": ["--smoke"], "quick": ["--quick"], "full": []}
#: The same for a module run through its command line, which may know no ``--smoke``.
SCRIPT_SIZES = {"smoke": ["--quick"], "quick": ["--quick"], "full": []}
#: Seconds a module run through its command line may take before it is stopped.
SCRIPT_TIMEOUT = 1200.0


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One benchmark module, as the suite runs it.

    :param module: the module under ``benchmarks``; it defines ``parse_args(argv)`` and ``rows_for(args)``.
    :param unavailable: the name of its function returning why it cannot run here (with how to
        install what is missing), or ``None`` when it can; ``None`` if it always can.
    :param script: run the module's command line in a subprocess (``--json FILE``) instead of
        ``rows_for`` in this process; it reports missing peers in its own rows.
    """

    name: str
    what: str
    module: str
    unavailable: Optional[str] = None
    script: bool = False


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("pool", "call round trip vs raw and per-request DEALERs; 300 greenlets", "bench_pool"),
    Scenario("worker", "call round trip vs a raw DEALER to a minimal pyzmq ROUTER echo; worker CPU per call",
             "bench_worker"),
    Scenario("zerorpc", "call round trip vs zerorpc", "bench_zerorpc", "zerorpc_unavailable"),
    Scenario("congestion", "enqueue vs raw DEALER loops; DROP early drop, stalled worker", "bench_congestion"),
    Scenario("rq", "enqueue and confirmed enqueue vs RQ on redis-server", "bench_rq", script=True),
    Scenario("endtoend", "plain jobs end to end in one worker process vs dramatiq, Celery, huey", "bench_dramatiq"),
    Scenario("fork", "fork cycle: fork, first call in the child, exit", "bench_fork"),
    Scenario("prefork", "--processes 1, 2 (and 4 with 4 CPUs) against one worker process, as ratios",
             "bench_prefork"),
    Scenario("gunicorn", "gunicorn -k gevent: requests/s with and without an enqueue", "bench_gunicorn",
             "gunicorn_unavailable"),
)
NAMES = tuple(scenario.name for scenario in SCENARIOS)


def run_scenario(scenario: Scenario, size: str) -> dict[str, Any]:
    """Run one scenario in this process; never raises except on ``KeyboardInterrupt``.

    :returns: ``{"status", "reason", "seconds", "rows"}``; ``status`` is one of
        ``ok``, ``skipped``, ``pending`` or ``failed``.
    """
    started = time.monotonic()

    def outcome(status: str, reason: str = "", rows: Sequence[Any] = ()) -> dict[str, Any]:
        return {"status": status, "reason": reason, "seconds": round(time.monotonic() - started, 1),
                "rows": list(rows)}

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{scenario.module}.py")
    if not os.path.isfile(path):
        return outcome(PENDING, f"benchmarks/{scenario.module}.py is not in this checkout yet")
    try:
        if scenario.script:
            rows = rows_from_subprocess(path, SCRIPT_SIZES[size], SCRIPT_TIMEOUT)
        else:
            module = importlib.import_module(f"benchmarks.{scenario.module}")
            missing = getattr(module, scenario.unavailable)() if scenario.unavailable else None
            if missing:
                return outcome(SKIPPED, missing)
            rows = module.rows_for(module.parse_args(SIZES[size]))
    except Exception as exc:  # one crashed scenario must not lose the others' figures
        traceback.print_exc(file=sys.stderr)
        return outcome(FAILED, f"{type(exc).__name__}: {exc}".splitlines()[0])
    return outcome(OK, rows=rows)


# -- the machine ------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _tool_version(command: list[str]) -> Optional[str]:
    if shutil.which(command[0]) is None:
        return None
    result = subprocess.run(command, capture_output=True, text=True, timeout=10)
    return (result.stdout or result.stderr).strip().splitlines()[0]


def machine() -> dict[str, Any]:
    """The machine and the versions a run used: CPUs, CPU model, OS, Python, libraries, peers."""
    import zmq

    return {
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        **{name: _version(name) for name in ("zqsync", "gevent", "msgpack", "gunicorn", "flask", "zerorpc", "rq",
                                             "dramatiq", "redis", "tqdm", "matplotlib")},
        "redis_server": _tool_version(["redis-server", "--version"]),
        "wrk": _tool_version(["wrk", "--version"]),
    }


def headline(facts: dict[str, Any], command: str, seconds: float) -> str:
    """One line naming the command, the machine and the run time."""
    return (f"`{command}` on {facts['cpus']} CPUs ({facts['cpu_model']}), {facts['platform']}, "
            f"Python {facts['python']}, pyzmq {facts['pyzmq']} (libzmq {facts['libzmq']}): {seconds:.0f} s")


# -- the run ----------------------------------------------------------------------------


def select(only: Sequence[str]) -> list[Scenario]:
    """The scenarios ``--only`` names (all of them when empty), in suite order.

    :raises SystemExit: an unknown name.
    """
    unknown = sorted(set(only) - set(NAMES))
    if unknown:
        raise SystemExit(f"zqsync bench: unknown scenario {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    return [scenario for scenario in SCENARIOS if not only or scenario.name in only]


def run(*, size: str = "full", only: Sequence[str] = (), json_path: Optional[str] = None,
        plot_path: Optional[str] = None, command: str = "zqsync bench") -> int:
    """Run the selected scenarios one after another, then print and write the report.

    :param size: ``"smoke"``, ``"quick"`` (under 2 minutes) or ``"full"``.
    :param only: scenario names to run (see :data:`NAMES`); empty for all.
    :param json_path: write every scenario's rows, the comparisons and the machine here.
    :param plot_path: draw the chart here (PNG; needs matplotlib).
    :param command: how the run was invoked, for the report.
    :returns: 0, or 1 if a scenario failed. Blocks for the whole run.
    :raises SystemExit: an unknown scenario, or ``plot_path`` without matplotlib (before anything runs).
    """
    scenarios = select(only)
    if plot_path and plot.matplotlib_missing():
        raise SystemExit(f"zqsync bench --plot: {plot.matplotlib_missing()}")
    started = time.monotonic()
    outcomes: dict[str, dict[str, Any]] = {}
    for index, scenario in enumerate(scenarios, 1):
        print(f"zqsync bench [{index}/{len(scenarios)}] {scenario.name}: {scenario.what}", file=sys.stderr, flush=True)
        outcomes[scenario.name] = outcome = run_scenario(scenario, size)
        print(f"zqsync bench [{index}/{len(scenarios)}] {scenario.name}: {outcome['status']} in "
              f"{outcome['seconds']:.0f} s {outcome['reason']}".rstrip(), file=sys.stderr, flush=True)
    seconds = time.monotonic() - started
    facts = machine()
    comparisons = report.build(outcomes)
    print(render(outcomes, comparisons, headline(facts, command, seconds)))
    if json_path:
        write_json(json_path, outcomes, comparisons, facts, command=command, size=size, seconds=seconds)
    if plot_path:
        plot.draw(plot_path, outcomes, comparisons, headline(facts, command, seconds))
        print(f"\nChart: {plot_path}")
    return 1 if any(outcome["status"] == FAILED for outcome in outcomes.values()) else 0


def render(outcomes: dict[str, dict[str, Any]], comparisons: Sequence[report.Comparison], title: str) -> str:
    """The markdown report: headline, the comparison table, scenarios not measured, other missed checks."""
    parts = [title + ".", "", report.render(comparisons)]
    absent = [f"- {name}: {outcome['status']}: {outcome['reason']}" for name, outcome in outcomes.items()
              if outcome["status"] != OK]
    if absent:
        parts += ["", "Not measured:", *absent]
    missed = report.other_checks(outcomes, comparisons)
    if missed:
        parts += ["", "Other checks missed:", *(f"- {line}" for line in missed)]
    return "\n".join(parts)


def write_json(path: str, outcomes: dict[str, dict[str, Any]], comparisons: Sequence[report.Comparison],
               facts: dict[str, Any], **meta: Any) -> None:
    """Write the whole run to ``path``: meta and machine, each scenario with its rows, the comparisons."""
    document = {
        "meta": {**meta, "machine": facts},
        "scenarios": {name: {**outcome, "rows": [dataclasses.asdict(row) for row in outcome["rows"]]}
                      for name, outcome in outcomes.items()},
        "comparisons": [dataclasses.asdict(item) for item in comparisons],
    }
    with open(path, "w") as handle:
        json.dump(document, handle, indent=2)
