# ruff: noqa: E402  (gevent mode must monkey-patch before the imports below, as gevent requires)
"""Side-by-side benchmark: plain jobs end to end in one worker process, zqsync against dramatiq on Redis.

Run from the repository root::

    python benchmarks/bench_dramatiq.py [--quick | --smoke] [--json FILE] [--cpus split|shared|free] [--plain-only]

Each mode starts a ``zqsync worker zqsync.demo.tasks:registry`` (one process,
default concurrency) and, when ``redis-server`` and the ``dramatiq`` and
``redis`` packages are installed, a ``redis-server`` without persistence on a
free port of 127.0.0.1 and ``dramatiq --processes 1 --threads 8
benchmarks.dramatiq_jobs`` on it. ``--cpus`` places this process and the
zqsync worker as in ``bench_pool.py``; Redis and dramatiq run on the zqsync
worker's CPUs. Every process is stopped by pid when the mode ends.

Variants, interleaved in rounds in rotating order. Each round enqueues the
same number of jobs, one after another, carrying the ~150-byte payload of
``bench_pool.py`` to an ``echo`` task. The time runs from the first enqueue
until the worker has executed every job of the round:

* ``zqsync``: ``Client.enqueue("echo", payload)`` (PUSH, BLOCK: a full queue
  makes the caller wait, and the wait is in the time). Counted at the worker:
  its ``zqsync.stats`` ``jobs_succeeded``, polled every 2 ms.
* ``dramatiq``: ``echo.send(payload)`` on a ``RedisBroker``. Counted at the
  worker: dramatiq's own acknowledgements, which a worker thread sends after
  the job ran (the queue's size, polled every 2 ms with ``broker.join``). That
  costs the job nothing, unlike an ``INCR`` per job, so it favours dramatiq.

Each variant first runs one untimed round. Before each timed round, one
untimed job goes through and is waited for, so a dramatiq consumer that backed
off while idle (up to a second) is awake again.
A sanity row per variant counts failed jobs (zqsync's ``jobs_failed``,
dramatiq's dead letters); both should be 0. One more row gives the zqsync
worker's CPU time per job over the timed rounds (user and system, every
thread, read from ``/proc``; the stats polls included): on one CPU, the
worker's own ceiling is one job per that many microseconds.

Plain mode runs here; gevent mode (the client monkey-patched, as in a gevent
web app) runs in a subprocess of this script (``--gevent``). It prints one
markdown table (jobs/s per variant, and zqsync / dramatiq with its target)
and writes the same rows to ``--json FILE``. This is a benchmark, not a test:
a missed target does not change the exit status.
"""

import os
import sys

