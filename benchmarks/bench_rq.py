# ruff: noqa: E402  (gevent mode must monkey-patch before the imports below, as gevent requires)
"""Side-by-side benchmark: zqsync enqueue (plain and confirmed) against RQ's ``Queue.enqueue`` on Redis.

Run from the repository root::

    python benchmarks/bench_rq.py [--quick] [--json FILE] [--cpus split|shared|free] [--greenlets N]

Each mode starts its own ``zqsync.demo.tasks`` worker with a journal
(``--state-dir``, so it confirms jobs) and, when ``redis-server`` and the
``rq`` and ``redis`` packages are installed, two ``redis-server`` processes on
free ports of 127.0.0.1: one without persistence (``--save "" --appendonly
no``) and one with ``--appendonly yes --appendfsync everysec``, which, like
the worker's SQLite journal in WAL mode with ``synchronous=NORMAL``, keeps
what it acknowledged across a crash of the server process. Every process is
stopped by pid when the mode ends.

Variants, interleaved in rounds in rotating order, each enqueueing the
~150-byte payload of ``bench_pool.py`` to an ``echo`` task:

* ``zqsync enqueue``: ``Client.enqueue("echo", payload)`` (PUSH, at most
  once). Jobs go in bursts smaller than the send HWM, and the worker runs
  them all between bursts, outside the timing: the figure is the caller's
  cost, never a wait on a full queue.
* ``zqsync confirmed``: ``enqueue_with_options("echo", args=(payload,),
  confirm=True)``, which returns once the worker has committed the job to
  its journal. Concurrent callers share group commits.
* ``zqsync call`` (sequential mode only): ``Client.call("echo", payload)``,
  one round trip to the same worker, the floor a confirmation is held to
  (``zqsync confirmed / zqsync call``, target >= 0.7). The worker's CPU (every
  thread) per sequential confirmed job over its CPU per sequential call is a
  row too (target <= 2).
* ``RQ, ...``: ``Queue.enqueue(echo, payload)`` with :func:`echo` of this
  module. No RQ worker runs: only the enqueue is measured; the queue is
  emptied between batches, outside the timing.

Sequential mode runs here, with one caller. Concurrent mode runs in a
subprocess of this script (``--gevent``: ``monkey.patch_all()`` first) with
``--greenlets`` greenlets sharing each batch. Every zqsync client has the
default settings, as a user's would (the default ``pool_size`` caps the
confirmations in flight per owner and address); one more variant, ``zqsync
confirmed, pool_size=N`` with N the number of greenlets, shows what a pool as
large as the callers allows (a record, not the compared figure).

It prints one markdown table (throughput per variant, and the ratios
zqsync / RQ with their targets) and writes the same rows to ``--json FILE``.
This is a benchmark, not a test: a missed target does not change the exit
status.
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
import functools
import importlib.util
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from typing import Any, Callable, Iterator, NamedTuple, Optional, Sequence

import zqsync
from benchmarks import pg_journal
from benchmarks.harness import (
    LAYOUTS,
    PAYLOAD,
    REPO_ROOT,
    Row,
    checked,
    cpu_seconds,
    describe,
    interleaved,
    pin,
    placed,
    progress,
    render_table,
    rows_from_subprocess,
    size_flags,
    write_json,
)
from tests.helpers import wait_for
from zqsync.processes import ProcessFailed, WorkerProcess, stop_process


@dataclasses.dataclass(frozen=True)
class Settings:
    """How much to measure; ``QUICK`` fits well under a minute on a noisy 2-core machine."""

    rounds: int
    burst: int  # zqsync enqueue: jobs per burst, below the send HWM (1000) so no send waits
    bursts: int  # zqsync enqueue: bursts per round
    batch: int  # confirmed and RQ: jobs per round
    watchdog: float  # seconds the concurrent (gevent) mode may take before it is abandoned


QUICK = Settings(rounds=5, burst=500, bursts=10, batch=1000, watchdog=120.0)
FULL = Settings(rounds=9, burst=500, bursts=20, batch=3000, watchdog=600.0)
#: Target: zqsync confirmed over RQ (throughput, same concurrency). zqsync enqueue over RQ is a record,
#: not a target: even a raw pyzmq PUSH loop reaches only 63-100x RQ on a small machine.
MIN_CONFIRMED_RATIO = 5.0
#: Target: zqsync confirmed over zqsync's own call (round trip) rate, sequential.
MIN_CONFIRMED_OVER_CALL = 0.7
#: Target: the worker's CPU per sequential confirmed job over its CPU per sequential call.
MAX_CONFIRMED_CPU = 2.0
#: The RQ variants: redis-server options for each.
REDIS_CONFIGS = {
    "RQ, no persistence": ["--save", "", "--appendonly", "no"],
    "RQ, AOF everysec": ["--save", "", "--appendonly", "yes", "--appendfsync", "everysec"],
}
INSTALL_HINT = "install with: apt-get install redis-server; pip install rq redis (or pip install -e .[bench])"


def echo(value: Any) -> Any:
    """The RQ job function (no RQ worker runs it here): returns ``value``."""
    return value


def importable_echo() -> Callable[[Any], Any]:
    """:func:`echo` imported from ``benchmarks.bench_rq``.

    Run as a script this module is ``__main__``, and RQ would record the
    function as ``__main__.echo``, which no RQ worker could import.
    """
    from benchmarks.bench_rq import echo as function

    return function


def rq_unavailable() -> Optional[str]:
    """Why the RQ variants cannot run (with how to fix it), or ``None`` if they can."""
    missing = [name for name in ("rq", "redis") if importlib.util.find_spec(name) is None]
    if shutil.which("redis-server") is None:
        missing.insert(0, "redis-server")
    return f"skipped: {', '.join(missing)} not found; {INSTALL_HINT}" if missing else None


# -- processes --------------------------------------------------------------------


def _free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RedisServer:
    """A ``redis-server`` on a free port of 127.0.0.1, in its own session, stopped by pid.

    :param options: extra ``redis-server`` options (persistence).
    :param directory: its working directory (AOF files, log).
    """

    def __init__(self, options: Sequence[str], directory: str, *, ready_timeout: float = 10.0) -> None:
        self.options = list(options)
        self.directory = directory
        self.ready_timeout = ready_timeout
        self.log_path = os.path.join(directory, "redis.log")
        self.port = 0
        self.proc: Optional[subprocess.Popen] = None

    @property
    def pid(self) -> int:
        """The server's pid. :raises ProcessFailed: not started."""
        if self.proc is None:
            raise ProcessFailed("redis-server not started")
        return self.proc.pid

    def start(self, attempts: int = 3) -> "RedisServer":
        """Start it and wait until it answers; a port taken meanwhile is retried with another.

        :raises ProcessFailed: it did not answer ``attempts`` times.
        """
        os.makedirs(self.directory, exist_ok=True)
        for _ in range(attempts):
            self.port = _free_port()
            command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.directory,
                       "--daemonize", "no", *self.options]
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
            if self._answers():
                return self
            self.stop()
        with open(self.log_path, errors="replace") as log:
            raise ProcessFailed(f"redis-server did not start:\n{log.read()[-2000:]}")

    def _answers(self) -> bool:
        """Whether this very process (not another one on the port) answers within ``ready_timeout``."""
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1.0)
        deadline = time.monotonic() + self.ready_timeout
        try:
            while self.proc is not None and self.proc.poll() is None and time.monotonic() < deadline:
                try:
                    return int(client.info("server")["process_id"]) == self.proc.pid
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    time.sleep(0.02)
            return False
        finally:
            client.close()

    def stop(self) -> Optional[int]:
        """Stop it by pid (TERM, then KILL); returns its exit status."""
        return stop_process(self.proc) if self.proc else None


