# ruff: noqa: E402  (monkey-patching must come before the imports below, as gevent requires)
"""Where a confirmed job's time goes, per journal and durability setting (issue 24's PostgreSQL row).

Run from the repository root::

    python -m benchmarks.journal_profile [--rounds 7] [--jobs 2000] [--greenlets 50] [--json FILE]
                                         [--baseline DIR] [--server-cpu worker|client]

Four ``zqsync.demo.tasks`` workers run at once, each journaling differently: SQLite with
``--journal-sync normal`` (the default) and ``full``; PostgreSQL (``tests/pgserver.py``'s server, loopback)
with ``synchronous_commit = on`` (the server's default) and ``off`` (set on that variant's database only,
to size the share of the WAL flush). This process (``--greenlets`` greenlets sharing each round's confirmed
enqueues, one default client per worker) runs on the first CPU, the workers on the last; the PostgreSQL
server runs on the workers' CPU too (``--server-cpu client``: on this process's). Variants are measured
interleaved in rounds; every figure is a median of rounds. At the end the server's statistics of each
database's ``zqsync_jobs`` (sequential scans, rows they read) are printed.

With ``--baseline DIR`` (another checkout, e.g. ``main``'s), a fifth worker runs that checkout's zqsync
on PostgreSQL (``on``): the code before and after a change, side by side in the same rounds.

Per variant: confirmed jobs/s; CPU per job of this process, of the worker (every thread) and of the
PostgreSQL server (the postmaster and every child of it); and, from inside the worker (a
``sitecustomize`` wraps the journal's ``write_all``): the size of the batches committed (how many
confirms, outcomes and starts each carried) and the seconds each took in the writer thread, so the commit
time per batch and the jobs per commit give the floor a variant's throughput is held to. PostgreSQL
variants add the server's CPU per job. Each ``write_all`` is one transaction (one WAL flush with
``synchronous_commit = on``).
"""

from gevent import monkey

monkey.patch_all()

import argparse
import collections
import contextlib
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Iterator, NamedTuple, Optional

import zqsync
from benchmarks.bench_rq import WorkerIdle, time_batch
from benchmarks.harness import REPO_ROOT, Row, cpu_seconds, interleaved, pin, progress, render_table, write_json
from tests import pgserver
from zqsync.processes import WorkerProcess

#: The ``sitecustomize`` put on the workers' ``PYTHONPATH``: each journal ``write_all`` appends one line,
#: ``confirms outcomes starts seconds``, to ``$ZQSYNC_PROFILE_BATCHES``.
SHIM = '''
import os, sys, time
_path = os.environ.get("ZQSYNC_PROFILE_BATCHES")

class _Wrap:
    def find_spec(self, name, path=None, target=None):
        if name not in ("zqsync.worker.journal", "zqsync.worker.journal_pg"):
            return None
        sys.meta_path.remove(self)
        try:
            import importlib.util
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            cls = getattr(module, "Journal", None) or getattr(module, "PostgresJournal")
            write_all, out = cls.write_all, open(_path, "a", buffering=1)
            def timed(self, jobs=(), outcomes=(), starts=()):
                jobs, outcomes, starts = list(jobs), list(outcomes), list(starts)
                began = time.perf_counter()
                answer = write_all(self, jobs, outcomes, starts)
                out.write(f"{len(jobs)} {len(outcomes)} {len(starts)} {time.perf_counter() - began:.6f}\\n")
                return answer
            cls.write_all = timed
        spec.loader.exec_module = exec_module
        return spec

if _path:
    sys.meta_path.insert(0, _Wrap())
'''


#: The unit of each figure (``harness.number`` shows "x" with 3 decimals, the others with 1).
UNITS = {"confirmed jobs/s": "jobs/s", "write_all per job": "x", "writer thread busy share of the round": "x"}


class Batch(NamedTuple):
    confirms: int
    outcomes: int
    starts: int
    seconds: float


class Variant(NamedTuple):
    """One worker, its client and where its batches are logged; ``database`` for PostgreSQL ones."""

    worker: WorkerProcess
    client: zqsync.Client
    batches: str
    database: Optional[str]


