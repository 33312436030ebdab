# ruff: noqa: E402  (gevent mode must monkey-patch before the imports below, as gevent requires)
"""Side-by-side benchmark: zqsync's pooled ``call`` against per-request sockets and raw pyzmq.

Run from the repository root::

    python benchmarks/bench_pool.py [--quick] [--json FILE]

One run starts its own worker (``zqsync.demo.tasks:registry``) with
:class:`zqsync.processes.WorkerProcess` and stops it by pid when done. It
measures, in plain (unpatched) mode and then in a subprocess of this script
run with ``--gevent`` (``monkey.patch_all()`` first, ``zmq.green`` sockets,
its own fresh worker):

1. sequential ``call("echo", payload)`` round trips through the pool, through
   a DEALER created and closed per request, and through one persistent raw
   DEALER (the floor). The variants are interleaved in rounds, in rotating
   order, so machine noise hits all of them alike.
2. gevent mode only: ``greenlets`` greenlets making ``calls_each`` calls each,
   pooled (``pool_size=4``) against a green DEALER per call: wall time, and
   peak sockets counted by the client, by the worker (distinct identities)
   and by a gauge around the per-call sockets.

It prints one markdown table (each figure, each ratio with its target and
whether it is met) and writes the same rows to ``--json FILE``. This is a
benchmark, not a test: a missed target does not change the exit status.
"""

import os
import sys

if __name__ == "__main__" and "--gevent" in sys.argv[1:]:
    from gevent import monkey

    monkey.patch_all()

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import contextlib
import dataclasses
import functools
import signal
import statistics
import time
from typing import Any, Callable, Iterator, NamedTuple, Optional

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
    open_env,
    progress,
    render_table,
    round_trip,
    rows_from_subprocess,
    running_worker,
    size_flags,
    size_for,
    time_calls,
    warm_up,
    write_json,
)
from zqsync.processes import WorkerProcess

try:
    from tqdm import tqdm
except ImportError:  # progress bars are optional
    tqdm = None


@dataclasses.dataclass(frozen=True)
class Settings:
    """How much to measure; ``QUICK`` fits in about a minute on a noisy 2-core machine."""

    rounds: int
    calls: int
    warmup: int
    greenlets: int
    calls_each: int
    concurrent_rounds: int
    pool_size: int
    watchdog: float  # seconds the gevent-mode body may take before it is abandoned


# Concurrent rounds stay at 3 so the per-call sockets (300 + 3 x 3000 identities) fit the
# worker's identity table (10,000), which the pooled identity count relies on.
QUICK = Settings(rounds=5, calls=1000, warmup=100, greenlets=300, calls_each=10, concurrent_rounds=3, pool_size=4,
                 watchdog=120.0)
#: Every code path once, with tiny counts: for the suite's smoke test, not for figures.
SMOKE = Settings(rounds=2, calls=50, warmup=10, greenlets=300, calls_each=1, concurrent_rounds=1, pool_size=4,
                 watchdog=60.0)
FULL = Settings(rounds=5, calls=5000, warmup=500, greenlets=300, calls_each=10, concurrent_rounds=3, pool_size=4,
                watchdog=900.0)


# -- environment and callers --------------------------------------------------


class Caller(NamedTuple):
    """One benchmark variant: ``call(payload) -> result``, and its peak of open sockets."""

    call: Callable[[Any], Any]
    peak_sockets: Callable[[], int]


class SocketGauge:
    """Counts the sockets a variant holds open now and at most."""

    def __init__(self) -> None:
        self.open = 0
        self.peak = 0

    def opened(self) -> None:
        self.open += 1
        self.peak = max(self.peak, self.open)

    def closed(self) -> None:
        self.open -= 1


@contextlib.contextmanager
def pooled_caller(env: Env, pool_size: Optional[int] = None) -> Iterator[Caller]:
    """``zqsync.Client(endpoint).call("echo", payload)``."""
    with zqsync.Client(env.endpoint, pool_size=pool_size) as client:
        yield Caller(functools.partial(client.call, "echo"), lambda: client.stats()["dealer"]["peak_in_flight"])


@contextlib.contextmanager
def per_request_caller(env: Env) -> Iterator[Caller]:
    """A DEALER created, connected, used once and closed (LINGER 0) per call."""
    gauge = SocketGauge()

    def call(payload: Any) -> Any:
        sock = dealer(env)
        gauge.opened()
        try:
            return round_trip(sock, payload)
        finally:
            sock.close()
            gauge.closed()

    yield Caller(call, lambda: gauge.peak)