@contextlib.contextmanager
def running_servers(layout: str, scratch: str, with_redis: bool) -> Iterator[tuple[WorkerProcess, dict[str, Any]]]:
    """A journaling ``zqsync.demo.tasks`` worker and, if ``with_redis``, one Redis per ``REDIS_CONFIGS`` entry.

    This process is placed per ``layout`` as in ``bench_pool.py``; the Redis
    servers share the worker's CPUs. Everything is stopped by pid on the way out.
    """
    journal = os.path.join(scratch, "journal")
    worker = WorkerProcess("zqsync.demo.tasks:registry", cwd=REPO_ROOT, extra_args=["--state-dir", journal])
    servers: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        stack.callback(worker.stop)
        worker.start()
        for index, (name, options) in enumerate(REDIS_CONFIGS.items() if with_redis else ()):
            server = RedisServer(options, os.path.join(scratch, f"redis-{index}"))
            stack.callback(server.stop)
            servers[name] = server.start()
        stack.enter_context(placed(worker, layout))
        if hasattr(os, "sched_getaffinity") and os.path.isdir("/proc/self/task"):
            for server in servers.values():
                pin(server.pid, os.sched_getaffinity(worker.pid))
        yield worker, servers


# -- variants ---------------------------------------------------------------------


class Variant(NamedTuple):
    """One way to enqueue: ``send(payload)``, timed in batches of ``jobs``, ``batches`` per round;
    ``settle(jobs)`` runs after each batch, outside the timing; ``retries()``, if given, counts
    confirmations retried so far (a confirmation, or the wait for a pooled socket, over ``confirm_retry``)."""

    send: Callable[[Any], Any]
    jobs: int
    batches: int
    settle: Callable[[int], None]
    retries: Optional[Callable[[], int]] = None