def server_cpu(server: pgserver.Server) -> float:
    """CPU seconds of the PostgreSQL server so far: its postmaster and every live child."""
    total = 0.0
    for pid in server.pids():
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total


def table_scans(server: pgserver.Server, database: str) -> str:
    """What the server's statistics say of ``database``'s ``zqsync_jobs`` (they lag up to a second or so)."""
    import psycopg

    with psycopg.connect(server.local(server.url.rsplit("/", 1)[0] + "/" + database), autocommit=True) as db:
        row = db.execute("SELECT n_live_tup, seq_scan, seq_tup_read, idx_scan, autoanalyze_count FROM"
                         " pg_stat_user_tables WHERE relname = 'zqsync_jobs'").fetchone()
    return "live rows {}, sequential scans {} reading {} rows, index scans {}, autoanalyzes {}".format(*row or ())


def read_batches(path: str, skip: int) -> list[Batch]:
    """The batches logged at ``path`` after the first ``skip``."""
    with open(path) as handle:
        lines = handle.read().splitlines()[skip:]
    return [Batch(int(a), int(b), int(c), float(d)) for a, b, c, d in (line.split() for line in lines)]


@contextlib.contextmanager
def variants(scratch: str, server: Optional[pgserver.Server], baseline: Optional[str], server_cpu_of: str
             ) -> Iterator[dict[str, Variant]]:
    """The four workers (two without PostgreSQL), and with ``baseline`` a fifth, started; stopped by pid on
    the way out."""
    shim = os.path.join(scratch, "shim")
    os.makedirs(shim)
    with open(os.path.join(shim, "sitecustomize.py"), "w") as handle:
        handle.write(SHIM)
    kinds: dict[str, tuple[list[str], Optional[str], Optional[str]]] = {
        "SQLite, synchronous=NORMAL": (["--state-dir", os.path.join(scratch, "normal")], None, None),
        "SQLite, synchronous=FULL": (["--state-dir", os.path.join(scratch, "full"), "--journal-sync", "full"], None,
                                     None)}
    if server is not None:
        import psycopg

        for setting, code in [("on", None), ("off", None), *([("on", baseline)] if baseline else [])]:
            url = server.database()
            with psycopg.connect(server.admin_url, autocommit=True) as admin:
                admin.execute(f"ALTER DATABASE {url.rsplit('/', 1)[1]} SET synchronous_commit = {setting}")
            name = f"PostgreSQL, synchronous_commit={setting}" + (f", zqsync of {code}" if code else "")
            kinds[name] = (["--journal", url], url.rsplit("/", 1)[1], code)
    found: dict[str, Variant] = {}
    with contextlib.ExitStack() as stack:
        for index, (name, (args, database, code)) in enumerate(kinds.items()):
            batches = os.path.join(scratch, f"batches-{index}")
            open(batches, "w").close()
            path = os.pathsep.join([shim, code or os.environ.get("PYTHONPATH", REPO_ROOT)])
            # python -m zqsync imports from its working directory first, so the baseline runs in its checkout
            worker = WorkerProcess("zqsync.demo.tasks:registry", cwd=code or REPO_ROOT, extra_args=args,
                                   env={"PYTHONPATH": path, "ZQSYNC_PROFILE_BATCHES": batches})
            stack.callback(worker.stop)
            worker.start()
            client = zqsync.Client(worker.endpoint)
            stack.callback(client.close, linger=0)
            found[name] = Variant(worker, client, batches, database)
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) > 1:
            pin(os.getpid(), {cpus[0]})
            for variant in found.values():
                pin(variant.worker.pid, {cpus[-1]})
            for pid in server.pids() if server else []:  # on the workers' CPU by default, as in bench_rq
                pin(pid, {cpus[0] if server_cpu_of == "client" else cpus[-1]})
        yield found


def confirm(client: zqsync.Client) -> Callable[[Any], Any]:
    return lambda payload: client.enqueue_with_options("echo", args=(payload,), confirm=True)


