"""Many greenlets waiting on results through one client: their failures, and a quick call's latency meanwhile.

An in-process worker (its own thread and hub, on loopback TCP) runs ``--waiters`` jobs that each sleep
``--job-seconds``; as many greenlets wait on their results (``client.result``, ``--timeout`` each) through
one client with ``--pool-size`` sockets per worker. Half a second in, one quick call is timed::

    python benchmarks/bench_result_waits.py                        # 500 waiters, 2 s jobs, pool size 4
    PYTHONPATH=/other/checkout python benchmarks/bench_result_waits.py  # the same against another checkout

Not a test: it prints one line and exits 0. The issue's targets (issue 25, item 1): 0 failures, and the
quick call under 100 ms.
"""

from __future__ import annotations

import argparse
import collections
import time

import gevent

import zqsync
from zqsync.worker import Registry
from zqsync.worker.inprocess import InProcessWorker

registry = Registry()


@registry.task
def nap(seconds: float, value: int) -> int:
    gevent.sleep(seconds)
    return value


@registry.task
def add(a: int, b: int) -> int:
    return a + b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waiters", type=int, default=500)
    parser.add_argument("--job-seconds", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=5.0, help="each waiter's result() timeout, seconds")
    parser.add_argument("--pool-size", type=int, default=4)
    args = parser.parse_args()
    worker = InProcessWorker(registry, concurrency=args.waiters + 10).start()
    try:
        with zqsync.Client(worker.endpoint, pool_size=args.pool_size) as client:
            jobs = [client.enqueue_with_options("nap", args=(args.job_seconds, index), store_result=True)
                    for index in range(args.waiters)]
            errors: collections.Counter[str] = collections.Counter()

            def wait(job: str) -> None:
                try:
                    client.result(job, timeout=args.timeout)
                except zqsync.ZqsyncError as exc:
                    errors[type(exc).__name__] += 1

            waiters = [gevent.spawn(wait, job) for job in jobs]
            gevent.sleep(0.5)
            started = time.monotonic()
            try:
                client.call_with_options("add", args=(2, 3), timeout=10.0)
                quick = f"{(time.monotonic() - started) * 1000:.1f} ms"
            except zqsync.ZqsyncError as exc:
                quick = f"{type(exc).__name__} after {time.monotonic() - started:.2f} s"
            gevent.joinall(waiters)
        print(f"{args.waiters} waiters on {args.job_seconds} s jobs, pool size {args.pool_size}: "
              f"failures {sum(errors.values())} {dict(errors)}; a quick call meanwhile {quick}")
    finally:
        worker.stop()


if __name__ == "__main__":
    main()