class WorkerIdle:
    """Waits until the worker has run every job sent to it, so the next batch finds it idle."""

    def __init__(self, worker: WorkerProcess) -> None:
        self.worker = worker
        self.expected = worker.stats()["jobs_succeeded"]

    def __call__(self, jobs: int) -> None:
        """Record ``jobs`` more jobs sent, and wait until the worker has run them all."""
        self.expected += jobs
        wait_for(lambda: self.worker.stats()["jobs_succeeded"] >= self.expected, interval=0.002,
                 what=f"the worker to run {self.expected} jobs")


def confirmed_variant(client: zqsync.Client, settings: Settings, idle: WorkerIdle) -> Variant:
    """Confirmed enqueues of ``echo`` on ``client``, ``settings.batch`` per round."""
    def send(payload: Any) -> str:
        return client.enqueue_with_options("echo", args=(payload,), confirm=True)

    return Variant(send, settings.batch, 1, idle, lambda: client.stats()["confirm_retries"])


@contextlib.contextmanager
def zqsync_variants(worker: WorkerProcess, settings: Settings, callers: int) -> Iterator[dict[str, Variant]]:
    """``zqsync enqueue`` and ``zqsync confirmed`` on one client with the default settings.

    Concurrent mode adds ``zqsync confirmed`` on a client with ``pool_size=callers``: a
    confirmation holds its pooled socket until acknowledged, so the pool's cap bounds
    the confirmations in flight, and this variant shows the figure without that bound.
    """
    clients = [zqsync.Client(worker.endpoint)]
    idle = WorkerIdle(worker)
    variants = {"zqsync enqueue": Variant(functools.partial(clients[0].enqueue, "echo"), settings.burst,
                                          settings.bursts, idle),
                "zqsync confirmed": confirmed_variant(clients[0], settings, idle)}
    if callers == 1:  # the floor a confirm is held to: one round trip to the same worker
        variants["zqsync call"] = Variant(functools.partial(clients[0].call, "echo"), settings.batch, 1,
                                          lambda jobs: None)
    if callers > 1:
        clients.append(zqsync.Client(worker.endpoint, pool_size=callers))
        name = f"zqsync confirmed, pool_size={callers}"
        variants[name] = confirmed_variant(clients[1], settings, idle)
    try:
        yield variants
    finally:
        for client in clients:
            client.close(linger=0)


@contextlib.contextmanager
def postgresql_variant(settings: Settings, layout: str) -> Iterator[Variant]:
    """``zqsync confirmed`` to a worker whose journal is PostgreSQL (``benchmarks/pg_journal.py``),
    placed like the SQLite one."""
    with pg_journal.running_worker() as worker, placed(worker, layout), \
            contextlib.closing(zqsync.Client(worker.endpoint)) as client:
        yield confirmed_variant(client, settings, WorkerIdle(worker))


