"""Phase 2 of ``bench_congestion.py``: enqueue on the healthy fast path against two raw floors.

``Client.enqueue`` (BLOCK and DROP, default settings) against two raw pyzmq
DEALER loops sending to the same running worker, one message per job with a
fresh job id each:

* **zqsync's encoder**: the loop sends ``envelope.encode_request(...)``, the
  frame the client builds (with its checks of the arguments' limits): what the
  client adds beyond encoding (pool, lease, congestion control);
* **msgpack.packb**: the loop sends ``msgpack.packb`` of the same dict, with no
  checks at all: what a user writing the loop by hand would pay.

Jobs go in bursts smaller than the buffers between the sender and the worker,
and the worker drains between bursts (outside the timing), so no send ever
waits and only the sender's CPU is measured. Twice: in plain mode with plain
sockets, and in gevent mode (every sender in a greenlet of this process's hub,
unpatched) with ``zmq.green`` ones.
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import time
from typing import Any, Callable, Iterator, Protocol

import msgpack
import zmq

import zqsync
from benchmarks.harness import PAYLOAD, Env, Row, checked, interleaved, open_env, progress, running_worker
from tests.helpers import wait_for
from zqsync.client import iosched
from zqsync.client.congestion import CongestionControl
from zqsync.processes import WorkerProcess
from zqsync.wire import envelope
from zqsync.wire.endpoints import split_endpoint

#: A sender: ``send(payload)`` enqueues one ``echo`` job.
Send = Callable[[Any], Any]
#: The two floors, by sender name.
ENCODER = "raw DEALER loop, zqsync's encoder"
PACKB = "raw DEALER loop, msgpack.packb"
#: Targets: each client's enqueue rate over a floor's, per mode (issue 28; no target: reported only).
MIN_RATE_RATIO = {(ENCODER, "plain"): 0.95, (ENCODER, "gevent"): 1.0, (PACKB, "plain"): 0.6}


class Sizes(Protocol):
    """What :func:`measure_healthy` reads of ``bench_congestion.Settings``."""

    rounds: int
    burst: int
    bursts: int
    warmup: int


def _raw_dealer(context: zmq.Context, endpoint: str, hwm: int) -> zmq.Socket:
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


def raw_senders(sock: zmq.Socket) -> dict[str, Send]:
    """The two floors' loop bodies on ``sock``: the same job dict, a fresh id per message."""

    def encoder(payload: Any) -> None:
        sock.send(envelope.encode_request("job", os.urandom(16).hex(), "echo", (payload,), {}))

    def packb(payload: Any) -> None:
        sock.send(msgpack.packb({"v": envelope.VERSION, "id": os.urandom(16).hex(), "kind": "job", "task": "echo",
                                 "args": [payload], "kwargs": {}}))

    return {ENCODER: encoder, PACKB: packb}


@contextlib.contextmanager
def healthy_senders(env: Env, drain: Drain) -> Iterator[dict[str, Send]]:
    """``Client.enqueue`` under BLOCK and under DROP, and both floors, each ``send(payload)``.

    The floors send with no pool, lease, deadline or congestion logic, on a
    context of their own whose I/O thread runs under the policy the client's job
    pools use (``zqsync/client/iosched.py``: ``SCHED_BATCH`` where allowed), so
    they are like for like.
    Each client first sends one job under BLOCK, counted in ``drain``, so its
    pooled socket is connected: under DROP, jobs sent before the handshake
    completes may be dropped.
    """
    block = zqsync.Client(env.endpoint, congestion=CongestionControl.BLOCK)
    drop = zqsync.Client(env.endpoint, congestion=CongestionControl.DROP)
    raw_context = type(env.context)()
    iosched.batch_io_threads(raw_context)
    sock = _raw_dealer(raw_context, env.endpoint, block.settings.hwm)
    try:
        for client in (block, drop):
            client.enqueue_with_options("echo", args=("connect",), congestion=CongestionControl.BLOCK)
            drain.sent(1)
        yield {"zqsync BLOCK": functools.partial(block.enqueue, "echo"),
               "zqsync DROP": functools.partial(drop.enqueue, "echo"), **raw_senders(sock)}
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


def measure_healthy(settings: Sizes, layout: str, mode: str) -> list[Row]:
    """Per-job send time of each healthy sender, in bursts interleaved across the variants.

    :param mode: ``"plain"``, or ``"gevent"``: every sender runs in a greenlet of this
        process's hub, so the client's pooled sockets and the raw loops' are ``zmq.green`` ones.
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


def time_senders(senders: dict[str, Send], drain: Drain, settings: Sizes) -> dict[str, list[list[float]]]:
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
    """Throughput per sender (median burst) and each client's enqueue rate over each floor's."""
    median = {name: statistics.median(us for one in rounds for us in one) for name, rounds in per_job.items()}
    round_medians = {name: [statistics.median(one) for one in rounds] for name, rounds in per_job.items()}
    group = f"healthy {mode}"
    rows = [Row(group, f"{name}: enqueue throughput (median of {burst}-job bursts)", 1e6 / median[name],
                "jobs/s", rounds=[1e6 / us for us in round_medians[name]]) for name in per_job]
    for name in (name for name in per_job if name.startswith("zqsync")):
        for floor in (ENCODER, PACKB):
            measure = f"{name} enqueue rate / {floor} ({mode})"
            ratio = median[floor] / median[name]
            rounds = [b / a for a, b in zip(round_medians[name], round_medians[floor])]
            goal = MIN_RATE_RATIO.get((floor, mode))
            rows.append(Row(group, measure, ratio, "x", rounds=rounds) if goal is None
                        else checked(group, measure, ratio, "x", ">=", goal, rounds=rounds))
    return rows
