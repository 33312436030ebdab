"""Rate limits, soft time limits and expiry: bounds on how often, how long, and until when.

    cd examples/docs && zqsync worker limits --bind tcp://127.0.0.1:5555 --state-dir /tmp/zq-limits
    python examples/docs/limits.py tcp://127.0.0.1:5555
"""

import sys
import time

import gevent

import zqsync
from zqsync.worker import Registry

registry = Registry()


@registry.task(rate_limit="20/s", store_result=True)  # at most 20 starts a second, per worker process
def call_partner_api(order_id):
    return time.monotonic()


@registry.task(soft_time_limit=0.2, time_limit=5.0)
def render(report_id):
    try:
        gevent.sleep(10)  # too long
        return "full"
    except zqsync.SoftTimeLimitExceeded:  # 0.2 s in: time left to clean up before the hard limit
        return "partial"


@registry.task
def slow():
    gevent.sleep(0.5)


def worker_settings(directory):
    return {"state_dir": f"{directory}/state", "concurrency": 1}  # expiry of confirmed jobs: a journal


def main(endpoint):
    with zqsync.Client(endpoint) as client:
        jobs = [client.enqueue("call_partner_api", n) for n in range(5)]
        started = sorted(job.result(timeout=30) for job in jobs)
        assert started[-1] - started[0] >= 4 / 20 * 0.9  # 5 starts spaced by 1/20 s

        assert client.call("render", 1) == "partial"

        client.enqueue_with_options("slow", confirm=True)  # holds the only slot for 0.5 s
        job = client.enqueue_with_options("render", args=(2,), confirm=True, expires=0.1)
        try:
            job.result(timeout=30)
        except zqsync.JobExpired:  # not started within 0.1 s: it never ran
            print("expired:", job.status().state)


if __name__ == "__main__":
    main(sys.argv[1])