@contextlib.contextmanager
def rq_variant(server: RedisServer, settings: Settings) -> Iterator[Variant]:
    """``Queue.enqueue(echo, payload)`` to ``server``; the queue is checked and emptied after each batch."""
    import redis
    import rq

    connection = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=10.0)
    queue = rq.Queue("bench", connection=connection)

    def settle(jobs: int) -> None:
        if queue.count != jobs:
            raise RuntimeError(f"RQ queue holds {queue.count} jobs after a batch of {jobs}")
        queue.empty()

    try:
        yield Variant(functools.partial(queue.enqueue, importable_echo()), settings.batch, 1, settle)
    finally:
        connection.close()


# -- measuring --------------------------------------------------------------------


def time_batch(send: Callable[[Any], Any], jobs: int, callers: int) -> float:
    """Wall seconds for ``jobs`` sends, by this caller or shared by ``callers`` greenlets."""
    def one_caller(count: int) -> None:
        for _ in range(count):
            send(PAYLOAD)

    started = time.perf_counter()
    if callers == 1:
        one_caller(jobs)
    else:
        import gevent

        share, extra = divmod(jobs, callers)
        group = [gevent.spawn(one_caller, share + (index < extra)) for index in range(callers)]
        gevent.joinall(group, raise_error=True)
    return time.perf_counter() - started


class CpuPerJob(NamedTuple):
    """Microseconds of CPU per ``zqsync confirmed`` job, per round: this process over the timed sends
    (every thread), and the worker over the sends and the settling that follows (every thread: the
    hub, the journal's writer thread and libzmq's I/O thread), so every job is paid in full: journal,
    acknowledgement, run and outcome; and the worker's per ``zqsync call`` (sequential mode), the same way."""

    client: list[float]
    worker: list[float]
    call_worker: list[float]


def measure(variants: dict[str, Variant], settings: Settings, callers: int, mode: str,
            worker_pid: int) -> tuple[dict[str, list[float]], CpuPerJob]:
    """Throughput (jobs/s) per variant per round, after one untimed batch of each, and the CPU per
    ``zqsync confirmed`` job.

    :returns: per variant, one figure per round: its jobs over its timed seconds; and the CPU per job.
    """
    for variant in variants.values():
        time_batch(variant.send, variant.jobs, callers)
        variant.settle(variant.jobs)
    throughput: dict[str, list[float]] = {name: [] for name in variants}
    cpu = CpuPerJob([], [], [])
    with progress(settings.rounds * len(variants), mode) as bar:
        for name in interleaved(list(variants), settings.rounds, bar):
            variant = variants[name]
            seconds, client = 0.0, 0.0
            worker = cpu_seconds(worker_pid)
            for _ in range(variant.batches):
                client -= cpu_seconds(os.getpid())
                seconds += time_batch(variant.send, variant.jobs, callers)
                client += cpu_seconds(os.getpid())
                variant.settle(variant.jobs)
            jobs = variant.jobs * variant.batches
            throughput[name].append(jobs / seconds)
            worker = (cpu_seconds(worker_pid) - worker) / jobs * 1e6
            if name == "zqsync confirmed":
                cpu.client.append(client / jobs * 1e6)
                cpu.worker.append(worker)
            elif name == "zqsync call":
                cpu.call_worker.append(worker)
    return throughput, cpu


def measure_mode(settings: Settings, layout: str, callers: int) -> list[Row]:
    """Start the servers, measure every variant with ``callers`` callers, return the rows."""
    mode = "sequential" if callers == 1 else f"{callers} greenlets"
    skipped = rq_unavailable()
    with tempfile.TemporaryDirectory(prefix="zqsync-bench-rq-") as scratch, \
            running_servers(layout, scratch, skipped is None) as (worker, servers), \
            contextlib.ExitStack() as stack:
        variants = stack.enter_context(zqsync_variants(worker, settings, callers))
        for name, server in servers.items():
            variants[name] = stack.enter_context(rq_variant(server, settings))
        if pg_journal.unavailable() is None:
            variants[pg_journal.NAME] = stack.enter_context(postgresql_variant(settings, layout))
        throughput, cpu = measure(variants, settings, callers, mode, worker.pid)
        retries = {name: variant.retries() for name, variant in variants.items() if variant.retries}
    return throughput_rows(mode, throughput, skipped) + cpu_rows(mode, cpu) + retry_rows(mode, retries)


