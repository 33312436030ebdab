"""Prefork scaling: a ``zqsync worker --processes N`` against one worker process, as ratios.

Run from the repository root::

    python benchmarks/bench_prefork.py [--quick | --smoke] [--json FILE]

One run starts every variant's ``zqsync worker zqsync.demo.tasks:registry``
(`zqsync.processes.WorkerProcess`, default concurrency), at once, on
free ports of 127.0.0.1, and stops each by pid at the end:

* ``one process``: a standalone worker, no supervisor;
* ``--processes 1``, ``--processes 2``, and ``--processes 4`` where this
  machine has at least 4 CPUs: direct prefork, the default: each child binds the supervisor's listening
  sockets (``worker/listeners.py``); their client sets ``ZQSYNC_EXPAND_PREFORK=1``, so it sends to every
  child's announced slot (``client/announce.py``);
* the same with ``--router``: the supervisor's router thread hands every message to a child
  (``worker/dispatch.py``).

Nothing is pinned: the point is how a worker uses every CPU. Two measures,
each run for every variant in turn (rotating order) before the next measure,
in rounds:

* **jobs**: one client process enqueues plain ``echo`` jobs (the ~150-byte
  payload of ``bench_pool.py``) one after another; the time runs from the
  first enqueue until the worker's ``zqsync.stats`` ``jobs_succeeded``
  (summed over the children under a supervisor) shows every job run, polled
  every 5 ms from this process;
* **calls**: one gevent client process (monkey-patched) makes ``echo`` calls
  from 50 greenlets; the time runs from the start signal until the last reply.

Each round also reads the CPU time (user + system, from ``/proc``) of the worker's processes (the
supervisor and its children) before and after: the **worker CPU per message** in µs, which stays
steady on a loaded machine where the rates swing. A jobs round includes the bench's own
``zqsync.stats`` polls at the end (a few per round).

The client runs in a subprocess of this script (``--client``), started and
warmed up (its connections open) before the clock starts. Each variant's
ratio to one process is the median of the per-round ratios (both measured
within seconds of each other, which cancels most of a noisy machine's drift).
Targets, from issue 22: ``--processes 2`` at least 1.5x one process's jobs/s
and 1.4x its calls/s; ``--processes 1`` at least 0.9x of both. This is a
benchmark, not a test: a missed target does not change the exit status.
"""

import os
import sys

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import contextlib
import dataclasses
import statistics
import subprocess
import time
from typing import Iterator, Optional

from benchmarks.harness import (
    PAYLOAD,
    REPO_ROOT,
    Row,
    base_parser,
    checked,
    describe,
    interleaved,
    progress,
    render_table,
    size_for,
    write_json,
)
from zqsync.processes import WorkerProcess, stop_process


@dataclasses.dataclass(frozen=True)
class Settings:
    """How much to measure."""

    rounds: int
    jobs: int  # per variant per round
    calls: int  # per variant per round


QUICK = Settings(rounds=3, jobs=5000, calls=2000)
FULL = Settings(rounds=7, jobs=20000, calls=5000)
#: Every code path once, with tiny counts: for the suite's smoke test, not for figures.
SMOKE = Settings(rounds=1, jobs=200, calls=100)
GREENLETS = 50
POLL = 0.005
#: Seconds a round may take per 1000 messages before the run fails.
SECONDS_PER_1000 = 10.0
#: Minimum ratio to one process, per (processes, measure).
TARGETS = {(1, "jobs"): 0.9, (1, "calls"): 0.9, (2, "jobs"): 1.5, (2, "calls"): 1.4}
ONE = "one process"


ROUTER = "--router"


def variants() -> dict[str, list[str]]:
    """Variant name -> extra ``zqsync worker`` arguments; ``--processes 4`` only with 4 CPUs or more."""
    counts = [1, 2] + ([4] if (os.cpu_count() or 1) >= 4 else [])
    return {ONE: [], **{f"--processes {n}": ["--processes", str(n)] for n in counts},
            **{f"--processes {n} {ROUTER}": ["--processes", str(n), ROUTER] for n in counts}}


def is_direct(worker: WorkerProcess) -> bool:
    """A direct prefork worker: its client expands the slots it announces."""
    return "--processes" in worker.extra_args and ROUTER not in worker.extra_args


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants, read from ``/proc``."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    tree, grew = {pid}, True
    while grew:
        grown = tree | {child for child, parent in parents.items() if parent in tree}
        grew, tree = grown != tree, grown
    return sum(times.get(member, 0.0) for member in tree)


@contextlib.contextmanager
def started_workers() -> Iterator[dict[str, WorkerProcess]]:
    """Every variant's worker, started; each stopped by pid on the way out."""
    workers: dict[str, WorkerProcess] = {}
    try:
        for name, extra in variants().items():
            workers[name] = WorkerProcess("zqsync.demo.tasks:registry", cwd=REPO_ROOT, extra_args=extra).start()
        yield workers
    finally:
        for worker in workers.values():
            worker.stop()


def start_client(mode: str, endpoint: str, count: int, expand: bool = False) -> subprocess.Popen:
    """A client subprocess (``--client``) that has connected and warmed up, waiting for its start line;
    with ``expand``, it sends to the slots a direct worker announces (``ZQSYNC_EXPAND_PREFORK``)."""
    env = {**os.environ, "ZQSYNC_EXPAND_PREFORK": "1" if expand else "0"}
    client = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--client", mode, endpoint, str(count)],
                              cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    if client.stdout is None or client.stdout.readline().strip() != "ready":
        stop_process(client)
        raise RuntimeError(f"the {mode} client for {endpoint} did not start")
    return client


