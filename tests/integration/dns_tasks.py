"""Tasks for the DNS discovery tests: each worker says who it is (``ZQSYNC_TEST_WORKER``) and logs its jobs."""

import os

from zqsync.worker import Registry

registry = Registry()


@registry.task
def where() -> str:
    """The name the test gave this worker."""
    return os.environ["ZQSYNC_TEST_WORKER"]


@registry.task
def note(key: str) -> None:
    """Append ``key`` to this worker's log (``ZQSYNC_TEST_LOG``): the tests count jobs at the workers."""
    with open(os.environ["ZQSYNC_TEST_LOG"], "a") as handle:
        handle.write(f"{key}\n")


_clients: dict = {}


@registry.task
def forward(endpoint: str, resolver: str) -> str:
    """Call ``where`` on the workers at ``endpoint`` through a client kept by this worker (its stats list it)."""
    import zqsync

    client = _clients.get(endpoint) or _clients.setdefault(endpoint, zqsync.Client(endpoint, resolver=resolver))
    return client.call("where")
