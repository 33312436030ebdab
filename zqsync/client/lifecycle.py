"""Process-wide lifecycle of socket pools: fork and interpreter exit (docs/design.md, pool rules 9 and 11).

Every `SocketPool` registers here. After ``fork`` the
child resets each pool, and sockets or contexts inherited from the parent are
kept referenced in ``_common.orphans``, never closed: a close in the child would
write into the parent's I/O thread mailbox (pyzmq's pid guard would skip it
anyway, but nothing here relies on garbage collection order). At interpreter
exit every pool of this process is closed with its bounded linger.

The sweeper (pool rule 8): once a process has pooled sockets, a native daemon
thread wakes every ``SWEEP_EVERY`` seconds and closes the idle sockets of
owners that ended (threads that finished, hubs destroyed), so their
connections go away even if the pool is never leased again. A round costs a
lock and a liveness check per owner of each pool.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import weakref
from typing import Any, Callable

import zmq

from .. import _common

log = logging.getLogger(__name__)

#: Seconds between two rounds of the sweeper thread.
SWEEP_EVERY = 2.0
#: Pools alive in this process.
pools: "weakref.WeakSet[Any]" = weakref.WeakSet()
_fork_callbacks: list[Callable[[], None]] = []
_installed = False
_sweeper_pid = 0
_sweeper_lock = _common.native_lock()


def track(pool: Any, *, on_fork: Callable[[], None] | None = None) -> None:
    """Register ``pool`` (it must have ``_pid``, ``_after_fork_in_child()`` and ``close()``).

    :param on_fork: also run once in every forked child, before the pools reset.
    """
    global _installed
    if not _installed:
        _installed = True
        _common.on_fork_in_child(_after_fork_in_child)
        atexit.register(_close_all_at_exit)
    if on_fork is not None and on_fork not in _fork_callbacks:
        _fork_callbacks.append(on_fork)
    pools.add(pool)


def _original(module: str, name: str) -> Any:
    monkey = sys.modules.get("gevent.monkey")
    return monkey.get_original(module, name) if monkey is not None else getattr(__import__(module), name)


def start_sweeper() -> None:
    """Start this process's sweeper thread, unless it runs already (a no-op costing a pid check)."""
    global _sweeper_pid
    if _sweeper_pid == os.getpid():
        return
    with _sweeper_lock:
        if _sweeper_pid != os.getpid():
            _sweeper_pid = os.getpid()
            _original("_thread", "start_new_thread")(_sweep_forever, (os.getpid(),))


def _sweep_forever(pid: int) -> None:
    sleep = _original("time", "sleep")
    while os.getpid() == pid:  # a forked child starts its own
        sleep(SWEEP_EVERY)
        try:
            for pool in list(pools):
                pool.sweep()
        except Exception:  # never let the sweeper die; the next round tries again
            log.exception("sweeping the idle sockets of ended owners failed")


def close_foreign(sock: zmq.Socket, linger_ms: int) -> None:
    """Close a socket possibly created under another (maybe destroyed) hub, bypassing its watcher."""
    _common.stop_watcher(sock)
    if hasattr(sock, "_state_event"):
        sock._state_event = None
    zmq.Socket.close(sock, linger=linger_ms)


def _after_fork_in_child() -> None:
    _common.disown_zero_copy_collector()
    for callback in _fork_callbacks:
        callback()
    for pool in list(pools):
        if pool._pid != os.getpid():
            pool._after_fork_in_child()


def _close_all_at_exit() -> None:
    for pool in list(pools):
        if pool._pid == os.getpid():
            try:
                pool.close()
            except Exception:  # interpreter exit: nothing useful left to raise to
                pass