def time_round(worker: WorkerProcess, mode: str, count: int) -> tuple[float, float]:
    """One round: messages per second (``count`` jobs run at the worker, or ``count`` calls answered), and
    the worker's CPU µs per message."""
    expected = worker.stats()["jobs_succeeded"] + 1 + count  # the client's warm-up job, then its round
    client = start_client(mode, worker.endpoint, count, expand=is_direct(worker))
    try:
        assert client.stdin is not None and client.stdout is not None
        cpu = cpu_seconds(worker.pid)
        started = time.perf_counter()
        client.stdin.write("go\n")
        client.stdin.flush()
        if client.stdout.readline().strip() != "done":
            raise RuntimeError(f"the {mode} client failed (status {client.wait(10)})")
        deadline = time.monotonic() + SECONDS_PER_1000 * max(1.0, count / 1000)
        while mode == "jobs" and worker.stats()["jobs_succeeded"] < expected:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not run {count} jobs in time")
            time.sleep(POLL)
        elapsed = time.perf_counter() - started
        return count / elapsed, (cpu_seconds(worker.pid) - cpu) / count * 1e6
    finally:
        stop_process(client)


def measure(settings: Settings) -> list[Row]:
    """Every variant and measure, interleaved in rounds; returns the report's rows."""
    counts = {"jobs": settings.jobs, "calls": settings.calls}
    rates: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    with started_workers() as workers:
        names = list(workers)
        for mode, count in counts.items():  # an untimed round each: connections, caches, the children's pools
            for name in names:
                time_round(workers[name], mode, max(1, count // 10))
        with progress(settings.rounds * len(names) * len(counts), "prefork rounds") as bar:
            for _ in range(settings.rounds):
                for mode, count in counts.items():
                    for name in interleaved(names, 1, bar):
                        rate, cpu = time_round(workers[name], mode, count)
                        rates.setdefault((name, mode), []).append(rate)
                        cpus.setdefault((name, mode), []).append(cpu)
                names = names[1:] + names[:1]
    return result_rows(rates) + [Row(name, f"{mode}: worker CPU per message (median round)", statistics.median(per),
                                     "us", rounds=per) for (name, mode), per in cpus.items()]


def result_rows(rates: dict[tuple[str, str], list[float]]) -> list[Row]:
    """Rate per variant and measure (median round), and each prefork variant's ratio to one process."""
    unit = {"jobs": "jobs/s", "calls": "calls/s"}
    what = {"jobs": "plain jobs end to end, enqueued and executed (median round)",
            "calls": f"calls from {GREENLETS} greenlets (median round)"}
    rows = [Row(name, f"{mode}: {what[mode]}", statistics.median(per_round), unit[mode], rounds=per_round)
            for (name, mode), per_round in rates.items()]
    for (name, mode), per_round in rates.items():
        if name == ONE:
            continue
        ratios = [a / b for a, b in zip(per_round, rates[(ONE, mode)])]
        measure = f"{mode}: {name} / one process (median of per-round ratios)"
        goal = TARGETS.get((int(name.split()[1]), mode))
        value = statistics.median(ratios)
        rows.append(checked(name, measure, value, "x", ">=", goal, rounds=ratios) if goal is not None
                    else Row(name, measure, value, "x", rounds=ratios))
    return rows


# -- the client subprocess ---------------------------------------------------------


def client_main(mode: str, endpoint: str, count: int) -> int:
    """Connect and warm up, say ``ready``, wait for a line, send ``count`` jobs or calls, say ``done``."""
    if mode == "calls":
        from gevent import monkey

        monkey.patch_all()
    import zqsync

    with zqsync.Client(endpoint, congestion="block") as client:
        if mode == "calls":
            import gevent

            def calls(n: int) -> None:
                for _ in range(n):
                    client.call("echo", PAYLOAD)

            def burst(total: int) -> None:
                gevent.joinall([gevent.spawn(calls, total // GREENLETS + (i < total % GREENLETS))
                                for i in range(GREENLETS)], raise_error=True)

            burst(GREENLETS)
            run = burst
        else:
            client.enqueue("echo", PAYLOAD)  # one warm-up job (the bench counts it)

            def run(total: int) -> None:
                for _ in range(total):
                    client.enqueue("echo", PAYLOAD)

        print("ready", flush=True)
        sys.stdin.readline()
        run(count)
        print("done", flush=True)
        sys.stdin.readline()  # or EOF: this process is stopped by pid
    return 0


# -- command line ---------------------------------------------------------------------


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """Command-line options (``--cpus`` is accepted for the suite's sake; nothing is pinned)."""
    parser = base_parser(__doc__, "fewer rounds, jobs and calls (about a minute)")
    parser.add_argument("--client", nargs=3, metavar=("MODE", "ENDPOINT", "COUNT"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def settings_for(args: argparse.Namespace) -> Settings:
    """``SMOKE``, ``QUICK`` or ``FULL``, per ``--smoke`` / ``--quick``."""
    return size_for(args, SMOKE, QUICK, FULL)


def rows_for(args: argparse.Namespace) -> list[Row]:
    """The rows for these options. Blocks for the run. :raises RuntimeError: a run failed."""
    return measure(settings_for(args))


def main(argv: Optional[list[str]] = None) -> int:
    """Run the benchmark (or, with ``--client``, one client), print the table, write the JSON."""
    args = parse_args(argv)
    if args.client:
        mode, endpoint, count = args.client
        return client_main(mode, endpoint, int(count))
    rows = rows_for(args)
    if args.json:
        write_json(args.json, describe(settings_for(args), args), rows)
    print(render_table(rows, "free"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
