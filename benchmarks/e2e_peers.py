"""The end-to-end peers of ``bench_dramatiq.py``: dramatiq, Celery (``-P gevent``) and huey on redis-server.

Each peer, when its packages and ``redis-server`` are installed, gets a
``redis-server`` without persistence on a free port of 127.0.0.1 and one
worker process on it, both on the zqsync worker's CPUs, in their own session,
stopped by pid when the mode ends:

* dramatiq: ``dramatiq --processes 1 --threads 8 benchmarks.dramatiq_jobs``,
  counted by its own acknowledgements (``broker.join``);
* Celery: ``celery -A benchmarks.celery_jobs worker -P gevent -c 8`` (no
  heartbeat, gossip or mingle), counted by an ``INCR`` each job makes after it
  ran (Celery keeps no result by default);
* huey: ``huey_consumer benchmarks.huey_jobs.huey -k thread -w 8``, counted by
  its result store (``result_count()``), which huey fills by default.

A peer that is absent is reported as skipped, with how to install it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from typing import Any, Callable, Iterator, NamedTuple, Optional

from benchmarks.bench_rq import RedisServer
from benchmarks.harness import REPO_ROOT
from tests.helpers import wait_for
from zqsync.processes import stop_process

#: Seconds between polls of a worker's progress.
POLL = 0.002
DRAMATIQ = "dramatiq, 1 process x 8 threads"
CELERY = "Celery -P gevent, 1 process x 8 greenlets"
HUEY = "huey, 1 process x 8 threads"
#: Per peer: the modules it needs and how to install them.
NEEDS = {DRAMATIQ: (("dramatiq", "redis"), "pip install 'dramatiq[redis]' (or pip install -e .[bench])"),
         CELERY: (("celery", "redis"), "pip install 'celery[redis]'"),
         HUEY: (("huey", "redis"), "pip install huey redis")}
#: The environment variable the job modules read the Redis URL from.
REDIS_URL_VARIABLE = "ZQSYNC_BENCH_REDIS_URL"


class Variant(NamedTuple):
    """One way to run jobs: ``send(payload)`` enqueues one; ``drain(timeout)`` blocks until the worker
    has executed every job sent so far (raising after ``timeout`` seconds); ``failed()`` counts the
    jobs that failed at the worker, where the peer counts them (``None``: a failure shows as a drain
    that times out)."""

    send: Callable[[Any], Any]
    drain: Callable[[float], None]
    failed: Optional[Callable[[], int]]


def unavailable(peer: str) -> Optional[str]:
    """Why ``peer`` cannot run (with how to fix it), or ``None`` if it can."""
    modules, hint = NEEDS[peer]
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if shutil.which("redis-server") is None:
        missing.insert(0, "redis-server")
    return f"skipped: {', '.join(missing)} not found; install with: apt-get install redis-server; {hint}" \
        if missing else None


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
def peer_worker(command: list[str], redis_url: str, log_path: str) -> Iterator[subprocess.Popen]:
    """``command`` with :data:`REDIS_URL_VARIABLE` set to ``redis_url``, in its own session, logging to ``log_path``.

    Stopped by pid on the way out (TERM, then KILL); a process it forked and left
    behind is then killed through the session's process group.
    """
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


@contextlib.contextmanager
def redis_and_worker(scratch: str, cpus: set[int], name: str, command: list[str]) -> Iterator[tuple[str, Any, str]]:
    """A ``redis-server`` and ``command`` on it, both on ``cpus``; yields the URL, the worker and its log's path."""
    log_path = os.path.join(scratch, f"{name}.log")
    with contextlib.ExitStack() as stack, spawning_on(cpus):
        server = RedisServer(["--save", "", "--appendonly", "no"], os.path.join(scratch, f"redis-{name}"))
        stack.callback(server.stop)
        server.start()
        url = f"redis://127.0.0.1:{server.port}/0"
        worker = stack.enter_context(peer_worker(command, url, log_path))
        yield url, worker, log_path


def counted_drain(done: Callable[[], int], sent: list[int], worker: Any, log_path: str, name: str) -> Callable[[float], None]:
    """A ``drain(timeout)`` that waits until ``done()`` reaches ``sent[0]``, naming the worker's log on a timeout."""
    def drain(timeout: float) -> None:
        try:
            wait_for(lambda: done() >= sent[0], timeout=timeout, interval=POLL, what=f"{name} to run {sent[0]} jobs")
        except AssertionError as exc:
            raise RuntimeError(f"{exc} (exit status {worker.poll()}):\n{log_tail(log_path)}") from None

    return drain


@contextlib.contextmanager
def celery_variant(scratch: str, cpus: set[int]) -> Iterator[Variant]:
    """Celery with a gevent pool of 8; ``echo.delay(payload)``, counted by the jobs' ``INCR``."""
    import redis

    from benchmarks.celery_jobs import COUNTER, make_app

    command = [sys.executable, "-m", "celery", "-A", "benchmarks.celery_jobs", "worker", "-P", "gevent", "-c", "8",
               "--without-heartbeat", "--without-gossip", "--without-mingle", "--loglevel", "WARNING"]
    with redis_and_worker(scratch, cpus, "celery", command) as (url, worker, log_path):
        echo = make_app(url).tasks["echo"]
        counter = redis.Redis.from_url(url)
        sent = [0]

        def send(payload: Any) -> None:
            echo.delay(payload)
            sent[0] += 1

        try:
            yield Variant(send, counted_drain(lambda: int(counter.get(COUNTER) or 0), sent, worker, log_path,
                                              "Celery"), None)
        finally:
            counter.close()


@contextlib.contextmanager
def huey_variant(scratch: str, cpus: set[int]) -> Iterator[Variant]:
    """huey with 8 worker threads; ``echo(payload)``, counted by huey's result store."""
    from benchmarks.huey_jobs import make_huey

    command = [sys.executable, "-m", "huey.bin.huey_consumer", "benchmarks.huey_jobs.huey", "-k", "thread", "-w", "8"]
    with redis_and_worker(scratch, cpus, "huey", command) as (url, worker, log_path):
        queue, echo = make_huey(url)
        sent = [0]

        def send(payload: Any) -> None:
            echo(payload)
            sent[0] += 1

        yield Variant(send, counted_drain(queue.result_count, sent, worker, log_path, "huey"), None)
