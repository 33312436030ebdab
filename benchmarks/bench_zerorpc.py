# ruff: noqa: E402  (gevent mode must monkey-patch before the imports below, as gevent requires)
"""Side-by-side benchmark: zqsync's pooled ``call`` against zerorpc, both under gevent.

Run from the repository root::

    python benchmarks/bench_zerorpc.py [--quick | --smoke] [--json FILE] [--cpus split|shared|free]

zerorpc is gevent-based, so the measurement runs in a subprocess of this
script (``--gevent``: ``monkey.patch_all()`` first), in a greenlet under a
watchdog, as a request handler would. That process starts a ``zqsync.demo.tasks``
worker (:class:`zqsync.processes.WorkerProcess`) and a zerorpc server (this
script with ``--serve``) whose ``echo`` returns its argument, pins the server
where ``--cpus`` put the worker, and stops both by pid when done.

Variants, interleaved in rounds in rotating order, each echoing the
~150-byte payload of ``bench_pool.py`` sequentially:

* ``zqsync``: ``zqsync.Client.call("echo", payload)`` (a pooled DEALER);
* ``zerorpc``: ``zerorpc.Client().echo(payload)`` with its defaults (one
  persistent connection, heartbeats on).

It prints one markdown table (median and p99 per call, and zerorpc / zqsync
with its target) and writes the same rows to ``--json FILE``. zerorpc is
optional (``pip install zerorpc``); without it the run reports the scenario as
skipped. This is a benchmark, not a test: a missed target does not change the
exit status.
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
import importlib.metadata
import importlib.util
import signal
import statistics
import subprocess
import tempfile
import time
from typing import Any, Callable, Iterator, Optional

import zqsync
from benchmarks.harness import (
    REPO_ROOT,
    Row,
    base_parser,
    checked,
    describe,
    distribution,
    interleaved,
    pin,
    progress,
    render_table,
    rows_from_subprocess,
    running_worker,
    size_flags,
    size_for,
    time_calls,
    warm_up,
    write_json,
)
from zqsync.processes import stop_process

#: How to get the peer when it is missing.
INSTALL_HINT = "pip install zerorpc (or pip install -e '.[bench]')"
#: Target: zerorpc's round trip over zqsync's, at least parity.
MIN_ZERORPC_OVER_ZQSYNC = 1.0


@dataclasses.dataclass(frozen=True)
class Settings:
    """How much to measure."""

    rounds: int
    calls: int  # per variant per round
    warmup: int
    watchdog: float  # seconds the gevent-mode body may take before it is abandoned


QUICK = Settings(rounds=5, calls=1000, warmup=100, watchdog=120.0)
FULL = Settings(rounds=5, calls=5000, warmup=500, watchdog=600.0)
#: Every code path once, with tiny counts: for the suite's smoke test, not for figures.
SMOKE = Settings(rounds=2, calls=50, warmup=10, watchdog=60.0)


def zerorpc_unavailable() -> Optional[str]:
    """Why zerorpc cannot run here (with how to install it), or ``None`` when it can."""
    if importlib.util.find_spec("zerorpc") is None:
        return f"zerorpc is not installed: {INSTALL_HINT}"
    return None


# -- the zerorpc server (this script with --serve) ------------------------------------


class EchoService:
    """What the zerorpc server exposes: the same ``echo`` as ``zqsync.demo.tasks``."""

    def echo(self, value: Any) -> Any:
        """Return ``value`` unchanged."""
        return value


def serve(ready_file: str, parent_pid: int) -> int:
    """Serve :class:`EchoService` on a free port of 127.0.0.1 until TERM or until ``parent_pid`` exits.

    Writes the bound endpoint to ``ready_file`` once listening. Blocks.
    """
    import gevent
    import zerorpc
    import zmq

    server = zerorpc.Server(EchoService())
    server.bind("tcp://127.0.0.1:*")
    endpoint = server._events._socket.getsockopt(zmq.LAST_ENDPOINT).decode()  # zerorpc has no public accessor
    with open(ready_file + ".tmp", "w") as handle:
        handle.write(endpoint)
    os.rename(ready_file + ".tmp", ready_file)

    def orphaned() -> None:
        while os.getppid() == parent_pid:
            gevent.sleep(0.5)
        server.stop()

    gevent.spawn(orphaned)
    gevent.signal_handler(signal.SIGTERM, server.stop)
    server.run()
    return 0


@contextlib.contextmanager
def zerorpc_server(timeout: float = 30.0) -> Iterator[tuple[subprocess.Popen, str]]:
    """A zerorpc echo server in a child process: yields ``(process, endpoint)``; stops it by pid.

    :raises RuntimeError: it exited or did not listen within ``timeout`` seconds.
    """
    with tempfile.TemporaryDirectory(prefix="zqsync-zerorpc-") as scratch:
        ready = os.path.join(scratch, "ready")
        command = [sys.executable, os.path.abspath(__file__), "--serve", ready, "--parent-pid", str(os.getpid())]
        child = subprocess.Popen(command, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while not os.path.exists(ready):
                if child.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the zerorpc server did not start (status {child.poll()})")
                time.sleep(0.02)
            with open(ready) as handle:
                yield child, handle.read().strip()
        finally:
            stop_process(child)


# -- measuring (in the monkey-patched child) --------------------------------------------


@contextlib.contextmanager
def callers(worker_endpoint: str, zerorpc_endpoint: str) -> Iterator[dict[str, Callable[[Any], Any]]]:
    """``call(payload) -> payload`` through zqsync and through zerorpc."""
    import zerorpc

    peer = zerorpc.Client(timeout=10)
    peer.connect(zerorpc_endpoint)
    try:
        with zqsync.Client(worker_endpoint) as client:
            yield {"zqsync": lambda payload: client.call("echo", payload), "zerorpc": peer.echo}
    finally:
        peer.close()


def measure_zerorpc(settings: Settings, layout: str) -> list[Row]:
    """Both variants, interleaved in rounds, in a greenlet under a watchdog; returns the rows.

    Runs in a monkey-patched process (``--gevent``).
    """
    import gevent

    def body(worker_endpoint: str, zerorpc_endpoint: str) -> dict[str, list[list[float]]]:
        samples: dict[str, list[list[float]]] = {"zqsync": [], "zerorpc": []}
        with callers(worker_endpoint, zerorpc_endpoint) as calls:
            for call in calls.values():
                warm_up(call, settings.warmup)
            with progress(settings.rounds * len(calls), "gevent: zerorpc") as bar:
                for name in interleaved(list(calls), settings.rounds, bar):
                    samples[name].append(time_calls(calls[name], settings.calls))
        return samples

    with zerorpc_server() as (server, endpoint), running_worker(layout) as worker:
        pin(server.pid, os.sched_getaffinity(worker.pid))  # where --cpus put the worker
        runner = gevent.spawn(body, worker.endpoint, endpoint)
        # A TERM from the parent fails the body, so the worker and the server are still stopped.
        gevent.signal_handler(signal.SIGTERM, runner.kill, RuntimeError("zerorpc run stopped by SIGTERM"), False)
        return zerorpc_rows(runner.get(timeout=settings.watchdog))


def zerorpc_rows(samples: dict[str, list[list[float]]]) -> list[Row]:
    """Median and p99 per variant over all rounds, and zerorpc / zqsync (with per-round values)."""
    rows: dict[str, Row] = {}
    for name, per_round in samples.items():
        everything = [us for one in per_round for us in one]
        rows[name] = Row("gevent", f"{name}: call round trip", statistics.median(everything), "us",
                         p99=statistics.quantiles(everything, n=100)[98],
                         rounds=[statistics.median(one) for one in per_round], quantiles=distribution(everything))
    ratios = [a / b for a, b in zip(rows["zerorpc"].rounds or [], rows["zqsync"].rounds or [])]
    ratio = checked("gevent", "zerorpc / zqsync (median)", rows["zerorpc"].value / rows["zqsync"].value, "x",
                    ">=", MIN_ZERORPC_OVER_ZQSYNC, rounds=ratios)
    return [*rows.values(), ratio]


# -- command line ---------------------------------------------------------------------


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """Command-line options (``--cpus`` as in ``bench_pool.py``)."""
    parser = base_parser(__doc__, 'fewer calls (a few seconds)')
    parser.add_argument("--gevent", action="store_true", help="measure in this process (monkey-patched)")
    parser.add_argument("--serve", metavar="READY_FILE", help=argparse.SUPPRESS)
    parser.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def settings_for(args: argparse.Namespace) -> Settings:
    """``SMOKE``, ``QUICK`` or ``FULL``, per ``--smoke`` / ``--quick``."""
    return size_for(args, SMOKE, QUICK, FULL)


def rows_for(args: argparse.Namespace) -> list[Row]:
    """The rows for these options: measured here with ``--gevent``, else in a monkey-patched subprocess.

    Blocks for the run.

    :raises RuntimeError: zerorpc is not installed, or the run failed.
    """
    missing = zerorpc_unavailable()
    if missing:
        raise RuntimeError(missing)
    settings = settings_for(args)
    if args.gevent:
        return measure_zerorpc(settings, args.cpus)
    return rows_from_subprocess(__file__, ["--gevent", "--cpus", args.cpus, *size_flags(args)],
                                settings.watchdog + 60.0)


def main(argv: Optional[list[str]] = None) -> int:
    """Run the benchmark (or the server, with ``--serve``), print the table, write the JSON."""
    args = parse_args(argv)
    if args.serve:
        return serve(args.serve, args.parent_pid or os.getppid())
    rows = rows_for(args)
    if args.json:
        meta = {**describe(settings_for(args), args), "zerorpc": importlib.metadata.version("zerorpc")}
        write_json(args.json, meta, rows)
    print(render_table(rows, args.cpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
