"""Time limits: a hard limit stops a task, a soft one asks it to stop first.

    cd examples/docs && zqsync worker time_limits --bind tcp://127.0.0.1:5555
    python examples/docs/time_limits.py tcp://127.0.0.1:5555
"""

import sys

import gevent

import zqsync
from zqsync.worker import Registry

registry = Registry()


@registry.task(time_limit=0.2)  # seconds
def crawl(seconds):
    gevent.sleep(seconds)  # I/O that yields: time.sleep too, under the worker's monkey-patching
    return "finished"


@registry.task(soft_time_limit=0.2, time_limit=5.0)
def render(seconds):
    try:
        gevent.sleep(seconds)
        return "rendered"
    except zqsync.SoftTimeLimitExceeded:  # 0.2 s in: up to 4.8 s left to clean up
        return "partial"


def main(endpoint):
    with zqsync.Client(endpoint) as client:
        assert client.call("crawl", 0.01) == "finished"
        try:
            client.call("crawl", 10)
        except zqsync.TimeLimitExceeded as exc:  # a RemoteError: the worker stopped the task
            print("stopped:", exc.remote_type)
        else:
            raise AssertionError("the time limit did not hold")
        assert client.call("render", 10) == "partial"


if __name__ == "__main__":
    main(sys.argv[1])