@contextlib.contextmanager
def raw_caller(env: Env) -> Iterator[Caller]:
    """One persistent DEALER: no pool, no lease, no deadline, no reply-id check."""
    sock = dealer(env)
    try:
        yield Caller(functools.partial(round_trip, sock), lambda: 1)
    finally:
        sock.close()


#: Target: the pool's call round trip over one persistent raw DEALER's to the same worker (issue 14).
MAX_POOL_RATIO = 1.05
SEQUENTIAL_VARIANTS = {"pool": pooled_caller, "per-request": per_request_caller, "raw": raw_caller}


# -- measuring ------------------------------------------------------------------


def measure_sequential(env: Env, settings: Settings, mode: str) -> list[Row]:
    """Sequential echo latency of every variant, interleaved in rounds."""
    samples: dict[str, list[list[float]]] = {name: [] for name in SEQUENTIAL_VARIANTS}
    with contextlib.ExitStack() as stack:
        callers = {name: stack.enter_context(factory(env)) for name, factory in SEQUENTIAL_VARIANTS.items()}
        for caller in callers.values():
            warm_up(caller.call, settings.warmup)
        bar = stack.enter_context(progress(settings.rounds * len(callers), f"{mode}: sequential"))
        for name in interleaved(list(callers), settings.rounds, bar):
            samples[name].append(time_calls(callers[name].call, settings.calls))
    return sequential_rows(mode, samples)


def sequential_rows(mode: str, samples: dict[str, list[list[float]]]) -> list[Row]:
    """Median and p99 per variant over all rounds, and the two ratios (with per-round values)."""
    rows = {}
    for name, per_round in samples.items():
        everything = [us for one_round in per_round for us in one_round]
        rows[name] = Row(mode, f"{name}: call round trip", statistics.median(everything), "us",
                         p99=statistics.quantiles(everything, n=100)[98],
                         rounds=[statistics.median(one_round) for one_round in per_round],
                         quantiles=distribution(everything))

    def ratio(top: str, bottom: str, op: str, goal: float) -> Row:
        per_round = [a / b for a, b in zip(rows[top].rounds, rows[bottom].rounds)]
        return checked(mode, f"{top} / {bottom} (median)", rows[top].value / rows[bottom].value, "x",
                       op, goal, rounds=per_round)

    return [*rows.values(), ratio("pool", "raw", "<=", MAX_POOL_RATIO), ratio("per-request", "pool", ">=", 2.5)]


def run_greenlets(call: Callable[[Any], Any], greenlets: int, calls_each: int) -> float:
    """Wall seconds for ``greenlets`` greenlets making ``calls_each`` sequential calls each."""
    import gevent

    def one_user() -> None:
        for _ in range(calls_each):
            call(PAYLOAD)

    started = time.perf_counter()
    group = [gevent.spawn(one_user) for _ in range(greenlets)]
    gevent.joinall(group, raise_error=True)
    return time.perf_counter() - started


def pooled_identities(worker: WorkerProcess) -> set[str]:
    """Identities the worker saw from this process's pooled sockets (``zq-PID-...``)."""
    prefix = f"zq-{os.getpid()}-"
    return {identity for identity in worker.identities() if identity.startswith(prefix)}


def measure_concurrency(env: Env, worker: WorkerProcess, settings: Settings) -> list[Row]:
    """Many greenlets at once: pooled client against a green DEALER per call."""
    from zqsync.worker.receiving import MAX_IDENTITIES

    known = pooled_identities(worker)
    walls: dict[str, list[float]] = {"pooled": [], "per-call": []}
    with contextlib.ExitStack() as stack:
        callers = {"pooled": stack.enter_context(pooled_caller(env, settings.pool_size)),
                   "per-call": stack.enter_context(per_request_caller(env))}
        for caller in callers.values():  # pooled first: its sockets reach the worker's identity table
            run_greenlets(caller.call, settings.greenlets, 1)
        bar = stack.enter_context(progress(settings.concurrent_rounds * len(callers), "gevent: concurrent"))
        for name in interleaved(list(callers), settings.concurrent_rounds, bar):
            walls[name].append(run_greenlets(callers[name].call, settings.greenlets, settings.calls_each))
        peaks = {name: caller.peak_sockets() for name, caller in callers.items()}
    identities = len(pooled_identities(worker) - known)
    table_full = len(worker.stats()["identities"]) >= MAX_IDENTITIES
    return concurrency_rows(settings, walls, peaks, identities, table_full)