def cpu_rows(mode: str, cpu: CpuPerJob) -> list[Row]:
    """The CPU each confirmed job costs the client and the worker (medians of rounds): each side runs on
    one CPU in the default layout, so 1e6 / (us per job) bounds its jobs/s, whatever the other side does.
    Sequential mode adds the worker's CPU per call and the ratio of the two (target ``MAX_CONFIRMED_CPU``)."""
    rows = [Row(mode, f"zqsync confirmed: {side} CPU per job, every thread", statistics.median(per_round), "us",
                rounds=per_round) for side, per_round in (("client", cpu.client), ("worker", cpu.worker)) if per_round]
    if cpu.call_worker and cpu.worker:
        rows.append(Row(mode, "zqsync call: worker CPU per call, every thread", statistics.median(cpu.call_worker),
                        "us", rounds=cpu.call_worker))
        per_round = [a / b for a, b in zip(cpu.worker, cpu.call_worker)]
        value = statistics.median(cpu.worker) / statistics.median(cpu.call_worker)
        rows.append(checked(mode, "worker CPU per zqsync confirmed job / per zqsync call (medians)", value, "x",
                            "<=", MAX_CONFIRMED_CPU, rounds=per_round))
    return rows


def journal_floor(jobs: int) -> Row:
    """CPU per job of the journal alone, in this process: one transaction per job holding its insert
    (first attempt counted) and the previous job's outcome, as a worker's writer thread commits them for
    sequential confirms (``zqsync.worker.journal``: SQLite, WAL, ``synchronous=NORMAL``)."""
    from zqsync.wire import envelope
    from zqsync.worker.journal import Journal, Outcome

    body = envelope.encode_request("job", "job-0", "echo", (PAYLOAD,))
    with tempfile.TemporaryDirectory(prefix="zqsync-bench-journal-") as scratch:
        journal = Journal(scratch)
        journal.register()
        try:
            started = cpu_seconds(os.getpid())
            for index in range(jobs):
                journal.write_all([(f"job-{index}", "echo", body, 0, 0.0, 1.0)],
                                  [Outcome(f"job-{index - 1}", "done", 1, 0.0, None, b"")] if index else [])
            used = cpu_seconds(os.getpid()) - started
        finally:
            journal.close()
    return Row("sequential", "floor: one journal transaction per job (insert + previous outcome), CPU",
               used / jobs * 1e6, "us")


def retry_rows(mode: str, retries: dict[str, int]) -> list[Row]:
    """A sanity row per confirmed variant: confirmations retried (each waited over ``confirm_retry``)."""
    return [checked(mode, f"{name}: confirmations retried after confirm_retry (a sanity check)", count, "retries",
                    "==", 0) for name, count in retries.items()]


def throughput_rows(mode: str, throughput: dict[str, list[float]], skipped: Optional[str]) -> list[Row]:
    """A throughput row per variant (or a skipped row per RQ variant), then each zqsync / RQ ratio."""
    rows = [Row(mode, f"{name}: enqueue throughput (median round)", statistics.median(per_round), "jobs/s",
                rounds=per_round) for name, per_round in throughput.items()]
    rows += [Row(mode, f"{name}: {skipped}", None, "jobs/s") for name in REDIS_CONFIGS if skipped]
    for top, goal in (("zqsync enqueue", None), ("zqsync confirmed", MIN_CONFIRMED_RATIO)):
        for bottom in REDIS_CONFIGS:
            measure_name = f"{top} / {bottom} throughput"
            target = None if goal is None else f">= {goal:g}"
            if skipped:
                rows.append(Row(mode, f"{measure_name}: skipped", None, "x", target=target))
                continue
            per_round = [a / b for a, b in zip(throughput[top], throughput[bottom])]
            value = statistics.median(throughput[top]) / statistics.median(throughput[bottom])
            rows.append(Row(mode, f"{measure_name} (medians)", value, "x", rounds=per_round) if goal is None
                        else checked(mode, f"{measure_name} (medians)", value, "x", ">=", goal, rounds=per_round))
    rows.append(postgresql_ratio(mode, throughput))
    if "zqsync call" in throughput:
        per_round = [a / b for a, b in zip(throughput["zqsync confirmed"], throughput["zqsync call"])]
        value = statistics.median(throughput["zqsync confirmed"]) / statistics.median(throughput["zqsync call"])
        rows.append(checked(mode, "zqsync confirmed / zqsync call throughput (medians)", value, "x", ">=",
                            MIN_CONFIRMED_OVER_CALL, rounds=per_round))
    return rows


