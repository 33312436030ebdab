"""File descriptors: the process's ``RLIMIT_NOFILE``, raising it at start, and saying so when it runs out.

Every TCP connection costs one descriptor on each side, and every ZeroMQ socket one more for its
mailbox (``docs/operations.md``, "File descriptors and connections"). A process out of them fails
silently in libzmq:

* a bound socket's ``accept()`` fails with ``EMFILE``; libzmq leaves the connection in the kernel's
  backlog and retries at once (its listener is level-triggered), thousands of times a second, and
  tells only a socket monitor (``EVENT_ACCEPT_FAILED``, whose value is the errno). :func:`watch`
  reads such a monitor; the worker and the supervisor watch their bound sockets with it.
* a connecting socket's ``socket()`` call fails the same way; libzmq retries after its reconnect
  interval and tells no one the errno. The client pool asks :func:`out_of_fds` when a request fails
  (``pool.py``), off the fast path.

Either is logged at ERROR with the limits and a hint (at most one line per :data:`LOG_INTERVAL`
seconds and place) and counted.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import threading
import time
from typing import Any, Callable, Optional

import zmq
import zmq.utils.monitor

from .logs import RateLimitedLog

log = logging.getLogger(__name__)

#: The errnos of a process (``EMFILE``) or a system (``ENFILE``) out of file descriptors.
FD_ERRNOS = (errno.EMFILE, errno.ENFILE)
#: Seconds between two ERROR lines for one place.
LOG_INTERVAL = 10.0
#: Seconds :func:`watch` waits after counting an accept failure before it looks again.
PAUSE = 1.0
#: Most events :func:`watch` reads after a pause before it looks for a failure again (a monitor
#: queues at most 1000).
DRAIN_MAX = 1000
#: Events :func:`watch` wants from a bound socket's monitor.
ACCEPT_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_ACCEPT_FAILED
#: The counter of accept failures for want of descriptors, in a worker's stats.
ACCEPT_FAILED = "accept_failed_fds"
WORKER_HINT = ("clients cannot connect until descriptors free up: raise the limit (LimitNOFILE= in the systemd "
               "unit, docker run --ulimit nofile=N:N, ulimit -n N) or spread the clients over more workers "
               "(docs/operations.md, \"File descriptors and connections\")")
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


def watch(monitor: zmq.Socket, counts: dict[str, int], keys: dict[int, str], endpoint: str,
          pause: Callable[[float], Any], *, running: Callable[[], bool] = lambda: True,
          poll_ms: Optional[int] = None) -> None:
    """Read a bound socket's monitor (made with :data:`ACCEPT_EVENTS`) while ``running()``: each event
    whose number ``keys`` names adds one to ``counts[key]``; an accept failure for want of descriptors adds
    one to ``counts[ACCEPT_FAILED]`` (which must exist) and is logged (:func:`report`).

    After such a failure it calls ``pause(PAUSE)`` and then reads what queued meanwhile (at most
    ``DRAIN_MAX`` events) counting only ``keys``: libzmq retries the accept thousands of times a second,
    and reading every failure would cost a CPU. So the count grows by about one a second while the process is out of descriptors,
    and connections accepted or lost in that second may go uncounted once the monitor's queue is full.

    Blocks the calling greenlet (a ``zmq.green`` monitor) or thread, waking at least every
    ``poll_ms`` milliseconds to look at ``running()`` (``None``: it is killed instead).
    """
    while running():
        if not monitor.poll(poll_ms):
            continue
        event = zmq.utils.monitor.recv_monitor_message(monitor)
        if event["event"] == zmq.EVENT_ACCEPT_FAILED and event["value"] in FD_ERRNOS:
            counts[ACCEPT_FAILED] += 1
            report(f"accept() on {endpoint}", event["value"], WORKER_HINT)
            pause(PAUSE)
            for _ in range(DRAIN_MAX):  # it refills as fast as it is read while the failures go on
                if not monitor.poll(0):
                    break
                _count(zmq.utils.monitor.recv_monitor_message(monitor), counts, keys)
        else:
            _count(event, counts, keys)


def _count(event: Any, counts: dict[str, int], keys: dict[int, str]) -> None:
    key = keys.get(event["event"])
    if key:
        counts[key] += 1


class Watchers:
    """One thread per bound socket that :func:`watch`\\ es its monitor: for a process without a hub (the
    prefork supervisor, whose router thread owns the sockets). Make it before that thread starts.

    :param sockets: bound sockets; each gets a monitor (a socket has at most one).
    """

    #: Milliseconds between two looks of a thread at :meth:`stop`.
    POLL_MS = 200

    def __init__(self, sockets: list[zmq.Socket]) -> None:
        self._running = True
        self._counts: list[dict[str, int]] = []
        self._monitors: list[zmq.Socket] = []
        self._threads: list[threading.Thread] = []
        for sock in sockets:
            counts = {ACCEPT_FAILED: 0}
            monitor = sock.get_monitor_socket(ACCEPT_EVENTS)
            endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            thread = threading.Thread(target=watch, args=(monitor, counts, {}, endpoint, time.sleep),
                                      kwargs={"running": lambda: self._running, "poll_ms": self.POLL_MS},
                                      name="zqsync-accepts", daemon=True)
            self._counts.append(counts)
            self._monitors.append(monitor)
            self._threads.append(thread)
            thread.start()

    def failures(self) -> int:
        """Accept failures for want of descriptors counted so far, over every socket."""
        return sum(counts[ACCEPT_FAILED] for counts in self._counts)

    def stop(self) -> None:
        """Stop the threads and close the monitors; blocks up to about ``PAUSE`` seconds."""
        self._running = False
        for thread in self._threads:
            thread.join(PAUSE + 1.0)
        for monitor in self._monitors:
            monitor.close(linger=0)
