"""Side-by-side benchmark: real ``gunicorn -k gevent`` on ``zqsync/demo/webapp.py``, with and without zqsync.

Run from the repository root::

    python benchmarks/bench_gunicorn.py [--quick | --smoke] [--json FILE] [--cpus split|free] [--python-load]

One run starts a ``zqsync.demo.tasks`` worker (:class:`zqsync.processes.WorkerProcess`)
and ``gunicorn -k gevent -w 2 --preload`` serving the demo app plus one route
(``benchmarks/gunicorn_app.py``) with ``zqsync/demo/gunicorn_conf.py``
(:class:`zqsync.processes.GunicornProcess`), pointed at that worker, and stops
both by pid when done. With ``--cpus split`` (the default) gunicorn's
processes run on one CPU, and the zqsync worker and the load generator on
another, so the web processes' own cost sets the pace; ``--cpus free`` leaves
placement to the scheduler (on a small machine the figures then swing by 2x
from run to run, as connections land unevenly on the web processes).

Load: ``wrk`` (the Debian package: ``apt-get install -y wrk``) with one thread
and ``CONNECTIONS`` keep-alive connections; without it (or with
``--python-load``), a Python generator of ``PY_CONNECTIONS`` threads, one
keep-alive ``http.client`` connection each, which may saturate before
gunicorn does. The table names the generator. Routes, interleaved in rounds
in rotating order, each warmed up first so every web process has connected:

* ``/enqueue``: one ``enqueue`` per request through the app's pooled client;
* ``/call``: one ``call`` per request through the same client;
* ``/raw-call``: the same round trip by hand, the floor of ``/call``: a
  persistent ``zmq.green`` DEALER (4 per process), ``msgpack.packb``,
  pyzmq's green ``send``/``recv``, ``msgpack.unpackb``;
* ``/health``: no zqsync at all, the baseline;
* ``/enqueue-per-request``: one ``enqueue`` through a ``Client`` built and
  closed per request (a new context, socket and connection each time);
* ``/``: an ``enqueue`` and a ``call`` per request (the demo's main job).

Reported per route: requests per second (median round), latency p50 and p99,
the web processes' CPU per request (user + system, every thread, so
libzmq's I/O threads too: steady on a busy machine, where requests per
second are not; a route's CPU minus ``/health``'s is what zqsync costs in
place), and the TCP connections the worker accepted on its jobs endpoint
during the timed runs (the peer-side view of socket reuse); then pooled /
per-request, ``/enqueue`` / baseline and ``/call`` / baseline requests per
second, ``/call`` / ``/raw-call`` (zqsync's client against the same round trip by
hand), and a check that no request failed. This is a benchmark, not a test: a missed target does not change the
exit status.
"""

import os
import sys

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import contextlib
import dataclasses
import http.client
import importlib.util
import re
import shutil
import statistics
import subprocess
import threading
import time
from typing import Iterator, NamedTuple, Optional

from benchmarks.harness import (
    LAYOUTS,
    REPO_ROOT,
    Row,
    base_parser,
    checked,
    cpu_seconds,
    describe,
    distribution,
    interleaved,
    pin,
    progress,
    render_table,
    size_for,
    write_json,
)
from tests.helpers import children_of
from zqsync.processes import GunicornProcess, WorkerProcess

#: How to get what this scenario needs when it is missing.
INSTALL_HINT = "pip install -e '.[web]' (gunicorn, flask); apt-get install -y wrk for the load"
#: Routes measured, by short name.
ROUTES = {"enqueue": "/enqueue", "call": "/call", "raw call": "/raw-call", "no zqsync": "/health",
          "per-request Client": "/enqueue-per-request", "enqueue + call": "/?n=1"}
#: wrk's keep-alive connections (one wrk thread), and the Python generator's threads.
CONNECTIONS = 50
PY_CONNECTIONS = 16
WEB_WORKERS = 2
#: --cpus choices here.
PLACEMENTS = {
    "split": "gunicorn on one CPU; the zqsync worker and the load generator on another (default)",
    "free": LAYOUTS["free"],
}
#: Target: requests/s through the pooled client over a Client per request, at least parity.
MIN_POOLED_OVER_PER_REQUEST = 1.0
#: Target: requests/s with an enqueue per request over /health's (no zqsync at all).
MIN_ENQUEUE_OVER_HEALTH = 0.85
#: Target: requests/s with a call per request over /health's.
MIN_CALL_OVER_HEALTH = 0.7