def measure(found: dict[str, Variant], server: Optional[pgserver.Server], args: argparse.Namespace
            ) -> dict[str, dict[str, list[float]]]:
    """Per variant, per figure, one value per round (after one untimed round each)."""
    figures: dict[str, dict[str, list[float]]] = {name: collections.defaultdict(list) for name in found}
    idle = {name: WorkerIdle(variant.worker) for name, variant in found.items()}
    seen = {name: 0 for name in found}
    everything: dict[str, list[Batch]] = {name: [] for name in found}
    for name, variant in found.items():
        time_batch(confirm(variant.client), args.jobs, args.greenlets)
        idle[name](args.jobs)
    for name in found:
        seen[name] = len(read_batches(found[name].batches, 0))
    with progress(args.rounds * len(found), "rounds") as bar:
        for name in interleaved(list(found), args.rounds, bar):
            variant, jobs = found[name], args.jobs
            cpu_before = (cpu_seconds(os.getpid()), cpu_seconds(variant.worker.pid),
                          server_cpu(server) if server else 0.0)
            seconds = time_batch(confirm(variant.client), jobs, args.greenlets)
            client_cpu = cpu_seconds(os.getpid()) - cpu_before[0]
            idle[name](jobs)
            worker_cpu = cpu_seconds(variant.worker.pid) - cpu_before[1]
            pg_cpu = (server_cpu(server) if server else 0.0) - cpu_before[2]
            batches = read_batches(variant.batches, seen[name])
            seen[name] += len(batches)
            everything[name] += batches
            row = figures[name]
            row["confirmed jobs/s"].append(jobs / seconds)
            row["client CPU per job (us)"].append(client_cpu / jobs * 1e6)
            row["worker CPU per job, every thread (us)"].append(worker_cpu / jobs * 1e6)
            with_confirms = [batch for batch in batches if batch.confirms]
            row["confirms per committed batch (mean)"].append(statistics.mean(b.confirms for b in with_confirms))
            row["write_all per job"].append(len(batches) / jobs)
            row["write_all time, median (ms)"].append(statistics.median(b.seconds for b in batches) * 1e3)
            row["writer thread busy share of the round"].append(sum(b.seconds for b in batches) / seconds)
            if variant.database is not None:
                row["server CPU per job (us)"].append(pg_cpu / jobs * 1e6)
    for name, variant in found.items():
        if server is not None and variant.database is not None:
            print(f"{name}: zqsync_jobs {table_scans(server, variant.database)}", file=sys.stderr)
    for name, batches in everything.items():
        sizes = collections.Counter(min(batch.confirms, 9) for batch in batches if batch.confirms)
        total = sum(sizes.values())
        print(f"{name}: confirms per batch (9 = 9 or more): "
              + ", ".join(f"{size}: {count / total:.0%}" for size, count in sorted(sizes.items())), file=sys.stderr)
    return figures


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=2000, help="confirmed jobs per round")
    parser.add_argument("--greenlets", type=int, default=50)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--server-cpu", choices=["worker", "client"], default="worker",
                        help="the CPU the PostgreSQL server is pinned to (default: the workers', as in bench_rq)")
    parser.add_argument("--baseline", metavar="DIR", help="also a PostgreSQL worker running the zqsync of DIR "
                        "(a checkout, put first on its PYTHONPATH): before and after, side by side")
    args = parser.parse_args(argv)
    skipped = pgserver.unavailable()
    if skipped:
        print(f"PostgreSQL variants skipped: {skipped}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="zqsync-journal-profile-") as scratch, contextlib.ExitStack() as stack:
        server = None if skipped else pgserver.start()
        if server is not None:
            stack.callback(server.stop)
        found = stack.enter_context(variants(scratch, server, args.baseline, args.server_cpu))
        figures = measure(found, server, args)
    base = statistics.median(figures["SQLite, synchronous=NORMAL"]["confirmed jobs/s"])
    rows = []
    for name, row in figures.items():
        for measure_name, values in row.items():
            rows.append(Row(f"{args.greenlets} greenlets", f"{name}: {measure_name}", statistics.median(values),
                            UNITS.get(measure_name, ""), rounds=values))
        rows.append(Row(f"{args.greenlets} greenlets", f"{name} / SQLite NORMAL, jobs/s (medians)",
                        statistics.median(row["confirmed jobs/s"]) / base, "x"))
    print(render_table(rows, "split"))
    if args.json:
        write_json(args.json, {"rounds": args.rounds, "jobs": args.jobs, "greenlets": args.greenlets,
                               "started": time.time()}, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
