"""The worker's own cost: a call through zqsync against a raw DEALER to a minimal pyzmq ROUTER echo.

Run from the repository root::

    python benchmarks/bench_worker.py [--quick | --smoke] [--json FILE]

One run starts a ``zqsync.demo.tasks`` worker (:func:`harness.running_worker`)
and a minimal echo process (this script with ``--echo``: one plain pyzmq
ROUTER that decodes each request and encodes its reply with zqsync's own
envelope, so both sides pay the same msgpack), both on the worker's CPU,
and stops both by pid. Interleaved in rounds, plain mode:

1. sequential ``Client.call("echo", payload)`` round trips to the worker;
2. a raw persistent DEALER to the echo process (the floor);
3. the worker's main-thread CPU per call, in situ: its ``utime + stime``
   from ``/proc/PID/task/PID/stat`` before and after each round of (1),
   divided by the round's calls (tick resolution: 10 ms per round).

This is a benchmark, not a test: a missed target does not change the exit status.
"""

import os
import sys

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import contextlib
import dataclasses
import functools
import statistics
import subprocess
from typing import Iterator, Optional

import zmq

import zqsync
from benchmarks.harness import (
    Env,
    Row,
    base_parser,
    checked,
    cpu_seconds,
    dealer,
    describe,
    interleaved,
    open_env,
    pin,
    progress,
    render_table,
    round_trip,
    running_worker,
    size_for,
    time_calls,
    warm_up,
    write_json,
)
from zqsync.processes import stop_process
from zqsync.wire import envelope


@dataclasses.dataclass(frozen=True)
class Settings:
    """How much to measure."""

    rounds: int
    calls: int
    warmup: int


QUICK = Settings(rounds=5, calls=2000, warmup=200)
SMOKE = Settings(rounds=2, calls=50, warmup=10)
FULL = Settings(rounds=7, calls=5000, warmup=500)


def echo() -> None:
    """The floor: a plain ROUTER that decodes each request and encodes its reply; prints its endpoint."""
    sock = zmq.Context().socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    print(f"tcp://127.0.0.1:{port}", flush=True)
    while True:
        identity, body = sock.recv_multipart()
        request = envelope.decode_request(body)
        sock.send_multipart([identity, envelope.encode_result(request.id, request.args[0])])


@contextlib.contextmanager
def echo_process(cpus: set[int]) -> Iterator[str]:
    """Start :func:`echo` in a child pinned to ``cpus``; yields its endpoint; stops it by pid."""
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--echo"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        endpoint = child.stdout.readline().strip()
        if cpus:
            pin(child.pid, cpus)
        yield endpoint
    finally:
        stop_process(child)


def measure(settings: Settings, layout: str) -> list[Row]:
    """Both variants interleaved in rounds, and the worker's CPU per call over the zqsync rounds."""
    samples: dict[str, list[list[float]]] = {"zqsync": [], "echo": []}
    cpu: list[float] = []
    with running_worker(layout) as worker, contextlib.ExitStack() as stack:
        worker_cpus = os.sched_getaffinity(worker.pid) if layout != "free" else set()
        echo_env = Env("", stack.enter_context(echo_process(worker_cpus)), stack.enter_context(
            open_env(worker.endpoint, green=False)).context)
        client = stack.enter_context(zqsync.Client(worker.endpoint))
        raw = dealer(echo_env)
        stack.callback(raw.close)
        calls = {"zqsync": functools.partial(client.call, "echo"), "echo": functools.partial(round_trip, raw)}
        for call in calls.values():
            warm_up(call, settings.warmup)
        bar = stack.enter_context(progress(settings.rounds * 2, "worker: sequential"))
        for name in interleaved(list(calls), settings.rounds, bar):
            before = cpu_seconds(worker.pid, worker.pid)
            samples[name].append(time_calls(calls[name], settings.calls))
            if name == "zqsync":
                cpu.append((cpu_seconds(worker.pid, worker.pid) - before) / settings.calls * 1e6)
    return rows(samples, cpu)


def rows(samples: dict[str, list[list[float]]], cpu: list[float]) -> list[Row]:
    """Medians per variant, the ratio (target <= 1.3x) and the CPU per call (target <= 50 us)."""
    medians = {name: [statistics.median(one) for one in per_round] for name, per_round in samples.items()}
    figures = [Row("plain", f"{'call' if name == 'zqsync' else 'raw DEALER to a pyzmq ROUTER echo'}: round trip",
                   statistics.median([us for one in per_round for us in one]), "us", rounds=medians[name])
               for name, per_round in samples.items()]
    ratios = [a / b for a, b in zip(medians["zqsync"], medians["echo"])]
    return [
        *figures,
        checked("plain", "call / raw DEALER to the echo (median)", figures[0].value / figures[1].value, "x",
                "<=", 1.3, rounds=ratios),
        checked("plain", "worker main-thread CPU per call, in situ", statistics.median(cpu), "us", "<=", 50.0,
                rounds=cpu),
    ]


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """Command-line options."""
    parser = base_parser(__doc__, "a smaller run (under about a minute)")
    parser.add_argument("--echo", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def rows_for(args: argparse.Namespace) -> list[Row]:
    """The report's rows (see the module docstring). Blocks for the whole run."""
    return measure(size_for(args, SMOKE, QUICK, FULL), args.cpus)


def main(argv: Optional[list[str]] = None) -> int:
    """Run the benchmark (or, with ``--echo``, serve as the echo process)."""
    args = parse_args(argv)
    if args.echo:
        echo()
        return 0
    result = rows_for(args)
    if args.json:
        write_json(args.json, describe(size_for(args, SMOKE, QUICK, FULL), args), result)
    print(render_table(result, args.cpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
