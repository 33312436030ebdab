"""Results: a job id is a handle to the job's status and result.

    cd examples/docs && zqsync worker results --bind tcp://127.0.0.1:5555
    python examples/docs/results.py tcp://127.0.0.1:5555
"""

import sys

import zqsync
from zqsync.worker import Registry

registry = Registry()


@registry.task(store_result=True)  # plain jobs of this task keep their status and result
def thumbnail(image_id):
    return f"thumb-{image_id}.png"


@registry.task
def add(a, b):
    return a + b


def main(endpoint):
    with zqsync.Client(endpoint) as client:
        job = client.enqueue("thumbnail", 42)          # a Job: a str with .result(), .status(), .cancel()
        assert job.result(timeout=30) == "thumb-42.png"  # waits (a long-poll on the worker), then returns

        other = client.enqueue_with_options("add", args=(1, 2), store_result=True)  # ask for one job
        assert client.result(other, timeout=30) == 3     # the same, by id
        status = client.job(other)                       # a JobStatus, from the worker that holds it
        assert (status.state, status.result, status.attempts) == ("done", 3, 1), status
        print(status.state, status.result, f"{status.finished_at - status.enqueued_at:.3f} s")

        unkept = client.enqueue("add", 2, 2)             # neither the task nor the caller asked to keep it
        assert client.job(unkept).state in ("unknown", "pending", "running")


if __name__ == "__main__":
    main(sys.argv[1])
