"""gunicorn server hooks for apps that use zqsync.

Import them into your ``gunicorn.conf.py``::

    from zqsync.contrib.gunicorn import post_fork, worker_exit  # noqa: F401
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

from ..client import close_all

log = logging.getLogger(__name__)

#: Seconds each client may spend flushing queued jobs when a gunicorn worker exits.
EXIT_LINGER = 1.0


def post_fork(server: Any, worker: Any) -> None:
    """gunicorn ``post_fork`` hook: note that this worker builds its own sockets."""
    log.debug("gunicorn worker %d forked; zqsync opens its own sockets on first use", os.getpid())


def worker_exit(server: Any, worker: Any) -> None:
    """gunicorn ``worker_exit`` hook: close every zqsync client, bounded by :data:`EXIT_LINGER` seconds."""
    close_all(linger=EXIT_LINGER)
