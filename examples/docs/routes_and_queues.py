"""Routes and named queues: bulk jobs on a queue of their own never hold the slots of the rest.

    cd examples/docs && zqsync worker routes_and_queues --bind tcp://127.0.0.1:5555 \
        --queue bulk:1=tcp://127.0.0.1:5600
    python examples/docs/routes_and_queues.py tcp://127.0.0.1:5555
"""

import sys
import time

import gevent

import zqsync
from zqsync.worker import Registry

registry = Registry()


@registry.task(name="imports.csv")
def import_csv(rows):
    gevent.sleep(0.3)


@registry.task(name="emails.render")
def render_email(address):
    return f"Welcome, {address}"


def worker_settings(directory):
    return {"queues": ("bulk:1=tcp://127.0.0.1:0",), "concurrency": 1}  # port 0: any free port


def main(endpoint):
    with zqsync.Client(endpoint) as admin:
        (bulk,) = [queue["endpoint"] for queue in admin.call("zqsync.stats")["queues"].values()]
    routes = {"imports.*": bulk, "*": endpoint}  # fnmatch patterns; exact names first, then in order, "*" last
    with zqsync.Client(routes=routes) as client:
        for _ in range(3):
            client.enqueue("imports.csv", 10_000)  # to the bulk queue: its one slot, one at a time
        while client.call("zqsync.stats")["queues"]["bulk"]["running"] == 0:
            time.sleep(0.01)
        started = time.monotonic()
        assert client.call("emails.render", "ada@example.org") == "Welcome, ada@example.org"
        assert time.monotonic() - started < 0.3  # answered while the bulk queue is busy
        print(client.stats()["routes"].keys())


if __name__ == "__main__":
    main(sys.argv[1])
