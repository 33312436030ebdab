"""An example tasks module for a deployment: copy it, rename it, add your tasks.

Serve it from the directory that holds it::

    zqsync worker tasks:registry --bind tcp://127.0.0.1:5555 --state-dir /var/lib/zqsync

and enqueue from your app with ``zqsync.Client("tcp://127.0.0.1:5555").enqueue("send_welcome", "ada@example.org")``.
"""

from __future__ import annotations

import logging

from zqsync.worker import Registry

log = logging.getLogger(__name__)
registry = Registry()


@registry.task(retries=3, backoff=2.0)
def send_welcome(address: str) -> str:
    """Stand-in for a mail send: logs the address and returns it. Retried 3 times on failure."""
    log.info("welcome mail to %s", address)
    return address


@registry.task(time_limit=30.0)
def add(a: int, b: int) -> int:
    """Return ``a + b``; a call target for health checks and smoke tests."""
    return a + b
