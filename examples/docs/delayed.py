"""Delayed jobs: run no earlier than a delay from now, or than a given time; they survive a restart.

    cd examples/docs && zqsync worker delayed --bind tcp://127.0.0.1:5555 --state-dir /tmp/zq-delayed
    python examples/docs/delayed.py tcp://127.0.0.1:5555
"""

import datetime
import sys
import time

import zqsync
from zqsync.worker import Registry

registry = Registry()


@registry.task
def remind(user_id):
    return {"user": user_id, "at": time.time()}


def worker_settings(directory):
    return {"state_dir": f"{directory}/state"}  # delayed jobs are journaled: zqsync worker --state-dir


def main(endpoint):
    with zqsync.Client(endpoint) as client:
        sent = time.time()
        job = client.enqueue_with_options("remind", args=(7,), delay=0.5)  # seconds
        assert job.status().state == "scheduled"
        assert job.result(timeout=30)["at"] >= sent + 0.5

        at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=0.3)
        later = client.enqueue_with_options("remind", args=(8,), eta=at)  # an aware datetime
        assert later.result(timeout=30)["at"] >= at.timestamp()


if __name__ == "__main__":
    main(sys.argv[1])
