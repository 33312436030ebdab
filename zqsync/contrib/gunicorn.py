"""gunicorn server hooks for apps that use zqsync.

Import them into your ``gunicorn.conf.py``::

    from zqsync.contrib.gunicorn import child_exit, post_fork, worker_exit  # noqa: F401
    worker_class = "gevent"

zqsync's pools already rebuild themselves in each forked worker (an
``os.register_at_fork`` hook plus a pid check on every lease), so a client
created at import time, even under ``--preload``, is safe. The hooks add a
log line per worker and close every client with a bounded linger when a
worker exits, so queued jobs get a chance to flush and exit never hangs on an
unreachable worker.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..client.client import close_all

log = logging.getLogger(__name__)

#: Seconds each client may spend flushing queued jobs when a gunicorn worker exits.
EXIT_LINGER = 1.0


#: This worker's metrics sync (``PROMETHEUS_MULTIPROC_DIR`` set), updated once more at exit.
_metrics: Any = None


def post_fork(server: Any, worker: Any) -> None:
    """gunicorn ``post_fork`` hook: log, and export metrics when ``PROMETHEUS_MULTIPROC_DIR`` is set
    (what the clients counted in the master before the fork is not counted again)."""
    global _metrics
    log.debug("gunicorn worker %d forked; zqsync opens its own sockets on first use", os.getpid())
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from .prometheus import MetricsSync

        _metrics = MetricsSync(baseline=True).start()


def child_exit(server: Any, worker: Any) -> None:
    """gunicorn ``child_exit`` hook (runs in the master): forget a dead worker's live gauges."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from .prometheus import mark_process_dead

        mark_process_dead(worker.pid)


def worker_exit(server: Any, worker: Any) -> None:
    """gunicorn ``worker_exit`` hook: export the metrics one last time (so a worker recycled by
    ``--max-requests`` or ``HUP`` loses none), then close every zqsync client, bounded by
    `EXIT_LINGER` seconds."""
    if _metrics is not None:
        _metrics.update()
    close_all(linger=EXIT_LINGER)
