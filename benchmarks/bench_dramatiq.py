# ruff: noqa: E402  (gevent mode must monkey-patch before the imports below, as gevent requires)
"""Side-by-side benchmark: plain jobs end to end in one worker process, zqsync against dramatiq, Celery and huey.

Run from the repository root::

    python benchmarks/bench_dramatiq.py [--quick | --smoke] [--json FILE] [--cpus split|shared|free] [--plain-only]

Each mode starts a ``zqsync worker zqsync.demo.tasks:registry`` (one process,
default concurrency) and, for each peer whose packages and ``redis-server``
are installed, a ``redis-server`` without persistence on a free port of
127.0.0.1 and the peer's worker on it (``benchmarks/e2e_peers.py``:
``dramatiq --processes 1 --threads 8``, ``celery worker -P gevent -c 8``,
``huey_consumer -k thread -w 8``); an absent peer is reported as skipped,
with how to install it. ``--cpus`` places this process and the zqsync worker
as in ``bench_pool.py``; the peers and their Redis run on the zqsync worker's
CPUs. Every process is stopped by pid when the mode ends.

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
* ``Celery``: ``echo.delay(payload)``, results ignored (Celery's default);
  counted by an ``INCR`` each job makes once it ran, polled every 2 ms.
* ``huey``: ``echo(payload)`` on a ``RedisHuey`` (default settings); counted
  by its result store, which the consumer fills after each job, polled every 2 ms.

Each variant first runs one untimed round. Before each timed round, one
untimed job goes through and is waited for, so a dramatiq consumer that backed
off while idle (up to a second) is awake again.
A sanity row per variant that counts failed jobs (zqsync's ``jobs_failed``,
dramatiq's dead letters) checks they are 0; a failed Celery or huey job shows
as a round that never drains. One more row gives the zqsync
worker's CPU time per job over the timed rounds (user and system, every
thread, read from ``/proc``; the stats polls included): on one CPU, the
worker's own ceiling is one job per that many microseconds.

Plain mode runs here; gevent mode (the client monkey-patched, as in a gevent
web app) runs in a subprocess of this script (``--gevent``). It prints one
markdown table (jobs/s per variant, zqsync / each peer, dramatiq's with its target)
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
from typing import Any, Iterator, Optional

import zqsync
from benchmarks.e2e_peers import (
    CELERY,
    DRAMATIQ,
    HUEY,
    POLL,
    Variant,
    celery_variant,
    huey_variant,
    log_tail,
    redis_and_worker,
    unavailable,
)
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
from zqsync.processes import WorkerProcess


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
#: Seconds to wait for the warm-up job (a worker starting), and per 1000 jobs of a round.
START_TIMEOUT = 60.0
DRAIN_SECONDS_PER_1000 = 10.0


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
    """dramatiq with 1 process x 8 threads; ``echo.send(payload)``, counted by the worker's acks."""
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.errors import QueueJoinTimeout

    from benchmarks.dramatiq_jobs import QUEUE, declare

    command = [sys.executable, "-m", "dramatiq", "--processes", "1", "--threads", "8",
               "--worker-shutdown-timeout", "5000", "benchmarks.dramatiq_jobs"]
    with redis_and_worker(scratch, cpus, "dramatiq", command) as (url, worker, log_path), \
            contextlib.closing(RedisBroker(url=url)) as broker:
        actor = declare(broker)

        def drain(timeout: float) -> None:
            try:
                broker.join(QUEUE, interval=round(POLL * 1000), timeout=round(timeout * 1000))
            except QueueJoinTimeout:
                raise RuntimeError(f"dramatiq did not run its jobs within {timeout} s (exit status "
                                   f"{worker.poll()}):\n{log_tail(log_path)}") from None

        yield Variant(actor.send, drain, lambda: broker.client.zcard(f"dramatiq:{QUEUE}.XQ"))


#: The peers, in the order of the report, and how each runs.
PEERS = {DRAMATIQ: dramatiq_variant, CELERY: celery_variant, HUEY: huey_variant}


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
    skipped = {peer: unavailable(peer) for peer in PEERS}
    worker = WorkerProcess("zqsync.demo.tasks:registry", cwd=REPO_ROOT)
    with tempfile.TemporaryDirectory(prefix="zqsync-bench-dramatiq-") as scratch, contextlib.ExitStack() as stack:
        stack.callback(worker.stop)
        stack.enter_context(placed(worker.start(), layout))
        client = stack.enter_context(zqsync.Client(worker.endpoint, congestion="block"))
        variants = {"zqsync": zqsync_variant(client, worker)}
        cpus = os.sched_getaffinity(worker.pid) if hasattr(os, "sched_getaffinity") else set()
        for peer, start in PEERS.items():
            if skipped[peer] is None:
                variants[peer] = stack.enter_context(start(scratch, cpus))
        for variant in variants.values():  # an untimed round each: connections, caches, the worker's pools
            time_round(variant, settings.jobs)
        throughput: dict[str, list[float]] = {name: [] for name in variants}
        worker_cpu = -cpu_seconds(worker.pid)
        with progress(settings.rounds * len(variants), f"{mode}: end to end") as bar:
            for name in interleaved(list(variants), settings.rounds, bar):
                throughput[name].append(time_round(variants[name], settings.jobs))
        worker_cpu += cpu_seconds(worker.pid)
        failed = {name: variant.failed() for name, variant in variants.items() if variant.failed is not None}
    per_job = Row(mode, "zqsync worker: CPU per job, all threads, with the stats polls", worker_cpu * 1e6 /
                  (settings.rounds * (settings.jobs + 1)), "us")
    return [*result_rows(mode, throughput, failed, skipped), per_job]


def result_rows(mode: str, throughput: dict[str, list[float]], failed: dict[str, int],
                skipped: dict[str, Optional[str]]) -> list[Row]:
    """Jobs/s per variant (or a peer's skipped row), zqsync / each peer (dramatiq's with its target), the
    failed jobs where the peer counts them."""
    rows = [Row(mode, f"{name}: jobs end to end, enqueued and executed (median round)", statistics.median(per_round),
                "jobs/s", rounds=per_round) for name, per_round in throughput.items()]
    for peer, reason in skipped.items():
        if reason:
            rows.append(Row(mode, f"{peer}: {reason}", None, "jobs/s"))
            continue
        per_round = [a / b for a, b in zip(throughput["zqsync"], throughput[peer])]
        value = statistics.median(throughput["zqsync"]) / statistics.median(throughput[peer])
        measure = f"zqsync / {peer.split(',')[0]} jobs end to end (medians)"
        rows.append(checked(mode, measure, value, "x", ">=", MIN_RATIO, rounds=per_round) if peer == DRAMATIQ
                    else Row(mode, measure, value, "x", rounds=per_round))
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
    """Versions of dramatiq, Celery, huey, redis-py and redis-server, where installed."""
    found: dict[str, Any] = {}
    for name in ("dramatiq", "celery", "huey", "redis"):
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
