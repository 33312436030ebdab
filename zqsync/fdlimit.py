"""File descriptors: the process's ``RLIMIT_NOFILE``, raising it at start, and saying so when it runs out.

Every TCP connection costs one descriptor on each side, and every ZeroMQ socket one more for its
mailbox (``docs/operations.md``, "File descriptors and connections"). A process out of them fails
silently in libzmq:

* a bound socket's ``accept()`` fails with ``EMFILE``; libzmq leaves the connection in the kernel's
  backlog and retries at once (its listener is level-triggered), tens of thousands of times a
  second, and tells only a socket monitor (``EVENT_ACCEPT_FAILED``, the errno as its value). That
  monitor is no use here: libzmq's I/O thread sends each event with a *blocking* send, so a reader
  that does not keep pace with the retries stalls every connection of the context (measured: calls on
  a live connection took 1-2 s instead of 0.3 ms). So a worker and a supervisor ask
  `look` once a second instead: can this process open one more descriptor?
* a connecting socket's ``socket()`` call fails the same way; libzmq retries after its reconnect
  interval and tells no one the errno. The client pool asks `out_of_fds` when a request fails or
  a job is dropped (``pool.py``), off the fast path.

Either is logged at ERROR with the limits and a hint (at most one line per `LOG_INTERVAL`
seconds and place) and counted.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
from typing import Optional

from .logs import RateLimitedLog

log = logging.getLogger(__name__)

#: The errnos of a process (``EMFILE``) or a system (``ENFILE``) out of file descriptors.
FD_ERRNOS = (errno.EMFILE, errno.ENFILE)
#: Seconds between two ERROR lines for one place.
LOG_INTERVAL = 10.0
#: Seconds between two looks of a worker or supervisor (`look`).
CHECK_INTERVAL = 1.0
WORKER_HINT = ("new clients cannot connect until descriptors free up (libzmq retries accept() silently): raise "
               "the limit (LimitNOFILE= in the systemd unit, docker run --ulimit nofile=N:N, ulimit -n N) or spread "
               "the clients over more workers (docs/operations.md, \"File descriptors and connections\")")
CLIENT_HINT = ("raise this process's limit (LimitNOFILE=, ulimit -n N) or lower ZQSYNC_POOL_SIZE or the endpoints "
               "listed (docs/operations.md, \"File descriptors and connections\")")
_errors = RateLimitedLog(log, LOG_INTERVAL)


def limits() -> dict[str, int]:
    """This process's ``RLIMIT_NOFILE``: ``{"soft", "hard"}``, ``-1`` for unlimited."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {"soft": _number(soft), "hard": _number(hard)}


def _number(limit: int) -> int:
    return -1 if limit == resource.RLIM_INFINITY else int(limit)


def raise_soft_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit (children inherit it) and log the
    figure at INFO; returns the soft limit now. An unlimited hard limit (macOS) leaves the soft one as it is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard or hard == resource.RLIM_INFINITY:
        log.info("RLIMIT_NOFILE %d (hard %d): at most that many descriptors, for connections and files",
                 _number(soft), _number(hard))
        return int(soft)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning("RLIMIT_NOFILE stays at %d: could not raise it to the hard limit %d (%s)", soft, hard, exc)
        return int(soft)
    log.info("RLIMIT_NOFILE raised from %d to %d (the hard limit): at most that many descriptors, "
             "for connections and files", soft, hard)
    return int(hard)


def report(where: str, code: int, hint: str) -> None:
    """Log at ERROR (rate-limited per ``where``) that ``where`` failed for want of descriptors (errno ``code``)."""
    now = limits()
    _errors.error(where, "%s: out of file descriptors (%s, RLIMIT_NOFILE soft %d, hard %d): %s",
                  where, errno.errorcode.get(code, str(code)), now["soft"], now["hard"], hint)


def out_of_fds() -> Optional[int]:
    """The errno if this process cannot open one more descriptor now (``EMFILE``/``ENFILE``), else ``None``.
    Costs an ``open`` and a ``close`` of ``/dev/null``."""
    try:
        fd = os.open(os.devnull, os.O_RDONLY)
    except OSError as exc:
        return exc.errno if exc.errno in FD_ERRNOS else None
    os.close(fd)
    return None


def look(where: str) -> bool:
    """A worker's or supervisor's look, every `CHECK_INTERVAL` seconds: ``True`` if it cannot open one
    more descriptor, which it then logs (`report`, naming ``where``). Costs an ``open`` and a ``close``."""
    code = out_of_fds()
    if code is None:
        return False
    report(where, code, WORKER_HINT)
    return True
