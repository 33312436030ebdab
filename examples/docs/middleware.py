"""Middleware: hooks around every task a worker runs (timing, logging context, error reports).

    cd examples/docs && zqsync worker middleware --bind tcp://127.0.0.1:5555
    python examples/docs/middleware.py tcp://127.0.0.1:5555
"""

import collections
import sys
import time

import zqsync
from zqsync.worker import Middleware, Registry


class Outcomes(Middleware):
    """Counts each task's successes and failures, and keeps its slowest run (seconds)."""

    def __init__(self):
        self.counts = collections.defaultdict(collections.Counter)
        self.slowest = collections.defaultdict(float)
        self.started = {}

    def before_task(self, context):  # context.task, .job_id, .kind ("job" or "call"), .attempt, .args
        self.started[context.job_id] = time.perf_counter()

    def after_task(self, context, result, error):  # every attempt; error is None on success
        elapsed = time.perf_counter() - self.started.pop(context.job_id)
        self.counts[context.task]["failed" if error else "ok"] += 1
        self.slowest[context.task] = max(self.slowest[context.task], elapsed)

    def on_failure(self, context, error):  # the exception itself
        print(f"{context.task} failed: {error!r}")


outcomes = Outcomes()
registry = Registry(middleware=(outcomes,))  # or registry.add_middleware(Outcomes())


@registry.task
def divide(a, b):
    return a / b


@registry.task
def report():
    return {task: dict(counts) for task, counts in outcomes.counts.items()}


def main(endpoint):
    with zqsync.Client(endpoint) as client:
        assert client.call("divide", 6, 3) == 2.0
        try:
            client.call("divide", 1, 0)
        except zqsync.RemoteError as exc:
            assert exc.remote_type == "ZeroDivisionError"
        assert client.call("report")["divide"] == {"ok": 1, "failed": 1}


if __name__ == "__main__":
    main(sys.argv[1])
