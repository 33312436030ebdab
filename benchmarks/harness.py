"""The benchmarks' shared harness: rows, rounds, pinning, workers, progress and reports.

Every benchmark module builds on it: a scenario measures its variants
interleaved in rounds (:func:`interleaved`), in the CPU layout the options
ask for (:func:`placed`, :data:`LAYOUTS`), collects :class:`Row` objects
(figures, and ratios checked against a target with :func:`checked`), and
prints them with :func:`render_table`. A scenario that must run in its own
process (gevent mode, or a peer that must not share the interpreter) hands
its rows back through :func:`rows_from_subprocess`.

This is benchmark code: nothing here asserts speed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import operator
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Iterator, NamedTuple, Optional

import msgpack
import zmq

import zqsync
from zqsync import settings
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


class Env(NamedTuple):
    """Where and with what the raw and per-request variants talk to the worker."""

    endpoint: str
    rpc: str
    context: Any  # a zmq.Context, or a zmq.green one in gevent mode


def pin(pid: int, cpus: set[int]) -> None:
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


def cpu_seconds(pid: int, thread: Optional[int] = None) -> float:
    """Seconds of CPU (user + system) used so far by process ``pid``, every thread (``/proc/PID/stat``),
    or only its thread ``thread`` (``/proc/PID/task/TID/stat``; the main thread's id is ``pid``)."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    with open(path) as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    pin(os.getpid(), {cpus[0]})
    pin(worker.pid, {cpus[-1] if layout == "split" else cpus[0]})
    try:
        yield
    finally:
        pin(os.getpid(), allowed)


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


def dealer(env: Env) -> Any:
    sock = env.context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
    sock.connect(env.rpc)
    return sock


#: The deadline ``Client.call`` stamps on a request by default, seconds.
CALL_TIMEOUT = settings.CALL_TIMEOUT


def round_trip(sock: Any, payload: Any) -> Any:
    """Encode the same request frame ``Client.call`` sends (a 32-hex id, the default ``call_timeout`` as
    its deadline), send it, decode the reply. No checks."""
    sock.send(envelope.encode_request("call", os.urandom(16).hex(), "echo", (payload,), {}, deadline=CALL_TIMEOUT))
    return envelope.decode_reply(sock.recv()).result


class _NoBar:
    """Stands in for a tqdm bar when tqdm is not installed."""

    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def update(self, n: int = 1) -> None:
        return None


def progress(total: int, desc: str) -> Any:
    """A tqdm bar on stderr when it is a terminal, or a do-nothing stand-in when tqdm is missing."""
    if tqdm is not None:
        return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, disable=None)
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


def number(value: Optional[float], unit: str) -> str:
    if value is None:
        return ""
    if unit == "sockets":
        return f"{value:.0f}"
    return f"{value:.3f}" if unit in ("s", "x") else f"{value:.1f}"


def write_json(path: str, meta: dict[str, Any], rows: list[Row]) -> None:
    """Write ``{"meta": meta, "rows": [...]}`` to ``path`` (a benchmark's ``--json FILE``).

    :raises OSError: the file cannot be written.
    """
    with open(path, "w") as handle:
        json.dump({"meta": meta, "rows": [dataclasses.asdict(row) for row in rows]}, handle, indent=2)


def render_table(rows: list[Row], layout: str) -> str:
    """The report as one markdown table, under a line naming the CPU layout."""
    lines = [
        f"CPU layout `{layout}`: {LAYOUTS[layout]}.",
        "",
        "| mode | measure | value | unit | p99 | per round | target | met |",
        "|---|---|---:|---|---:|---|---|---|",
    ]
    for row in rows:
        per_round = " ".join(number(value, row.unit) for value in row.rounds or [])
        met = "" if row.met is None else ("yes" if row.met else "**NO**")
        lines.append(f"| {row.mode} | {row.measure} | {number(row.value, row.unit)} | {row.unit} | "
                     f"{number(row.p99, row.unit)} | {per_round} | {row.target or ''} | {met} |")
    return "\n".join(lines)


def describe(settings: Any, args: argparse.Namespace) -> dict[str, Any]:
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
