"""Side-by-side benchmark: enqueue under congestion (early drop) and on the healthy fast path.

Run from the repository root::

    python benchmarks/bench_congestion.py [--quick] [--json FILE] [--cpus split|shared|free]

Each phase starts its own ``zqsync.demo.tasks`` worker with
:class:`zqsync.processes.WorkerProcess` and stops it by pid when done (a
stopped worker gets SIGCONT first).

1. **Stalled worker.** A worker with a 5-message receive HWM takes one job, so
   the client's PUSH connection exists (with ZMQ_IMMEDIATE a never-connected
   socket queues nothing), and is then stopped with SIGSTOP. 64 KiB jobs fill
   the buffers until the first drop. Then, interleaved in rounds, sequential
   ``enqueue`` throughput and per-enqueue latency of:

   a. ``DROP`` with early drop: the real :class:`zqsync.Client`, default
      ``wait_before_drop`` (1 ms);
   b. ``DROP`` without early drop, the baseline: the peer's congestion mark is
      cleared before every enqueue, so every job waits ``wait_before_drop``;
   c. ``BLOCK`` with a short deadline: every enqueue raises ``Congested``.

2. **Healthy fast path.** ``Client.enqueue`` (BLOCK and DROP) against a raw
   pyzmq PUSH loop sending the same frame (fresh job id per message) to the
   same running worker. Jobs go in bursts smaller than the buffers between
   the sender and the worker, and the worker drains between bursts (outside
   the timing), so no send ever waits and only the sender's CPU is measured.
   Twice: in plain mode against a plain PUSH loop, and in gevent mode (every
   sender in a greenlet of this process's hub, unpatched) against a
   ``zmq.green`` PUSH loop. Both raw loops encode with ``envelope.encode_request``.

It prints one markdown table and writes the same rows to ``--json FILE``.
This is a benchmark, not a test: a missed target does not change the exit
status.
"""