if __name__ == "__main__" and "--gevent" in sys.argv[1:]:
    from gevent import monkey

    monkey.patch_all()

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``tests`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from typing import Any, Callable, Iterator, NamedTuple, Optional

import zqsync
from benchmarks.bench_rq import RedisServer
from benchmarks.harness import (
    PAYLOAD,
    REPO_ROOT,
    Row,
    base_parser,
    checked,
    describe,
    interleaved,
    placed,
    progress,
    render_table,
    rows_from_subprocess,
    size_flags,
    size_for,
    write_json,
)
from tests.helpers import wait_for
from zqsync.processes import WorkerProcess, stop_process


@dataclasses.dataclass(frozen=True)
class Settings:
    """How much to measure."""

    rounds: int
    jobs: int  # per variant per round
    watchdog: float  # seconds the gevent-mode body may take before it is abandoned


QUICK = Settings(rounds=3, jobs=2000, watchdog=180.0)
FULL = Settings(rounds=5, jobs=10000, watchdog=600.0)
#: Every code path once, with tiny counts: for the suite's smoke test, not for figures.
SMOKE = Settings(rounds=1, jobs=100, watchdog=120.0)
#: Target: zqsync's end-to-end jobs/s over dramatiq's.
MIN_RATIO = 20.0
#: The peer as the rows name it.
PEER = "dramatiq, 1 process x 8 threads"
INSTALL_HINT = "install with: apt-get install redis-server; pip install 'dramatiq[redis]' (or pip install -e .[bench])"
#: Seconds to wait for the warm-up job (a worker starting), and per 1000 jobs of a round.
START_TIMEOUT = 60.0
DRAIN_SECONDS_PER_1000 = 10.0
POLL = 0.002


def dramatiq_unavailable() -> Optional[str]:
    """Why the dramatiq variant cannot run (with how to fix it), or ``None`` if it can."""
    missing = [name for name in ("dramatiq", "redis") if importlib.util.find_spec(name) is None]
    if shutil.which("redis-server") is None:
        missing.insert(0, "redis-server")
    return f"skipped: {', '.join(missing)} not found; {INSTALL_HINT}" if missing else None


class Variant(NamedTuple):
    """One way to run jobs: ``send(payload)`` enqueues one; ``drain(timeout)`` blocks until the worker
    has executed every job sent so far (raising after ``timeout`` seconds); ``failed()`` counts the
    jobs that failed at the worker."""

    send: Callable[[Any], Any]
    drain: Callable[[float], None]
    failed: Callable[[], int]


# -- processes --------------------------------------------------------------------


@contextlib.contextmanager
def spawning_on(cpus: set[int]) -> Iterator[None]:
    """Processes started in the block inherit ``cpus``: this thread's affinity, restored on the way out.

    A no-op for an empty ``cpus`` or where affinity is not supported (not Linux).
    """
    if not cpus or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def log_tail(path: str, characters: int = 2000) -> str:
    """The last ``characters`` of the log file at ``path``."""
    with open(path, errors="replace") as handle:
        return handle.read()[-characters:]


@contextlib.contextmanager
def dramatiq_worker(redis_url: str, log_path: str) -> Iterator[subprocess.Popen]:
    """``dramatiq --processes 1 --threads 8 benchmarks.dramatiq_jobs`` on ``redis_url``, in its own session.

    Stopped by pid on the way out (TERM, then KILL); a worker process it forked
    and left behind is then killed through the session's process group.
    """
    from benchmarks.dramatiq_jobs import REDIS_URL_VARIABLE

    command = [sys.executable, "-m", "dramatiq", "--processes", "1", "--threads", "8",
               "--worker-shutdown-timeout", "5000", "benchmarks.dramatiq_jobs"]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(command, cwd=REPO_ROOT, env={**os.environ, REDIS_URL_VARIABLE: redis_url},
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        yield proc
    finally:
        stop_process(proc)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def zqsync_variant(client: zqsync.Client, worker: WorkerProcess) -> Variant:
    """``client.enqueue("echo", payload)``, counted by the worker's ``jobs_succeeded``."""
    start = worker.stats()
    sent = [0]

    def send(payload: Any) -> None:
        client.enqueue("echo", payload)
        sent[0] += 1

    def drain(timeout: float) -> None:
        expected = start["jobs_succeeded"] + sent[0]
        wait_for(lambda: worker.stats()["jobs_succeeded"] >= expected, timeout=timeout, interval=POLL,
                 what=f"the zqsync worker to run {sent[0]} jobs")

    return Variant(send, drain, lambda: worker.stats()["jobs_failed"] - start["jobs_failed"])


@contextlib.contextmanager
def dramatiq_variant(scratch: str, cpus: set[int]) -> Iterator[Variant]:
    """A Redis and a dramatiq worker on ``cpus``; ``echo.send(payload)``, counted by the worker's acks."""
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.errors import QueueJoinTimeout

    from benchmarks.dramatiq_jobs import QUEUE, declare

    log_path = os.path.join(scratch, "dramatiq.log")
    with contextlib.ExitStack() as stack:
        with spawning_on(cpus):
            server = RedisServer(["--save", "", "--appendonly", "no"], os.path.join(scratch, "redis"))
            stack.callback(server.stop)
            server.start()
            url = f"redis://127.0.0.1:{server.port}/0"
            worker = stack.enter_context(dramatiq_worker(url, log_path))
        broker = RedisBroker(url=url)
        stack.callback(broker.close)
        actor = declare(broker)

        def drain(timeout: float) -> None:
            try:
                broker.join(QUEUE, interval=round(POLL * 1000), timeout=round(timeout * 1000))
            except QueueJoinTimeout:
                raise RuntimeError(f"dramatiq did not run its jobs within {timeout} s (exit status "
                                   f"{worker.poll()}):\n{log_tail(log_path)}") from None

        yield Variant(actor.send, drain, lambda: broker.client.zcard(f"dramatiq:{QUEUE}.XQ"))


# -- measuring --------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds process ``pid`` has used so far, all its threads (from ``/proc``)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_round(variant: Variant, jobs: int) -> float:
    """Jobs per second, from the first of ``jobs`` enqueues until the worker has executed them all.

    One untimed job goes through first, so the worker is awake.
    """
    variant.send(PAYLOAD)
    variant.drain(START_TIMEOUT)
    started = time.perf_counter()
    for _ in range(jobs):
        variant.send(PAYLOAD)
    variant.drain(DRAIN_SECONDS_PER_1000 * max(1.0, jobs / 1000))
    return jobs / (time.perf_counter() - started)


def measure(settings: Settings, layout: str, mode: str) -> list[Row]:
    """Start the processes, run every variant interleaved in rounds, return the rows."""
    skipped = dramatiq_unavailable()
    worker = WorkerProcess("zqsync.demo.tasks:registry", cwd=REPO_ROOT)
    with tempfile.TemporaryDirectory(prefix="zqsync-bench-dramatiq-") as scratch, contextlib.ExitStack() as stack:
        stack.callback(worker.stop)
        stack.enter_context(placed(worker.start(), layout))
        client = stack.enter_context(zqsync.Client(worker.endpoint, congestion="block"))
        variants = {"zqsync": zqsync_variant(client, worker)}
        if skipped is None:
            cpus = os.sched_getaffinity(worker.pid) if hasattr(os, "sched_getaffinity") else set()
            variants[PEER] = stack.enter_context(dramatiq_variant(scratch, cpus))
        for variant in variants.values():  # an untimed round each: connections, caches, the worker's pools
            time_round(variant, settings.jobs)
        throughput: dict[str, list[float]] = {name: [] for name in variants}
        worker_cpu = -cpu_seconds(worker.pid)
        with progress(settings.rounds * len(variants), f"{mode}: end to end") as bar:
            for name in interleaved(list(variants), settings.rounds, bar):
                throughput[name].append(time_round(variants[name], settings.jobs))
        worker_cpu += cpu_seconds(worker.pid)
        failed = {name: variant.failed() for name, variant in variants.items()}
    per_job = Row(mode, "zqsync worker: CPU per job, all threads, with the stats polls", worker_cpu * 1e6 /
                  (settings.rounds * (settings.jobs + 1)), "us")
    return [*result_rows(mode, throughput, failed, skipped), per_job]


def result_rows(mode: str, throughput: dict[str, list[float]], failed: dict[str, int],
                skipped: Optional[str]) -> list[Row]:
    """Jobs/s per variant (or the peer's skipped row), zqsync / dramatiq with its target, the failed jobs."""
    rows = [Row(mode, f"{name}: jobs end to end, enqueued and executed (median round)", statistics.median(per_round),
                "jobs/s", rounds=per_round) for name, per_round in throughput.items()]
    if skipped:
        rows.append(Row(mode, f"{PEER}: {skipped}", None, "jobs/s"))
    else:
        per_round = [a / b for a, b in zip(throughput["zqsync"], throughput[PEER])]
        value = statistics.median(throughput["zqsync"]) / statistics.median(throughput[PEER])
        rows.append(checked(mode, "zqsync / dramatiq jobs end to end (medians)", value, "x", ">=", MIN_RATIO,
                            rounds=per_round))
    rows += [checked(mode, f"{name}: jobs failed at the worker (a sanity check)", count, "jobs", "==", 0)
             for name, count in failed.items()]
    return rows


def measure_gevent(settings: Settings, layout: str) -> list[Row]:
    """Gevent mode, in this monkey-patched process, in a greenlet under a watchdog."""
    import gevent

    runner = gevent.spawn(measure, settings, layout, "gevent")
    # A TERM from the parent fails the body, so every process is still stopped.
    gevent.signal_handler(signal.SIGTERM, runner.kill, RuntimeError("gevent-mode run stopped by SIGTERM"), False)
    return runner.get(timeout=settings.watchdog)


# -- command line ---------------------------------------------------------------------


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """Command-line options (``--cpus`` as in ``bench_pool.py``)."""
    parser = base_parser(__doc__, "fewer rounds and jobs (well under a minute)")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--gevent", action="store_true", help="run only gevent mode, in this process")
    modes.add_argument("--plain-only", action="store_true", help="skip the gevent-mode subprocess")
    return parser.parse_args(argv)


def settings_for(args: argparse.Namespace) -> Settings:
    """``SMOKE``, ``QUICK`` or ``FULL``, per ``--smoke`` / ``--quick``."""
    return size_for(args, SMOKE, QUICK, FULL)


def rows_for(args: argparse.Namespace) -> list[Row]:
    """The rows for these options: plain mode here, then gevent mode in a monkey-patched subprocess.

    Blocks for the run. :raises RuntimeError: a run failed.
    """
    settings = settings_for(args)
    if args.gevent:
        return measure_gevent(settings, args.cpus)
    rows = measure(settings, args.cpus, "plain")
    if not args.plain_only:
        rows += rows_from_subprocess(__file__, ["--gevent", "--cpus", args.cpus, *size_flags(args)],
                                     settings.watchdog + 60.0)  # the child's own watchdog fires first
    return rows


def versions() -> dict[str, Any]:
    """Versions of dramatiq, redis-py and redis-server, where installed."""
    found: dict[str, Any] = {}
    for name in ("dramatiq", "redis"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[f"{name}_package"] = importlib.metadata.version(name)
    if shutil.which("redis-server"):
        found["redis_server"] = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip()
    return found


def main(argv: Optional[list[str]] = None) -> int:
    """Run the benchmark, print the table, write the JSON; always 0 unless a run failed."""
    args = parse_args(argv)
    rows = rows_for(args)
    if args.json:
        meta = {**describe(settings_for(args), args), **versions()}
        write_json(args.json, meta, rows)
    print(render_table(rows, args.cpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