@dataclasses.dataclass(frozen=True)
class Settings:
    """How long to load each route."""

    rounds: int
    duration: int  # seconds per route per round (wrk takes whole seconds)
    warmup: int  # seconds per route before timing


QUICK = Settings(rounds=2, duration=2, warmup=1)
FULL = Settings(rounds=3, duration=5, warmup=1)
#: Every code path once, with tiny counts: for the suite's smoke test, not for figures.
SMOKE = Settings(rounds=1, duration=1, warmup=1)


def gunicorn_unavailable() -> Optional[str]:
    """Why this scenario cannot run here (with how to install), or ``None`` when it can."""
    missing = [name for name in ("gunicorn", "flask") if importlib.util.find_spec(name) is None]
    return f"{' and '.join(missing)} not installed: {INSTALL_HINT}" if missing else None


class Load(NamedTuple):
    """One load run against one route."""

    ok: int  # 2xx responses
    failed: int  # other responses and socket errors
    seconds: float
    p50: float  # latency, microseconds
    p99: float
    quantiles: Optional[list[float]]  # 0th..100th percentile latency (microseconds), when known

    @property
    def rate(self) -> float:
        """Successful requests per second."""
        return self.ok / self.seconds


# -- load generators ---------------------------------------------------------------------

_UNITS_US = {"us": 1.0, "ms": 1000.0, "s": 1_000_000.0, "m": 60_000_000.0}