import os
import sys

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``tests`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import contextlib
import dataclasses
import functools
import signal
import statistics
import time
from typing import Any, Callable, Iterator, Optional

import zmq

import zqsync
from benchmarks.harness import (
    PAYLOAD,
    REPO_ROOT,
    Env,
    Row,
    base_parser,
    checked,
    describe,
    distribution,
    interleaved,
    open_env,
    placed,
    progress,
    render_table,
    running_worker,
    size_for,
    time_calls,
    write_json,
)
from tests.helpers import wait_for
from tests.integration.test_congestion import PAYLOAD as FILL_PAYLOAD
from tests.integration.test_congestion import SMALL_HWM, fill_until_dropped
from zqsync.client import iosched
from zqsync.client.congestion import STATE, CongestionControl
from zqsync.processes import WorkerProcess
from zqsync.settings import ClientSettings
from zqsync.wire import envelope
from zqsync.wire.endpoints import split_endpoint

#: A sender: ``send(payload)`` enqueues one ``echo`` job.
Send = Callable[[Any], Any]


@dataclasses.dataclass(frozen=True)
class Settings:
    """How much to measure; ``QUICK`` fits well under a minute on a noisy 2-core machine."""

    rounds: int
    early_drops: int  # (a) enqueues per round
    waiting_drops: int  # (b) enqueues per round, about wait_before_drop each
    block_timeouts: int  # (c) enqueues per round, about block_deadline each
    block_deadline: float  # (c) BLOCK's send_timeout, seconds
    burst: int  # healthy: jobs per burst, well below the sender's HWM so no send waits
    bursts: int  # healthy: bursts per variant per round
    warmup: int  # healthy: jobs per sender before timing


QUICK = Settings(rounds=5, early_drops=10000, waiting_drops=300, block_timeouts=60, block_deadline=0.005,
                 burst=500, bursts=10, warmup=1000)
FULL = Settings(rounds=9, early_drops=20000, waiting_drops=1000, block_timeouts=200, block_deadline=0.005,
                burst=500, bursts=40, warmup=2000)
#: Every code path once, with tiny counts: for the suite's smoke test, not for figures.
SMOKE = Settings(rounds=2, early_drops=200, waiting_drops=10, block_timeouts=4, block_deadline=0.005,
                 burst=100, bursts=2, warmup=100)
#: Targets: early drop against the no-early-drop baseline, early drop's p99, enqueue rate against raw pyzmq's
#: (a plain PUSH loop in plain mode, a zmq.green PUSH loop in gevent mode; both with zqsync's encoder).
MIN_EARLY_DROP_SPEEDUP = 100.0
MAX_EARLY_DROP_P99_US = 50.0
MIN_RATE_RATIO = {"plain": 0.85, "gevent": 1.0}


def _p99(samples: list[float]) -> float:
    """The 99th percentile of ``samples``."""
    return statistics.quantiles(samples, n=100)[98]


# -- phase 1: a stalled worker ---------------------------------------------------


@contextlib.contextmanager
def stalled_worker(layout: str) -> Iterator[zqsync.Client]:
    """A DROP client whose PUSH socket is connected to a worker that is then SIGSTOPped.

    The worker is resumed (SIGCONT) and stopped by pid on the way out, and the
    client closed without lingering.
    """
    worker = WorkerProcess("zqsync.demo.tasks:registry", cwd=REPO_ROOT, extra_args=SMALL_HWM)
    stopped = False
    try:
        with placed(worker.start(), layout):
            client = zqsync.Client(worker.endpoint, hwm=int(SMALL_HWM[1]), congestion=CongestionControl.DROP)
            try:
                # BLOCK: under DROP this first job would be dropped if the handshake took over 1 ms.
                client.enqueue_with_options("echo", args=("connect",), congestion=CongestionControl.BLOCK)
                wait_for(lambda: worker.stats()["jobs_received"] == 1, what="the connecting job")
                os.kill(worker.pid, signal.SIGSTOP)
                stopped = True
                yield client
            finally:
                client.close(linger=0)
    finally:
        if stopped:
            os.kill(worker.pid, signal.SIGCONT)
        worker.stop()


def stalled_variants(client: zqsync.Client, deadline: float) -> dict[str, Send]:
    """The three ways to enqueue to the stalled worker, each ``send(payload)``."""
    address = client.endpoints[0]

    def without_early_drop(payload: Any) -> None:
        # The no-early-drop baseline: with the mark gone, every job waits wait_before_drop, then drops.
        STATE._marked.discard(address)
        client.enqueue("echo", payload)

    def block(payload: Any) -> None:
        try:
            client.enqueue_with_options("echo", args=(payload,), congestion=CongestionControl.BLOCK,
                                        send_timeout=deadline)
        except zqsync.Congested:
            pass

    return {"a. DROP, early drop": functools.partial(client.enqueue, "echo"),
            "b. DROP, no early drop": without_early_drop,
            f"c. BLOCK, send_timeout={deadline * 1000:g} ms": block}


def top_up(client: zqsync.Client, deadline: float = 0.05, limit: int = 1_000_000) -> int:
    """Send ``PAYLOAD`` jobs under BLOCK until one waits ``deadline`` seconds in vain; returns how many were sent.

    The big jobs that filled the buffers leave room for many small ones (and
    the kernel may grow its TCP buffers): without this, the first rounds'
    small jobs would still get through the stopped worker's connection.
    """
    for sent in range(limit):
        try:
            client.enqueue_with_options("echo", args=(PAYLOAD,), congestion=CongestionControl.BLOCK,
                                        send_timeout=deadline)
        except zqsync.Congested:
            return sent
    raise RuntimeError(f"{limit} small jobs never filled the stopped worker's buffers")


def fill(client: zqsync.Client) -> dict[str, int]:
    """Fill the stopped worker's buffers for good, and leave its address marked congested.

    :returns: how many big and small jobs were buffered.
    """
    buffered = {f"{len(FILL_PAYLOAD) // 1024} KiB": fill_until_dropped(client), "small": top_up(client)}
    client.enqueue("echo", PAYLOAD)  # a successful BLOCK send cleared the mark: this one waits, drops, marks
    if not STATE.is_marked(client.endpoints[0]) or client.stats()["dropped"] < 2:
        raise RuntimeError("the stopped worker's address is not marked congested after filling its buffers")
    return buffered


def measure_stalled(settings: Settings, layout: str) -> list[Row]:
    """Throughput and latency of each stalled-worker variant, interleaved in rounds."""
    with stalled_worker(layout) as client:
        buffered = fill(client)
        variants = stalled_variants(client, settings.block_deadline)
        calls = dict(zip(variants, (settings.early_drops, settings.waiting_drops, settings.block_timeouts)))
        samples: dict[str, list[list[float]]] = {name: [] for name in variants}
        before = client.stats()["enqueued"]
        with progress(settings.rounds * len(variants), "stalled worker") as bar:
            for name in interleaved(list(variants), settings.rounds, bar):
                samples[name].append(time_calls(variants[name], calls[name]))
        leaked = client.stats()["enqueued"] - before
    return stalled_rows(samples, buffered, leaked)


def stalled_rows(samples: dict[str, list[list[float]]], buffered: dict[str, int], leaked: int) -> list[Row]:
    """How the buffers were filled; per variant a throughput row and a latency row; the targets; a sanity check."""
    rows = [Row("stalled", f"{size} jobs buffered before the stall held", count, "jobs")
            for size, count in buffered.items()]
    throughput: dict[str, list[float]] = {}
    for name, per_round in samples.items():
        throughput[name] = [len(one) / (sum(one) / 1e6) for one in per_round]
        latencies = [us for one in per_round for us in one]
        rows.append(Row("stalled", f"{name}: enqueue throughput (median round)",
                        statistics.median(throughput[name]), "jobs/s", rounds=throughput[name]))
        rows.append(Row("stalled", f"{name}: enqueue latency p50", statistics.median(latencies), "us",
                        p99=_p99(latencies), rounds=[statistics.median(one) for one in per_round],
                        quantiles=distribution(latencies)))
    early, waiting = list(samples)[:2]
    speedups = [a / b for a, b in zip(throughput[early], throughput[waiting])]
    early_latencies = [us for one in samples[early] for us in one]
    return rows + [
        checked("stalled", "a / b throughput (median round)",
                statistics.median(throughput[early]) / statistics.median(throughput[waiting]), "x",
                ">=", MIN_EARLY_DROP_SPEEDUP, rounds=speedups),
        checked("stalled", "a: enqueue latency p99", _p99(early_latencies), "us", "<=", MAX_EARLY_DROP_P99_US,
                rounds=[_p99(one) for one in samples[early]]),
        checked("stalled", "jobs sent while the worker was stopped (a sanity check)", leaked, "jobs", "==", 0),
    ]


# -- phase 2: the healthy fast path ------------------------------------------------


def _raw_push(context: zmq.Context, endpoint: str, hwm: int) -> zmq.Socket:
    """A plain DEALER (as the client uses) to the worker's jobs endpoint, with the client's send HWM."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.connect(split_endpoint(endpoint)[0])
    return sock


class Drain:
    """Counts the jobs sent to a worker and waits until it has received them all."""

    def __init__(self, worker: WorkerProcess) -> None:
        self.worker = worker
        self.expected = worker.stats()["jobs_received"]

    def sent(self, jobs: int) -> None:
        """Record ``jobs`` more jobs sent."""
        self.expected += jobs

    def wait(self) -> None:
        """Return once the worker received every job sent so far, so the next burst finds empty buffers."""
        wait_for(lambda: self.worker.stats()["jobs_received"] >= self.expected, interval=0.002,
                 what=f"the worker to receive {self.expected} jobs")


@contextlib.contextmanager
def healthy_senders(env: Env, drain: Drain) -> Iterator[dict[str, Send]]:
    """``Client.enqueue`` under BLOCK and under DROP, and a raw PUSH loop body, each ``send(payload)``.

    The raw body builds the frame the client builds, with a fresh job id per
    message, and sends it with no pool, lease, deadline or congestion logic, on
    a context of its own whose I/O thread runs under the policy the client's job
    pools use (``zqsync/client/iosched.py``: ``SCHED_BATCH`` where allowed), so
    the floor is like for like.
    Each client first sends one job under BLOCK, counted in ``drain``, so its
    pooled socket is connected: under DROP, jobs sent before the handshake
    completes may be dropped.
    """
    block = zqsync.Client(env.endpoint, congestion=CongestionControl.BLOCK)
    drop = zqsync.Client(env.endpoint, congestion=CongestionControl.DROP)
    raw_context = type(env.context)()
    iosched.batch_io_threads(raw_context)
    sock = _raw_push(raw_context, env.endpoint, block.settings.hwm)

    def raw(payload: Any) -> None:
        sock.send(envelope.encode_request("job", os.urandom(16).hex(), "echo", (payload,), {}))

    try:
        for client in (block, drop):
            client.enqueue_with_options("echo", args=("connect",), congestion=CongestionControl.BLOCK)
            drain.sent(1)
        yield {"zqsync BLOCK": functools.partial(block.enqueue, "echo"),
               "zqsync DROP": functools.partial(drop.enqueue, "echo"),
               "raw pyzmq PUSH": raw}
        if drop.stats()["dropped"]:
            raise RuntimeError("the healthy worker made the DROP client drop: the fast path was not measured")
    finally:
        sock.close()
        raw_context.destroy(linger=0)
        block.close(linger=0)
        drop.close(linger=0)


def time_burst(send: Send, jobs: int) -> float:
    """Microseconds per job of ``jobs`` back-to-back sends (one clock read per burst)."""
    started = time.perf_counter_ns()
    for _ in range(jobs):
        send(PAYLOAD)
    return (time.perf_counter_ns() - started) / 1000.0 / jobs


def measure_healthy(settings: Settings, layout: str, mode: str) -> list[Row]:
    """Per-job send time of each healthy sender, in bursts interleaved across the variants.

    :param mode: ``"plain"``, or ``"gevent"``: every sender runs in a greenlet of this
        process's hub, so the client's pooled sockets and the raw loop's are ``zmq.green`` ones.
    """
    with running_worker(layout) as worker, open_env(worker.endpoint, green=mode == "gevent") as env:
        def body() -> dict[str, list[list[float]]]:
            drain = Drain(worker)
            with healthy_senders(env, drain) as senders:
                return time_senders(senders, drain, settings)

        if mode == "gevent":
            import gevent

            per_job = gevent.spawn(body).get()
        else:
            per_job = body()
    return healthy_rows(per_job, settings.burst, mode)


def time_senders(senders: dict[str, Send], drain: Drain, settings: Settings) -> dict[str, list[list[float]]]:
    """Warm every sender up, then time bursts interleaved across them.

    :returns: per sender, per round, each burst's microseconds per job.
    """
    for send in senders.values():
        time_burst(send, settings.warmup)
        drain.sent(settings.warmup)
    drain.wait()
    per_job: dict[str, list[list[float]]] = {name: [[] for _ in range(settings.rounds)] for name in senders}
    slots_per_round = settings.bursts * len(senders)
    with progress(settings.rounds * slots_per_round, "healthy worker") as bar:
        slots = interleaved(list(senders), settings.rounds * settings.bursts, bar)
        for slot, name in enumerate(slots):
            per_job[name][slot // slots_per_round].append(time_burst(senders[name], settings.burst))
            drain.sent(settings.burst)
            drain.wait()
    return per_job


def healthy_rows(per_job: dict[str, list[list[float]]], burst: int, mode: str) -> list[Row]:
    """Throughput per sender (median burst) and each client's enqueue rate over the raw loop's."""
    median = {name: statistics.median(us for one in rounds for us in one) for name, rounds in per_job.items()}
    round_medians = {name: [statistics.median(one) for one in rounds] for name, rounds in per_job.items()}
    group = f"healthy {mode}"
    rows = [Row(group, f"{name}: enqueue throughput (median of {burst}-job bursts)", 1e6 / median[name],
                "jobs/s", rounds=[1e6 / us for us in round_medians[name]]) for name in per_job]
    raw = "raw pyzmq PUSH"
    loop = "raw green PUSH loop" if mode == "gevent" else "raw PUSH loop"
    for name in per_job:
        if name != raw:
            rows.append(checked(group, f"{name} enqueue rate / {loop}, same encoder ({mode})",
                                median[raw] / median[name], "x", ">=", MIN_RATE_RATIO[mode],
                                rounds=[b / a for a, b in zip(round_medians[name], round_medians[raw])]))
    return rows


# -- command line ---------------------------------------------------------------------


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """Command-line options (``--cpus`` as in ``bench_pool.py``)."""
    parser = base_parser(__doc__, 'fewer jobs and bursts (well under a minute)')
    return parser.parse_args(argv)


def settings_for(args: argparse.Namespace) -> Settings:
    """``SMOKE``, ``QUICK`` or ``FULL``, per ``--smoke`` / ``--quick``."""
    return size_for(args, SMOKE, QUICK, FULL)


def rows_for(args: argparse.Namespace) -> list[Row]:
    """Both phases (see :func:`parse_args` for the options); returns the report's rows. Blocks for the run."""
    settings = settings_for(args)
    return (measure_stalled(settings, args.cpus) + measure_healthy(settings, args.cpus, "plain")
            + measure_healthy(settings, args.cpus, "gevent"))


def main(argv: Optional[list[str]] = None) -> int:
    """Run both phases, print the table, write the JSON; always 0 unless a run failed."""
    args = parse_args(argv)
    settings = settings_for(args)
    rows = rows_for(args)
    if args.json:
        meta = {**describe(settings, args), "fill_payload_bytes": len(FILL_PAYLOAD), "stalled_hwm": int(SMALL_HWM[1]),
                "wait_before_drop": ClientSettings.from_env().wait_before_drop}
        write_json(args.json, meta, rows)
    print(render_table(rows, args.cpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
