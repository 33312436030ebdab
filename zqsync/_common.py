"""Low-level helpers that both the client and the worker use (private).

* `native_lock`: a real thread lock even under gevent monkey-patching.
* `pid_alive`: whether a process exists.
* `write_ready_file`: announce an endpoint atomically (supervisors and tests wait for it).
* `on_fork_in_child`: the one place fork hooks are registered.
* `disown`: make a socket inherited across ``fork`` inert in the child.
* `track_client` / `live_clients`: the clients of this process,
  which the worker's stats and the Prometheus exporter report without
  importing the client package.
"""

from __future__ import annotations

import _thread
import os
import sys
import weakref
from typing import Any, Callable

#: Sockets and contexts inherited across fork: kept referenced, never closed.
orphans: list[Any] = []
_fork_callbacks: list[Callable[[], None]] = []
_clients: "weakref.WeakSet[Any]" = weakref.WeakSet()


def native_lock() -> Any:
    """A real (never monkey-patched) ``_thread`` lock."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None:
        return monkey.get_original("_thread", "allocate_lock")()
    return _thread.allocate_lock()


def catch_sigchld_before_fork() -> None:
    """Under gevent's monkey-patching, have libev catch ``SIGCHLD`` before a fork, not after it.

    gevent's patched ``os.fork`` starts a child watcher in the parent once ``fork`` has returned, and
    libev installs its ``SIGCHLD`` handler with the first watcher: a first child that exits before the
    parent gets there sends a signal nobody catches, so gevent's patched ``os.waitpid`` never learns
    of the exit and waits for it forever (``WNOHANG``: reports it running forever). gevent's own
    ``subprocess`` installs the handler up front the same way (``loop.install_sigchld``). Without
    monkey-patching (``os.fork`` unpatched) it does nothing. Never blocks.
    """
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None or not monkey.is_module_patched("os"):
        return
    import gevent

    gevent.get_hub().loop.install_sigchld()  # every gevent loop has it (libuv's installs its own handler)


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one we may not signal counts as existing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_ready_file(path: str, endpoint: str) -> None:
    """Write ``endpoint`` and a newline to ``path`` atomically (a temporary file, then ``os.replace``)."""
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w") as handle:
        handle.write(f"{endpoint}\n")
    os.replace(temporary, path)


def on_fork_in_child(callback: Callable[[], None]) -> None:
    """Run ``callback()`` in every child forked from now on, in registration order.

    One ``os.register_at_fork`` hook serves every callback, so their order is
    the registration order. A callback that needs to die with its object holds
    it through a weak reference. C-level forks (``fork(2)`` from a C
    extension) skip the hook: code that must notice them also checks the pid.
    """
    if not _fork_callbacks:
        os.register_at_fork(after_in_child=_run_fork_callbacks)
    _fork_callbacks.append(callback)


def _run_fork_callbacks() -> None:
    for callback in list(_fork_callbacks):
        callback()


def disown(sock: Any) -> None:
    """In a forked child: make an inherited socket unusable without any libzmq call.

    Its gevent watcher is stopped and pyzmq is told it is closed (its
    ``_closed`` flag), so any later use in the child, by a copied greenlet or
    a ``finally`` clause of zmq.green, raises ``ENOTSOCK`` instead of running
    libzmq code that would drain the parent's I/O thread mailbox; a later
    ``close()`` or garbage collection does nothing. The object is kept in
    `orphans`.
    """
    stop_watcher(sock)
    sock._closed = True
    orphans.append(sock)


def disown_zero_copy_collector() -> None:
    """In a forked child: end the copy of pyzmq's zero-copy collector greenlet and disown its socket.

    pyzmq keeps the memory of ``copy=False`` sends alive until libzmq frees it,
    through a collector thread (``zmq.utils.garbage``) that pulls on an inproc
    socket. Under gevent's monkey-patching that thread is a greenlet, and
    ``fork`` copies it into the child with the parent's socket. There its
    ``recv`` spins on a mailbox libzmq will not read in another process
    (libzmq checks the pid), never yielding to the hub, and the child hangs.
    Here the copied socket is disowned and the greenlet is ended with
    ``SystemExit``, which ``threading`` ends silently; pyzmq starts a fresh
    collector should the child send zero-copy itself. A no-op when pyzmq's
    collector never started, or without gevent.
    """
    garbage: Any = sys.modules.get("zmq.utils.garbage")
    collector: Any = getattr(garbage, "gc", None)
    thread = getattr(collector, "thread", None)
    if thread is None or collector.pid == os.getpid() or not garbage.Thread.__module__.startswith("gevent"):
        return
    context = getattr(collector, "_context", None)
    for sock in list(getattr(context, "_sockets", None) or ()):
        disown(sock)
    if context is not None:
        orphans.append(context)
    import gc
    import threading

    for glet in [item for item in gc.get_objects() if id(item) == thread.ident and hasattr(item, "kill")]:
        # threading forgot the copied thread at the fork; its end removes it again
        threading._active.setdefault(thread.ident, thread)  # type: ignore[attr-defined]
        glet.kill(SystemExit, block=False)


def stop_watcher(sock: Any) -> None:
    """Stop a ``zmq.green`` socket's gevent watcher, if it has one (a no-op on plain sockets)."""
    watcher = getattr(sock, "_state_event", None)
    if watcher is not None:
        try:
            watcher.stop()
        except Exception:  # a watcher of a loop already gone: nothing to stop
            pass


def track_client(client: Any) -> None:
    """Remember ``client`` (weakly) as one of this process's clients."""
    _clients.add(client)


def live_clients() -> list[Any]:
    """Every client built in this process and not garbage-collected."""
    return list(_clients)