def postgresql_ratio(mode: str, throughput: dict[str, list[float]]) -> Row:
    """The PostgreSQL journal's confirmed throughput over the SQLite journal's, or a skipped row saying why."""
    name, skipped = f"{pg_journal.NAME} / zqsync confirmed (SQLite journal) throughput", pg_journal.unavailable()
    if skipped:
        return Row(mode, f"{name}: {skipped}", None, "x", target=f">= {pg_journal.MIN_RATIO:g}")
    ours, sqlite = throughput[pg_journal.NAME], throughput["zqsync confirmed"]
    return checked(mode, f"{name} (medians)", statistics.median(ours) / statistics.median(sqlite), "x", ">=",
                   pg_journal.MIN_RATIO, rounds=[a / b for a, b in zip(ours, sqlite)])


# -- modes --------------------------------------------------------------------------


def run_gevent(settings: Settings, layout: str, greenlets: int) -> list[Row]:
    """Concurrent mode, in this monkey-patched process, in a greenlet under a watchdog."""
    import gevent

    runner = gevent.spawn(measure_mode, settings, layout, greenlets)
    # A TERM from the parent fails the body, so every server is still stopped.
    gevent.signal_handler(signal.SIGTERM, runner.kill, RuntimeError("gevent-mode run stopped by SIGTERM"), False)
    return runner.get(timeout=settings.watchdog)


def run_gevent_subprocess(args: argparse.Namespace, settings: Settings) -> list[Row]:
    """Run this script with ``--gevent`` in a child process, stopped by pid, and collect its rows."""
    flags = ["--gevent", "--cpus", args.cpus, "--greenlets", str(args.greenlets), *size_flags(args)]
    return rows_from_subprocess(__file__, flags, settings.watchdog + 60.0)  # the child's own watchdog fires first


# -- command line ---------------------------------------------------------------------


def versions() -> dict[str, Any]:
    """Versions of RQ, redis-py and redis-server, where installed."""
    found: dict[str, Any] = {}
    for name in ("rq", "redis"):
        if importlib.util.find_spec(name) is not None:
            found[f"{name}_package"] = getattr(__import__(name), "__version__", None)
    if shutil.which("redis-server"):
        found["redis_server"] = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip()
    return found


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """Command-line options (``--cpus`` as in ``bench_pool.py``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and jobs (well under a minute)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows, settings and versions to FILE")
    parser.add_argument("--cpus", choices=LAYOUTS, default="split",
                        help="; ".join(f"{name}: {text}" for name, text in LAYOUTS.items()))
    parser.add_argument("--greenlets", type=int, default=50, help="callers in concurrent mode (default: 50)")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--gevent", action="store_true", help="run only the concurrent mode, in this process")
    modes.add_argument("--sequential-only", action="store_true", help="skip the concurrent-mode subprocess")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    """Run the benchmark, print the table, write the JSON; always 0 unless a run failed."""
    args = parse_args(argv)
    settings = QUICK if args.quick else FULL
    if args.gevent:
        rows = run_gevent(settings, args.cpus, args.greenlets)
    else:
        rows = measure_mode(settings, args.cpus, 1) + [journal_floor(settings.batch * 4)]
        if not args.sequential_only:
            rows += run_gevent_subprocess(args, settings)
    if args.json:
        meta = {**describe(settings, args), **versions(), "greenlets": args.greenlets}
        write_json(args.json, meta, rows)
    print(render_table(rows, args.cpus))
    print("\nRQ: enqueue cost only, no RQ worker runs. zqsync: a real worker runs every job, between batches.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
