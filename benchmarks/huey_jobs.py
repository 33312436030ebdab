"""The huey side of ``bench_dramatiq.py``: an ``echo`` task on a :class:`RedisHuey`.

The benchmark starts the consumer as::

    ZQSYNC_BENCH_REDIS_URL=redis://127.0.0.1:PORT/0 huey_consumer benchmarks.huey_jobs.huey -k thread -w 8

and sends with :func:`make_huey` on the same URL. huey keeps each task's return
value in its result store by default: the benchmark counts the jobs that ran
with ``result_count()``, and flushes the store between rounds.
"""

from __future__ import annotations

import os
from typing import Any

from huey import RedisHuey

#: The environment variable naming the Redis URL of the consumer's storage.
REDIS_URL_VARIABLE = "ZQSYNC_BENCH_REDIS_URL"


def make_huey(url: str) -> tuple[RedisHuey, Any]:
    """A :class:`RedisHuey` on ``url`` (default settings) and its ``echo`` task."""
    queue = RedisHuey("zqsync-bench", url=url)

    @queue.task(name="echo")
    def echo(value: Any) -> Any:
        """The job: return ``value`` unchanged, like ``zqsync.demo.tasks.echo``."""
        return value

    return queue, echo


if os.environ.get(REDIS_URL_VARIABLE):  # the consumer's import: the instance it is named by (the sender makes its own)
    huey, echo = make_huey(os.environ[REDIS_URL_VARIABLE])
