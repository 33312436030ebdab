# ruff: noqa: E402  (gevent mode must monkey-patch before the imports below, as gevent requires)
"""Side-by-side benchmark: ``zqsync.aio.AsyncClient.call`` against one raw ``zmq.asyncio`` DEALER.

Run from the repository root::

    python benchmarks/bench_aio.py [--quick] [--gevent] [--json FILE]

One run starts its own worker (``zqsync.demo.tasks:registry``) and stops it by pid when done. In
one event loop it measures sequential ``echo`` round trips through the client (pool lease, per-call
deadline, reply-id check) and through one persistent ``zmq.asyncio`` DEALER that sends the same
frame (encoded per call, as :func:`benchmarks.harness.round_trip` does) and decodes the reply: no
pool, no deadline, no check. The two are interleaved in many short rounds, in rotating order, and
compared by their medians (of every call, and of the per-round ratios); the target (issue 26) is a
ratio of at most 1.15. ``--gevent`` runs it all under ``monkey.patch_all()`` (asyncio's selector
is then gevent's).

This is a benchmark, not a test: a missed target does not change the exit status.
"""

import os
import sys

if __name__ == "__main__" and "--gevent" in sys.argv[1:]:
    from gevent import monkey

    monkey.patch_all()

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import asyncio
import dataclasses
import gc
import statistics
import time
from typing import Any, Awaitable, Callable

import zmq
import zmq.asyncio

from benchmarks.harness import (
    CALL_TIMEOUT,
    PAYLOAD,
    RECV_TIMEOUT_MS,
    Row,
    base_parser,
    checked,
    describe,
    distribution,
    render_table,
    running_worker,
    size_for,
    write_json,
)
from zqsync.aio import AsyncClient
from zqsync.wire import envelope
from zqsync.wire.endpoints import split_endpoint

#: Target: the async client's call round trip over one raw zmq.asyncio DEALER's to the same worker.
MAX_RATIO = 1.15

Call = Callable[[Any], Awaitable[Any]]


@dataclasses.dataclass(frozen=True)
class Settings:
    rounds: int
    calls: int
    warmup: int


SMOKE = Settings(rounds=2, calls=50, warmup=10)
# Many short rounds: on a shared, noisy machine a burst of load then hits a round of each variant alike.
QUICK = Settings(rounds=21, calls=300, warmup=200)
FULL = Settings(rounds=41, calls=1000, warmup=500)


def raw_call(context: zmq.asyncio.Context, endpoint: str) -> tuple[Call, zmq.asyncio.Socket]:
    """One persistent zmq.asyncio DEALER: encode, send, receive, decode."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
    sock.connect(split_endpoint(endpoint)[1])

    async def call(payload: Any) -> Any:
        await sock.send(envelope.encode_request("call", os.urandom(16).hex(), "echo", (payload,), {},
                                                deadline=CALL_TIMEOUT))
        return envelope.decode_reply(await sock.recv()).result

    return call, sock


async def time_calls(call: Call, calls: int) -> tuple[list[float], float]:
    """Per-call latencies in microseconds of ``calls`` sequential awaited calls, and this process's CPU time
    per call over them (microseconds: the client's own cost, libzmq's I/O thread included, which a busy
    machine's scheduling noise barely touches)."""
    clock = time.perf_counter_ns
    elapsed = []
    cpu = time.process_time()
    for _ in range(calls):
        started = clock()
        await call(PAYLOAD)
        elapsed.append(clock() - started)
    return [ns / 1000.0 for ns in elapsed], (time.process_time() - cpu) / calls * 1e6


async def measure(endpoint: str, settings: Settings, mode: str) -> list[Row]:
    context = zmq.asyncio.Context()
    client = AsyncClient(endpoint)
    raw, sock = raw_call(context, endpoint)
    variants: dict[str, Call] = {"aio": lambda payload: client.call("echo", payload), "raw": raw}
    try:
        for call in variants.values():
            for _ in range(settings.warmup):
                result = await call(PAYLOAD)
            if result != PAYLOAD:
                raise RuntimeError(f"echo returned {result!r}")
        samples: dict[str, list[list[float]]] = {name: [] for name in variants}
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for index in range(settings.rounds):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                gc.collect()
                latencies, cpu_per_call = await time_calls(variants[name], settings.calls)
                samples[name].append(latencies)
                cpu[name].append(cpu_per_call)
    finally:
        client.close()
        sock.close()
        context.term()
    return rows(mode, samples, cpu)


def rows(mode: str, samples: dict[str, list[list[float]]], cpu: dict[str, list[float]]) -> list[Row]:
    """Median and p99 per variant over every round, its client CPU per call, and the ratios of medians."""
    result = {}
    for name, per_round in samples.items():
        everything = [us for one_round in per_round for us in one_round]
        result[name] = Row(mode, f"{name}: call round trip", statistics.median(everything), "us",
                           p99=statistics.quantiles(everything, n=100)[98],
                           rounds=[statistics.median(one_round) for one_round in per_round],
                           quantiles=distribution(everything))
    spent = [Row(mode, f"{name}: client CPU per call", statistics.median(per_round), "us", rounds=per_round)
             for name, per_round in cpu.items()]
    per_round = [a / b for a, b in zip(result["aio"].rounds or [], result["raw"].rounds or [])]
    ratio = checked(mode, "aio / raw zmq.asyncio (median)", result["aio"].value / result["raw"].value, "x",
                    "<=", MAX_RATIO, rounds=per_round)
    paired = checked(mode, "aio / raw zmq.asyncio (median of per-round ratios)", statistics.median(per_round), "x",
                     "<=", MAX_RATIO)
    return [*result.values(), ratio, paired, *spent]


def main() -> int:
    parser = base_parser(__doc__ or "", "about 10 s: 21 rounds of 300 calls per variant")
    parser.add_argument("--gevent", action="store_true", help="monkey-patch first (asyncio on gevent's selector)")
    args = parser.parse_args()
    settings = size_for(args, SMOKE, QUICK, FULL)
    mode = "gevent" if args.gevent else "plain"
    with running_worker(args.cpus) as worker:
        report = asyncio.run(measure(worker.endpoint, settings, mode))
    print(render_table(report, args.cpus))
    if args.json:
        write_json(args.json, {**describe(settings, args), "mode": mode}, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
