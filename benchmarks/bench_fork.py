"""Side-by-side benchmark: the cost of a fork cycle with an inherited ``zqsync.Client``.

Run from the repository root::

    python benchmarks/bench_fork.py [--quick | --smoke] [--json FILE] [--cpus split|shared|free]

One run starts its own ``zqsync.demo.tasks`` worker with
:class:`zqsync.processes.WorkerProcess` and stops it by pid when done. A
*fork cycle* is what a prefork server or a ``multiprocessing`` pool does per
child: the parent forks, the child makes its first call to the worker and
exits (``os._exit``, in every variant alike), and the parent reaps it. The
time is the parent's, from just before ``fork`` to the end of ``waitpid``.
Variants, interleaved in rounds in rotating order:

* **bare**: the child exits at once; the floor (fork, exit, reap).
* **zqsync**: the child calls ``echo`` through a ``Client`` the parent built
  and used before forking, so it holds connected sockets. The child's pool
  drops the inherited sockets and context without touching them, builds a
  fresh context and connects.
* **raw**: the child builds a ``zmq.Context`` and a DEALER, connects and makes
  the same round trip (the frame the client sends, no pool).

It prints one markdown table (median and p99 per cycle, each variant's cost
above the bare cycle, and zqsync / raw with its target) and writes the same
rows to ``--json FILE``. This is a benchmark, not a test: a missed target does
not change the exit status.
"""

import os
import sys

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import dataclasses
import statistics
import time
from typing import Callable, Optional

import zmq

import zqsync
from benchmarks.harness import (
    PAYLOAD,
    Env,
    Row,
    base_parser,
    checked,
    dealer,
    describe,
    distribution,
    interleaved,
    progress,
    render_table,
    round_trip,
    running_worker,
    size_for,
    write_json,
)
from zqsync.wire.endpoints import split_endpoint

#: What a child runs between ``fork`` and ``os._exit``; it returns the child's exit status.
ChildBody = Callable[[], int]
#: Target: the inherited client's whole cycle against a fresh raw DEALER's (as ``bench_pool``'s pool / raw).
MAX_ZQSYNC_OVER_RAW = 1.25


@dataclasses.dataclass(frozen=True)
class Settings:
    """How many fork cycles to time."""

    rounds: int
    cycles: int  # per variant per round
    warmup: int  # cycles per variant before timing


QUICK = Settings(rounds=3, cycles=100, warmup=10)
FULL = Settings(rounds=5, cycles=400, warmup=20)
#: Every code path once, with tiny counts: for the suite's smoke test, not for figures.
SMOKE = Settings(rounds=2, cycles=5, warmup=2)


def fork_cycle(body: ChildBody) -> float:
    """Fork, run ``body`` in the child, reap it; returns the parent's wall time in microseconds.

    The child leaves through ``os._exit`` whatever happens, so it never runs
    the parent's code after the fork.

    :raises RuntimeError: the child exited with a non-zero status.
    """
    started = time.perf_counter_ns()
    pid = os.fork()
    if pid == 0:  # the child
        status = 4
        try:
            status = body()
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    elapsed = (time.perf_counter_ns() - started) / 1000.0
    if status != 0:
        raise RuntimeError(f"a forked child failed (wait status {status:#x})")
    return elapsed


def child_bodies(client: zqsync.Client, endpoint: str) -> dict[str, ChildBody]:
    """The three variants' child bodies, each returning 0 when the echo came back intact."""

    def bare() -> int:
        return 0

    def inherited() -> int:
        return 0 if client.call("echo", PAYLOAD) == PAYLOAD else 3

    def raw() -> int:
        context = zmq.Context(io_threads=1)  # what the pool builds
        sock = dealer(Env(endpoint, split_endpoint(endpoint)[1], context))
        return 0 if round_trip(sock, PAYLOAD) == PAYLOAD else 3

    return {"bare": bare, "zqsync": inherited, "raw": raw}


def measure_fork(settings: Settings, layout: str) -> list[Row]:
    """Time every variant's fork cycles, interleaved in rounds; returns the report's rows."""
    with running_worker(layout) as worker, zqsync.Client(worker.endpoint) as client:
        client.call("echo", PAYLOAD)  # the parent holds a connected DEALER, as a preloaded app would
        bodies = child_bodies(client, worker.endpoint)
        for body in bodies.values():
            for _ in range(settings.warmup):
                fork_cycle(body)
        samples: dict[str, list[list[float]]] = {name: [] for name in bodies}
        with progress(settings.rounds * len(bodies), "fork cycles") as bar:
            for name in interleaved(list(bodies), settings.rounds, bar):
                samples[name].append([fork_cycle(bodies[name]) for _ in range(settings.cycles)])
    return fork_rows(samples)


def fork_rows(samples: dict[str, list[list[float]]]) -> list[Row]:
    """Median and p99 per variant, each call variant's cost above the bare cycle, and zqsync / raw."""
    labels = {"bare": "bare: fork cycle (fork, exit, reap)",
              "zqsync": "zqsync: fork cycle, first call through the inherited Client",
              "raw": "raw: fork cycle, first call through a fresh Context and DEALER"}
    median: dict[str, float] = {}
    round_medians: dict[str, list[float]] = {}
    rows = []
    for name, per_round in samples.items():
        everything = [us for one in per_round for us in one]
        median[name] = statistics.median(everything)
        round_medians[name] = [statistics.median(one) for one in per_round]
        rows.append(Row("fork", labels[name], median[name], "us", p99=statistics.quantiles(everything, n=100)[98],
                        rounds=round_medians[name], quantiles=distribution(everything)))
    for name in ("zqsync", "raw"):
        rows.append(Row("fork", f"{name}: cost of the first call above the bare cycle (median)",
                        median[name] - median["bare"], "us",
                        rounds=[a - b for a, b in zip(round_medians[name], round_medians["bare"])]))
    rows.append(checked("fork", "zqsync / raw fork cycle (median)", median["zqsync"] / median["raw"], "x",
                        "<=", MAX_ZQSYNC_OVER_RAW,
                        rounds=[a / b for a, b in zip(round_medians["zqsync"], round_medians["raw"])]))
    return rows


# -- command line ---------------------------------------------------------------------


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """Command-line options (``--cpus`` as in ``bench_pool.py``)."""
    parser = base_parser(__doc__, 'fewer cycles (a few seconds)')
    return parser.parse_args(argv)


def settings_for(args: argparse.Namespace) -> Settings:
    """``SMOKE``, ``QUICK`` or ``FULL``, per ``--smoke`` / ``--quick``."""
    return size_for(args, SMOKE, QUICK, FULL)


def rows_for(args: argparse.Namespace) -> list[Row]:
    """The fork-cycle rows for these options. Blocks for the run; forks this process many times."""
    return measure_fork(settings_for(args), args.cpus)


def main(argv: Optional[list[str]] = None) -> int:
    """Run the benchmark, print the table, write the JSON; always 0 unless a run failed."""
    args = parse_args(argv)
    rows = rows_for(args)
    if args.json:
        meta = describe(settings_for(args), args)
        write_json(args.json, meta, rows)
    print(render_table(rows, args.cpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
