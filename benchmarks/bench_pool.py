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

import sys

if __name__ == "__main__" and "--gevent" in sys.argv[1:]:
    from gevent import monkey

    monkey.patch_all()

import argparse
import contextlib
import dataclasses
import functools
import gc
import itertools
import json
import operator
import os
import platform
import signal
import statistics
import subprocess
import tempfile
import time
from typing import Any, Callable, Iterator, NamedTuple, Optional

import msgpack
import zmq

import zqsync
from zqsync.processes import WorkerProcess, stop_process
from zqsync.wire import envelope
from zqsync.wire.endpoints import split_endpoint

try:
    from tqdm import tqdm
except ImportError:  # progress bars are optional
    tqdm = None

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: What every variant echoes: a small, typical RPC argument (about 150 bytes packed).
PAYLOAD = {"user": 42, "name": "benchmark", "tags": ["a", "b", "c"], "blob": "x" * 100}
#: Receive bound of the plain raw and per-request sockets, so a dead worker fails the run
#: instead of hanging it (zmq.green ignores it; gevent mode has a watchdog instead).
RECV_TIMEOUT_MS = 10_000
_COMPARE = {"<=": operator.le, ">=": operator.ge, "==": operator.eq}


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
#: --cpus choices: where this process and the worker run.
LAYOUTS = {
    "split": "this process on one CPU, the worker on another (default: like separate hosts, and reproducible)",
    "shared": "both on one CPU: every microsecond of client CPU shows in the round trip",
    "free": "no pinning: the scheduler's placement of the zmq I/O threads makes results bimodal",
}


@dataclasses.dataclass
class Row:
    """One line of the report: a figure, or a ratio checked against its target."""

    mode: str
    measure: str
    value: float
    unit: str
    p99: Optional[float] = None
    rounds: Optional[list[float]] = None
    target: Optional[str] = None
    met: Optional[bool] = None
    #: The distribution behind ``value``: its 0th to 100th percentiles (101 numbers, in ``unit``), for plots.
    quantiles: Optional[list[float]] = None


def distribution(samples: list[float]) -> list[float]:
    """The 0th, 1st, ..., 100th percentiles of ``samples`` (at least two), rounded to 0.01."""
    ordered = sorted(samples)
    inner = statistics.quantiles(ordered, n=100, method="inclusive")
    return [round(value, 2) for value in (ordered[0], *inner, ordered[-1])]


def checked(mode: str, measure: str, value: float, unit: str, op: str, goal: float, **extra: Any) -> Row:
    """A row whose ``value`` must satisfy ``value <op> goal``."""
    return Row(mode, measure, value, unit, target=f"{op} {goal:g}", met=_COMPARE[op](value, goal), **extra)


# -- environment and callers --------------------------------------------------


class Env(NamedTuple):
    """Where and with what the raw and per-request variants talk to the worker."""

    endpoint: str
    rpc: str
    context: Any  # a zmq.Context, or a zmq.green one in gevent mode


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


