"""Cancel: a pending or delayed job never runs; a running one is interrupted where it yields.

    cd examples/docs && zqsync worker cancel --bind tcp://127.0.0.1:5555 --state-dir /tmp/zq-cancel
    python examples/docs/cancel.py tcp://127.0.0.1:5555
"""

import sys

import gevent

import zqsync
from zqsync.worker import Registry

registry = Registry()


@registry.task
def report(month):
    gevent.sleep(60)  # a long task that yields
    return f"report {month}"


def worker_settings(directory):
    return {"state_dir": f"{directory}/state"}


def main(endpoint):
    with zqsync.Client(endpoint) as client:
        delayed = client.enqueue_with_options("report", args=("2026-11",), delay=3600)
        assert delayed.cancel().state == "cancelled"     # it never runs
        try:
            delayed.result(timeout=5)
        except zqsync.JobCancelled:
            print("cancelled before it ran")

        running = client.enqueue_with_options("report", args=("2026-12",), confirm=True)
        while running.status().state != "running":
            gevent.sleep(0.01)
        assert running.cancel().state == "cancelled"     # interrupted at its sleep, recorded cancelled
        assert client.job(running).state == "cancelled"  # the worker goes on with other jobs


if __name__ == "__main__":
    main(sys.argv[1])
