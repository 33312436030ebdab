"""The Celery side of ``bench_dramatiq.py``: an ``echo`` task on a Redis broker, counted in Redis.

The benchmark starts the worker as::

    ZQSYNC_BENCH_REDIS_URL=redis://127.0.0.1:PORT/0 celery -A benchmarks.celery_jobs worker -P gevent -c 8 ...

and sends with :func:`make_app` on the same URL. Celery keeps no result by
default, so each job counts itself: one ``INCR`` of :data:`COUNTER` after it
ran (a loopback round trip per job, which the zqsync side does not pay).
"""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import Celery

#: The queue both sides use, and the Redis key counting the jobs that ran.
QUEUE = "zqsync-bench"
COUNTER = "zqsync-bench:celery-done"
#: The environment variable naming the Redis URL of the worker's broker.
REDIS_URL_VARIABLE = "ZQSYNC_BENCH_REDIS_URL"


def make_app(url: str) -> Celery:
    """A Celery app on the broker at ``url`` with the ``echo`` task on :data:`QUEUE`, results ignored."""
    app = Celery("zqsync_bench", broker=url)
    app.conf.update(task_default_queue=QUEUE, task_ignore_result=True, broker_connection_retry_on_startup=True,
                    worker_hijack_root_logger=False)
    counter = redis.Redis.from_url(url)

    @app.task(name="echo")
    def echo(value: Any) -> Any:
        """The job: return ``value`` unchanged, like ``zqsync.demo.tasks.echo``, and count itself."""
        counter.incr(COUNTER)
        return value

    return app


if os.environ.get(REDIS_URL_VARIABLE):  # the worker's import: the app ``celery -A`` finds (the sender makes its own)
    app = make_app(os.environ[REDIS_URL_VARIABLE])