def _pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of process ``pid`` to ``cpus`` (threads it starts later inherit it).

    A thread may exit between the listing and its pinning (the Python load
    generator's threads come and go), and so may the whole process: both are
    skipped, since there is nothing left to pin.
    """
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return
    for tid in threads:
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            continue


@contextlib.contextmanager
def placed(worker: WorkerProcess, layout: str) -> Iterator[None]:
    """Pin this process and the worker per ``layout`` (see ``LAYOUTS``) until the block ends.

    Enter it before any zmq context exists, so the I/O threads inherit the pinning.
    Restoring this process's CPUs on the way out lets a later child process pin again.
    """
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    if layout == "free" or len(allowed) < 2 or not os.path.isdir("/proc/self/task"):
        yield
        return
    cpus = sorted(allowed)
    _pin(os.getpid(), {cpus[0]})
    _pin(worker.pid, {cpus[-1] if layout == "split" else cpus[0]})
    try:
        yield
    finally:
        _pin(os.getpid(), allowed)


@contextlib.contextmanager
def running_worker(layout: str) -> Iterator[WorkerProcess]:
    """A fresh ``zqsync.demo.tasks`` worker, placed per ``layout``, stopped by pid on the way out."""
    worker = WorkerProcess("zqsync.demo.tasks:registry", cwd=REPO_ROOT)
    try:
        with placed(worker.start(), layout):
            yield worker
    finally:
        worker.stop()


@contextlib.contextmanager
def open_env(endpoint: str, *, green: bool) -> Iterator[Env]:
    """One shared context (green or plain) for the raw and per-request variants."""
    if green:
        from zmq import green as zmq_green

        context = zmq_green.Context()
    else:
        context = zmq.Context()
    try:
        yield Env(endpoint, split_endpoint(endpoint)[1], context)
    finally:
        context.destroy(linger=0)


_request_ids = itertools.count()


def _dealer(env: Env) -> Any:
    sock = env.context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
    sock.connect(env.rpc)
    return sock


def _round_trip(sock: Any, payload: Any) -> Any:
    """Encode the same request frame the client sends, send it, decode the reply. No checks."""
    sock.send(envelope.encode_request("call", str(next(_request_ids)), "echo", (payload,), {}))
    return envelope.decode_reply(sock.recv()).result


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
        sock = _dealer(env)
        gauge.opened()
        try:
            return _round_trip(sock, payload)
        finally:
            sock.close()
            gauge.closed()

    yield Caller(call, lambda: gauge.peak)


@contextlib.contextmanager
def raw_caller(env: Env) -> Iterator[Caller]:
    """One persistent DEALER: no pool, no lease, no deadline, no reply-id check."""
    sock = _dealer(env)
    try:
        yield Caller(functools.partial(_round_trip, sock), lambda: 1)
    finally:
        sock.close()


SEQUENTIAL_VARIANTS = {"pool": pooled_caller, "per-request": per_request_caller, "raw": raw_caller}


# -- measuring ------------------------------------------------------------------


class _NoBar:
    """Stands in for a tqdm bar when tqdm is not installed."""

    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def update(self, n: int = 1) -> None:
        return None


def progress(total: int, desc: str) -> Any:
    """A tqdm bar on stderr, or a do-nothing stand-in when tqdm is missing."""
    if tqdm is not None:
        return tqdm(total=total, desc=desc, file=sys.stderr, leave=False)
    return _NoBar()


def warm_up(call: Callable[[Any], Any], calls: int) -> None:
    """Connect, fill caches, and check the echo once."""
    for _ in range(calls):
        result = call(PAYLOAD)
    if result != PAYLOAD:
        raise RuntimeError(f"echo returned {result!r}, expected {PAYLOAD!r}")


def time_calls(call: Callable[[Any], Any], calls: int) -> list[float]:
    """Per-call latencies in microseconds of ``calls`` sequential calls."""
    clock = time.perf_counter_ns
    elapsed = []
    for _ in range(calls):
        started = clock()
        call(PAYLOAD)
        elapsed.append(clock() - started)
    return [ns / 1000.0 for ns in elapsed]


def interleaved(names: list[str], rounds: int, bar: Any) -> Iterator[str]:
    """Every variant name once per round, the order rotating each round so no variant
    always follows the same one; collects garbage before each and ticks ``bar`` after."""
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            gc.collect()
            yield name
            bar.update(1)


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

    return [*rows.values(), ratio("pool", "raw", "<=", 1.25), ratio("per-request", "pool", ">=", 2.5)]


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
    from zqsync.worker.server import MAX_IDENTITIES

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


def size_flags(args: argparse.Namespace) -> list[str]:
    """``--quick`` or ``--smoke`` as given in ``args``, to pass on to a child run."""
    return ["--quick"] if args.quick else ["--smoke"] if getattr(args, "smoke", False) else []


def rows_from_subprocess(script: str, flags: list[str], timeout: float) -> list[Row]:
    """Run ``script`` with ``flags`` and ``--json FILE`` in a child process; return the rows it wrote.

    The child is stopped by pid (TERM, then KILL) if it runs over ``timeout`` seconds.

    :raises RuntimeError: the child failed or ran over ``timeout``.
    """
    with tempfile.TemporaryDirectory(prefix="zqsync-bench-") as scratch:
        rows_path = os.path.join(scratch, "rows.json")
        child = subprocess.Popen([sys.executable, os.path.abspath(script), *flags, "--json", rows_path],
                                 cwd=REPO_ROOT, stdout=subprocess.DEVNULL)
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            status = stop_process(child)  # a no-op once it has exited
        if status != 0:
            raise RuntimeError(f"{os.path.basename(script)} {' '.join(flags)} failed with status {status}")
        with open(rows_path) as handle:
            return [Row(**row) for row in json.load(handle)["rows"]]


def run_gevent_subprocess(args: argparse.Namespace, settings: Settings) -> list[Row]:
    """Run this script with ``--gevent`` in a child process and collect its rows."""
    # The child's own watchdog should fire first.
    return rows_from_subprocess(__file__, ["--gevent", "--cpus", args.cpus, *size_flags(args)], settings.watchdog + 60.0)


# -- reporting ------------------------------------------------------------------


def _number(value: Optional[float], unit: str) -> str:
    if value is None:
        return ""
    if unit == "sockets":
        return f"{value:.0f}"
    return f"{value:.3f}" if unit in ("s", "x") else f"{value:.1f}"


def render_table(rows: list[Row], layout: str) -> str:
    """The report as one markdown table, under a line naming the CPU layout."""
    lines = [
        f"CPU layout `{layout}`: {LAYOUTS[layout]}.",
        "",
        "| mode | measure | value | unit | p99 | per round | target | met |",
        "|---|---|---:|---|---:|---|---|---|",
    ]
    for row in rows:
        per_round = " ".join(_number(value, row.unit) for value in row.rounds or [])
        met = "" if row.met is None else ("yes" if row.met else "**NO**")
        lines.append(f"| {row.mode} | {row.measure} | {_number(row.value, row.unit)} | {row.unit} | "
                     f"{_number(row.p99, row.unit)} | {per_round} | {row.target or ''} | {met} |")
    return "\n".join(lines)


def describe(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    """Settings and versions, recorded next to the rows in the JSON output."""
    return {
        "settings": dataclasses.asdict(settings),
        "quick": args.quick,
        "smoke": getattr(args, "smoke", False),
        "cpus_layout": args.cpus,
        "payload_bytes": len(msgpack.packb(PAYLOAD)),
        "python": platform.python_version(),
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        "zqsync": zqsync.__version__,
        "cpus": os.cpu_count(),
    }


def base_parser(doc: str, quick_help: str, *, layouts: Optional[dict[str, str]] = None) -> argparse.ArgumentParser:
    """The options every benchmark module shares: ``--cpus``, ``--quick`` / ``--smoke`` and ``--json``."""
    layouts = LAYOUTS if layouts is None else layouts
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--cpus", choices=layouts, default="split",
                        help="; ".join(f"{name}: {text}" for name, text in layouts.items()))
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help=quick_help)
    sizes.add_argument("--smoke", action="store_true", help="tiny counts: checks that every path runs, no figures")
    parser.add_argument("--json", metavar="FILE", help="also write the rows, settings and versions to FILE")
    return parser


def size_for(args: argparse.Namespace, smoke: Any, quick: Any, full: Any) -> Any:
    """``smoke``, ``quick`` or ``full``, per ``--smoke`` / ``--quick``."""
    return smoke if args.smoke else quick if args.quick else full


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
        with open(args.json, "w") as handle:
            json.dump({"meta": describe(settings, args), "rows": [dataclasses.asdict(row) for row in rows]},
                      handle, indent=2)
    print(render_table(rows, args.cpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