def _wrk_us(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(number) * _UNITS_US[unit]


def parse_wrk(output: str, seconds: float) -> Load:
    """A :class:`Load` from ``wrk --latency`` output.

    :raises RuntimeError: the output lacks the request count.
    """
    total = re.search(r"(\d+) requests in ([\d.]+)(ms|s|m)", output)
    if total is None:
        raise RuntimeError(f"unexpected wrk output:\n{output}")
    elapsed = float(total.group(2)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[total.group(3)]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    failed = (int(bad.group(1)) if bad else 0) + (sum(map(int, errors.groups())) if errors else 0)
    percentiles = dict(re.findall(r"^\s*(50|99)%\s+([\d.]+(?:us|ms|s|m))\s*$", output, re.MULTILINE))
    if len(percentiles) != 2:
        raise RuntimeError(f"no latency percentiles in wrk output:\n{output}")
    return Load(int(total.group(1)) - (int(bad.group(1)) if bad else 0), failed, elapsed or seconds,
                _wrk_us(percentiles["50"]), _wrk_us(percentiles["99"]), None)


def wrk_load(url: str, seconds: int, cpus: Optional[set[int]] = None) -> Load:
    """Load ``url`` for ``seconds`` with wrk (one thread, ``CONNECTIONS`` connections), on ``cpus``. Blocks."""
    command = ["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "--latency", "--timeout", "10s", url]
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    result = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60, check=True,
                            preexec_fn=pin)
    return parse_wrk(result.stdout, seconds)


def python_load(url: str, seconds: float, cpus: Optional[set[int]] = None) -> Load:
    """Load ``url`` for ``seconds`` from ``PY_CONNECTIONS`` threads, one keep-alive connection each. Blocks.

    With ``cpus``, this process runs on them for the duration.
    """
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    path = "/" + url.split("//", 1)[1].split("/", 1)[1]
    latencies: list[float] = []
    counts = {"ok": 0, "failed": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def one_connection() -> None:
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        mine, ok, failed = [], 0, 0
        while time.monotonic() < deadline:
            started = time.perf_counter_ns()
            try:
                connection.request("GET", path)
                response = connection.getresponse()
                response.read()
                good = response.status == 200
            except (OSError, http.client.HTTPException):
                connection.close()
                good = False
            mine.append((time.perf_counter_ns() - started) / 1000.0)
            ok, failed = ok + good, failed + (not good)
        connection.close()
        with lock:
            latencies.extend(mine)
            counts["ok"] += ok
            counts["failed"] += failed

    with pinned_self(cpus):
        started = time.perf_counter()
        threads = [threading.Thread(target=one_connection, daemon=True) for _ in range(PY_CONNECTIONS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
    spread = distribution(latencies) if len(latencies) > 1 else [0.0] * 101
    return Load(counts["ok"], counts["failed"], elapsed, spread[50], spread[99], spread)


@contextlib.contextmanager
def pinned_self(cpus: Optional[set[int]]) -> Iterator[None]:
    """Run this process's threads on ``cpus`` (if given) until the block ends, then restore."""
    if not cpus:
        yield
        return
    allowed = os.sched_getaffinity(0)
    pin(os.getpid(), cpus)
    try:
        yield
    finally:
        pin(os.getpid(), allowed)


# -- measuring -----------------------------------------------------------------------------


def place(layout: str, worker: WorkerProcess, web: GunicornProcess) -> Optional[set[int]]:
    """Pin gunicorn (master and workers) and the zqsync worker per ``layout``; returns the
    load generator's CPUs (``None``: unpinned)."""
    allowed = sorted(os.sched_getaffinity(0))
    if layout == "free" or len(allowed) < 2 or web.proc is None:
        return None
    for pid in [web.proc.pid, *children_of(web.proc.pid)]:
        pin(pid, {allowed[0]})
    pin(worker.pid, {allowed[-1]})
    return {allowed[-1]}


def generator(python: bool) -> str:
    """``"wrk"`` when it is installed and not overridden, else ``"python"``."""
    return "wrk" if not python and shutil.which("wrk") else "python"


def run_load(kind: str, url: str, seconds: int, cpus: Optional[set[int]]) -> Load:
    """One load run with the named generator, on ``cpus`` (``None``: anywhere)."""
    return wrk_load(url, seconds, cpus) if kind == "wrk" else python_load(url, seconds, cpus)


def settle(worker: WorkerProcess, timeout: float = 60.0) -> int:
    """Wait until the worker has run every job it received and no more arrive; returns its
    ``connections_jobs`` count then.

    Called between timed runs, so one route's backlog never eats the CPU of the next one's run.

    :raises RuntimeError: still busy after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    received = -1
    while True:
        stats = worker.stats()
        done = stats["jobs_succeeded"] + stats["jobs_failed"]
        if stats["jobs_received"] == received and done >= received:
            return stats["connections_jobs"]
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker still had jobs to run after {timeout} s: {stats}")
        received = stats["jobs_received"]
        time.sleep(0.05)


def measure_gunicorn(settings: Settings, layout: str = "split", *, python: bool = False) -> list[Row]:
    """Load every route, interleaved in rounds, against real gunicorn and a real worker; returns the rows."""
    missing = gunicorn_unavailable()
    if missing:
        raise RuntimeError(missing)
    kind = generator(python)
    loads: dict[str, list[Load]] = {name: [] for name in ROUTES}
    connections = dict.fromkeys(ROUTES, 0)
    cpu: dict[str, list[float]] = {name: [] for name in ROUTES}
    with WorkerProcess("zqsync.demo.tasks:registry", cwd=REPO_ROOT, extra_args=["--log-level", "warning"]) as worker:
        web = GunicornProcess("benchmarks.gunicorn_app:app", chdir=REPO_ROOT, config="python:zqsync.demo.gunicorn_conf",
                              workers=WEB_WORKERS, preload=True, env={"ZQSYNC_ENDPOINT": worker.endpoint})
        with web:
            cpus = place(layout, worker, web)
            for path in ROUTES.values():
                run_load(kind, web.url + path, settings.warmup, cpus)
            with progress(settings.rounds * len(ROUTES), f"gunicorn ({kind})") as bar:
                for name in interleaved(list(ROUTES), settings.rounds, bar):
                    before = settle(worker)
                    used = -web_cpu(web)
                    load = run_load(kind, web.url + ROUTES[name], settings.duration, cpus)
                    used += web_cpu(web)
                    loads[name].append(load)
                    cpu[name].append(used / max(1, load.ok + load.failed) * 1e6)
                    connections[name] += settle(worker) - before
    return gunicorn_rows(loads, connections, cpu, kind)


def web_cpu(web: GunicornProcess) -> float:
    """CPU seconds used so far by gunicorn's worker processes, every thread (libzmq's I/O threads too)."""
    assert web.proc is not None
    return sum(cpu_seconds(pid) for pid in children_of(web.proc.pid))


def gunicorn_rows(loads: dict[str, list[Load]], connections: dict[str, int], cpu: dict[str, list[float]],
                  kind: str) -> list[Row]:
    """Requests/s, latency, the web processes' CPU and new worker connections per route; the ratios; the
    failed-request check."""
    load = (f"wrk -t1 -c{CONNECTIONS}" if kind == "wrk" else f"Python load, {PY_CONNECTIONS} connections")
    mode = f"gunicorn -k gevent -w {WEB_WORKERS}"
    rates = {name: [one.rate for one in runs] for name, runs in loads.items()}
    median = {name: statistics.median(values) for name, values in rates.items()}
    rows = []
    for name, runs in loads.items():
        rows.append(Row(mode, f"{ROUTES[name]} ({name}): requests/s, {load}", median[name], "req/s",
                        rounds=rates[name]))
        quantiles = runs[-1].quantiles if kind == "python" else None
        rows.append(Row(mode, f"{ROUTES[name]} ({name}): latency p50", statistics.median(one.p50 for one in runs),
                        "us", p99=statistics.median(one.p99 for one in runs), rounds=[one.p50 for one in runs],
                        quantiles=quantiles))
        rows.append(Row(mode, f"{ROUTES[name]} ({name}): web processes' CPU per request (all threads)",
                        statistics.median(cpu[name]), "us", rounds=cpu[name]))
        rows.append(Row(mode, f"{ROUTES[name]} ({name}): TCP connections the worker accepted on its jobs endpoint",
                        connections[name], "connections"))
        rows.append(Row(mode, f"{ROUTES[name]} ({name}): failed requests", sum(one.failed for one in runs), "requests"))
    failed = sum(one.failed for runs in loads.values() for one in runs)
    return rows + [
        checked(mode, "/enqueue (pooled) / per-request Client requests/s (median)",
                median["enqueue"] / median["per-request Client"], "x", ">=", MIN_POOLED_OVER_PER_REQUEST,
                rounds=[a / b for a, b in zip(rates["enqueue"], rates["per-request Client"])]),
        checked(mode, "/enqueue (pooled) / /health (no zqsync) requests/s (median)",
                median["enqueue"] / median["no zqsync"], "x", ">=", MIN_ENQUEUE_OVER_HEALTH,
                rounds=[a / b for a, b in zip(rates["enqueue"], rates["no zqsync"])]),
        checked(mode, "/call (pooled) / /health (no zqsync) requests/s (median)",
                median["call"] / median["no zqsync"], "x", ">=", MIN_CALL_OVER_HEALTH,
                rounds=[a / b for a, b in zip(rates["call"], rates["no zqsync"])]),
        Row(mode, "/raw-call (a raw green DEALER round trip, the floor of /call) / /health requests/s (median)",
            median["raw call"] / median["no zqsync"], "x",
            rounds=[a / b for a, b in zip(rates["raw call"], rates["no zqsync"])]),
        Row(mode, "/call (pooled) / /raw-call requests/s (median)", median["call"] / median["raw call"], "x",
            rounds=[a / b for a, b in zip(rates["call"], rates["raw call"])]),
        Row(mode, "/raw-call / /call web processes' CPU per request (median)",
            statistics.median(cpu["raw call"]) / statistics.median(cpu["call"]), "x"),
        checked(mode, "failed requests (every route)", failed, "requests", "==", 0),
    ]


# -- command line ---------------------------------------------------------------------


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """Command-line options (``--cpus`` as in ``bench_pool.py``)."""
    parser = base_parser(__doc__, 'shorter loads (about 25 s)', layouts=PLACEMENTS)
    parser.add_argument("--python-load", action="store_true", help="use the Python load generator even if wrk exists")
    return parser.parse_args(argv)


def settings_for(args: argparse.Namespace) -> Settings:
    """``SMOKE``, ``QUICK`` or ``FULL``, per ``--smoke`` / ``--quick``."""
    return size_for(args, SMOKE, QUICK, FULL)


def rows_for(args: argparse.Namespace) -> list[Row]:
    """The rows for these options. Blocks for the run.

    :raises RuntimeError: gunicorn or flask is missing, or a process failed.
    """
    return measure_gunicorn(settings_for(args), args.cpus, python=args.python_load)


def main(argv: Optional[list[str]] = None) -> int:
    """Run the benchmark, print the table, write the JSON; always 0 unless a run failed."""
    args = parse_args(argv)
    rows = rows_for(args)
    if args.json:
        meta = {**describe(settings_for(args), args), "load": generator(args.python_load)}
        write_json(args.json, meta, rows)
    print(f"CPU layout `{args.cpus}`: {PLACEMENTS[args.cpus]}.\n")
    print(render_table(rows, args.cpus).split("\n", 2)[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
