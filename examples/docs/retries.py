"""Retries: a failed job runs again after a backoff; with retry_on, only for those errors.

    cd examples/docs && zqsync worker retries --bind tcp://127.0.0.1:5555 --state-dir /tmp/zq-retries
    python examples/docs/retries.py tcp://127.0.0.1:5555
"""

import collections
import sys

import zqsync
from zqsync.worker import Registry

registry = Registry()
attempts = collections.Counter()  # in the worker process


@registry.task(retries=3, backoff=0.05, max_delay=1.0, jitter=0.5, retry_on=(ConnectionError,))
def fetch(url):
    attempts[url] += 1
    if url.startswith("bad:"):
        raise ValueError(f"not a URL: {url}")  # not in retry_on: final at once
    if attempts[url] < 3:
        raise ConnectionError("flaky network")  # retried: 0.05 s, then 0.1 s (jitter draws from the upper half)
    return f"{url} after {attempts[url]} attempts"


def worker_settings(directory):
    return {"state_dir": f"{directory}/state"}  # confirmed jobs need a journal: zqsync worker --state-dir


def main(endpoint):
    with zqsync.Client(endpoint) as client:
        job = client.enqueue_with_options("fetch", args=("https://example.org",), confirm=True)
        assert job.result(timeout=30) == "https://example.org after 3 attempts"
        assert job.status().attempts == 3

        bad = client.enqueue_with_options("fetch", args=("bad:url",), confirm=True)
        try:
            bad.result(timeout=30)
        except zqsync.RemoteError as exc:
            print("failed for good:", exc.remote_type, exc.remote_message)
        status = bad.status()
        assert (status.state, status.attempts) == ("dead", 1), status  # dead-lettered, kept in the journal


if __name__ == "__main__":
    main(sys.argv[1])
