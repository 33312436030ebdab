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

2. **Healthy fast path** (``benchmarks/enqueue_floors.py``). ``Client.enqueue``
   (BLOCK and DROP) against two raw pyzmq DEALER loops sending the same job to
   the same running worker: one encoding with ``envelope.encode_request``
   (zqsync's encoder and its checks), one with ``msgpack.packb`` of the same
   dict. Plain sockets in plain mode, ``zmq.green`` ones in gevent mode.

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
from typing import Any, Iterator, Optional

import zqsync
from benchmarks.enqueue_floors import Send, measure_healthy
from benchmarks.harness import (
    PAYLOAD,
    REPO_ROOT,
    Row,
    base_parser,
    checked,
    describe,
    distribution,
    interleaved,
    placed,
    progress,
    render_table,
    size_for,
    time_calls,
    write_json,
)
from tests.helpers import wait_for
from tests.integration.test_congestion import PAYLOAD as FILL_PAYLOAD
from tests.integration.test_congestion import SMALL_HWM, fill_until_dropped
from zqsync.client.congestion import STATE, CongestionControl
from zqsync.processes import WorkerProcess
from zqsync.settings import ClientSettings


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
#: Targets: early drop against the no-early-drop baseline, early drop's p99 (the healthy path's: enqueue_floors.py).
MIN_EARLY_DROP_SPEEDUP = 100.0
MAX_EARLY_DROP_P99_US = 50.0


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
