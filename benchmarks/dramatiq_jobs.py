"""The dramatiq side of ``bench_dramatiq.py``: an ``echo`` actor on a Redis broker.

The benchmark starts the worker as::

    ZQSYNC_BENCH_REDIS_URL=redis://127.0.0.1:PORT/0 dramatiq --processes 1 --threads 8 benchmarks.dramatiq_jobs

Imported with that variable set, this module makes a :class:`RedisBroker` on
that URL the global broker and declares the actor on it, which is what the
``dramatiq`` command needs. The benchmark process itself declares the same
actor on its own broker with :func:`declare`.
"""

from __future__ import annotations

import os
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker

#: The queue both sides use.
QUEUE = "zqsync-bench"
#: The environment variable naming the Redis URL of the worker's broker.
REDIS_URL_VARIABLE = "ZQSYNC_BENCH_REDIS_URL"


def echo(value: Any) -> Any:
    """The job: return ``value`` unchanged, like ``zqsync.demo.tasks.echo``."""
    return value


def declare(broker: dramatiq.Broker) -> dramatiq.Actor:
    """The ``echo`` actor on ``broker``, queue :data:`QUEUE`; a failed job is dead-lettered at once (no retries)."""
    return dramatiq.actor(echo, actor_name="echo", queue_name=QUEUE, broker=broker, max_retries=0)


if os.environ.get(REDIS_URL_VARIABLE):
    dramatiq.set_broker(RedisBroker(url=os.environ[REDIS_URL_VARIABLE]))
    declare(dramatiq.get_broker())