def concurrency_rows(settings: Settings, walls: dict[str, list[float]], peaks: dict[str, int],
                     identities: int, table_full: bool) -> list[Row]:
    """Wall times, their ratio, and the socket peaks against the pool's cap."""
    load = f"{settings.greenlets} greenlets x {settings.calls_each} calls"
    cap = settings.pool_size
    median = {name: statistics.median(values) for name, values in walls.items()}
    identity_note = " (worker identity table full: may undercount)" if table_full else ""
    return [
        Row("gevent", f"{load}, pooled (pool_size={cap}): wall", median["pooled"], "s", rounds=walls["pooled"]),
        Row("gevent", f"{load}, DEALER per call: wall", median["per-call"], "s", rounds=walls["per-call"]),
        checked("gevent", "pooled / per-call wall (median)", median["pooled"] / median["per-call"], "x", "<=", 0.6,
                rounds=[a / b for a, b in zip(walls["pooled"], walls["per-call"])]),
        checked("gevent", "pooled: peak sockets in flight (client stats)", peaks["pooled"], "sockets", "==", cap),
        checked("gevent", f"pooled: distinct identities seen by the worker{identity_note}", identities, "sockets",
                "==", cap),
        Row("gevent", "per-call: peak open sockets (gauge)", peaks["per-call"], "sockets"),
    ]


# -- modes ----------------------------------------------------------------------


def run_plain(settings: Settings, layout: str) -> list[Row]:
    """Plain mode, in this (unpatched) process."""
    with running_worker(layout) as worker, open_env(worker.endpoint, green=False) as env:
        return measure_sequential(env, settings, "plain")


def run_gevent(settings: Settings, layout: str) -> list[Row]:
    """Gevent mode, in this monkey-patched process: concurrency first, while the worker's
    identity table is empty, then sequential latency. Everything runs in a greenlet, as a
    request handler would, under a watchdog (green sockets ignore RCVTIMEO)."""
    import gevent

    def body(worker: WorkerProcess) -> list[Row]:
        with open_env(worker.endpoint, green=True) as env:
            return measure_concurrency(env, worker, settings) + measure_sequential(env, settings, "gevent")

    with running_worker(layout) as worker:
        runner = gevent.spawn(body, worker)
        # A TERM from the parent fails the body, so the worker is still stopped.
        gevent.signal_handler(signal.SIGTERM, runner.kill, RuntimeError("gevent-mode run stopped by SIGTERM"), False)
        return runner.get(timeout=settings.watchdog)


def run_gevent_subprocess(args: argparse.Namespace, settings: Settings) -> list[Row]:
    """Run this script with ``--gevent`` in a child process and collect its rows."""
    # The child's own watchdog should fire first.
    return rows_from_subprocess(__file__, ["--gevent", "--cpus", args.cpus, *size_flags(args)], settings.watchdog + 60.0)


# -- reporting ------------------------------------------------------------------


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """Command-line options."""
    parser = base_parser(__doc__, "a smaller run (under about a minute)")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--gevent", action="store_true", help="run only gevent mode, in this process (monkey-patched)")
    modes.add_argument("--plain-only", action="store_true", help="skip the gevent-mode subprocess")
    return parser.parse_args(argv)


def settings_for(args: argparse.Namespace) -> Settings:
    """``SMOKE``, ``QUICK`` or ``FULL``, per ``--smoke`` / ``--quick``."""
    return size_for(args, SMOKE, QUICK, FULL)


def rows_for(args: argparse.Namespace) -> list[Row]:
    """Every mode the options ask for (see :func:`parse_args`); returns the report's rows.

    Blocks for the whole run. ``zqsync bench`` calls it with ``parse_args([...])``.
    """
    settings = settings_for(args)
    if args.gevent:
        return run_gevent(settings, args.cpus)
    rows = run_plain(settings, args.cpus)
    if not args.plain_only:
        rows += run_gevent_subprocess(args, settings)
    return rows


def main(argv: Optional[list[str]] = None) -> int:
    """Run the benchmark, print the table, write the JSON; always 0 unless a run failed."""
    args = parse_args(argv)
    settings = settings_for(args)
    rows = rows_for(args)
    if args.json:
        write_json(args.json, describe(settings, args), rows)
    print(render_table(rows, args.cpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
