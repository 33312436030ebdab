"""``zqsync worker`` options for operations: Prometheus metrics and ``--reload``.

Kept apart from ``cli.py`` so that the command module stays small. Nothing
here imports ``prometheus_client`` before ``PROMETHEUS_MULTIPROC_DIR`` is set:
the library picks its multiprocess mode when it is first imported.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from typing import Any, Iterator, Optional

from .errors import ConfigurationError

log = logging.getLogger("zqsync.cli")

Address = tuple[str, int]


def _host_port(text: str) -> Address:
    """``HOST:PORT`` (``[::1]:9100`` for IPv6) to ``(host, port)``."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT such as 0.0.0.0:9100, got {text!r}")
    return host, int(port)


def add_metrics_options(worker: argparse.ArgumentParser) -> None:
    """``--metrics-bind`` and its loopback shorthand ``--metrics-port``."""
    group = worker.add_mutually_exclusive_group()
    group.add_argument("--metrics-bind", type=_host_port, metavar="HOST:PORT",
                       help="serve Prometheus metrics over HTTP on HOST:PORT, e.g. 0.0.0.0:9100 for a Prometheus "
                       "on another machine (needs the 'prometheus' extra); with --processes, the supervisor serves "
                       "the sum over every child (prometheus multiprocess mode, in PROMETHEUS_MULTIPROC_DIR if it "
                       "names a writable directory, else in a temporary one removed on exit)")
    group.add_argument("--metrics-port", type=int, metavar="PORT",
                       help="the same as --metrics-bind 127.0.0.1:PORT (loopback only)")


def metrics_address(args: argparse.Namespace) -> Optional[Address]:
    """Where to serve metrics, from ``--metrics-bind`` or ``--metrics-port``; ``None`` for nowhere."""
    if args.metrics_port:
        return "127.0.0.1", args.metrics_port
    return args.metrics_bind


def prometheus() -> Any:
    """The ``zqsync.contrib.prometheus`` module. :raises SystemExit: ``prometheus_client`` is missing."""
    try:
        from .contrib import prometheus as module
    except ImportError as exc:
        raise SystemExit(
            f"zqsync worker: --metrics-bind needs prometheus_client: pip install 'zqsync[prometheus]' ({exc})"
        ) from exc
    return module


@contextlib.contextmanager
def listening(address: Address) -> Iterator[None]:
    """Run a block that binds an HTTP listener on ``address``; a port in use or refused is one line.

    :raises ConfigurationError: the block's bind failed with EADDRINUSE, EADDRNOTAVAIL or EACCES.
    """
    try:
        yield
    except OSError as exc:
        if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise
        raise ConfigurationError(f"cannot listen on {address[0]}:{address[1]}: {exc.strerror} (another process "
                                 "may listen there: stop it, or choose another port)") from None


def serve_metrics(args: argparse.Namespace, worker: Any) -> None:
    """Serve one worker process's metrics, if asked to. :raises ConfigurationError: the port is taken."""
    address = metrics_address(args)
    if address:
        with listening(address):
            prometheus().serve(address[1], worker=worker, addr=address[0])


def _usable_dir(path: str) -> bool:
    return bool(path) and os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


@contextlib.contextmanager
def multiprocess_dir() -> Iterator[str]:
    """Set ``PROMETHEUS_MULTIPROC_DIR`` for this process and its children while the block runs.

    A writable directory already named there is used as is, and kept. Otherwise a temporary
    ``zqsync-metrics-*`` directory is made, and removed when the block exits; if the variable
    was set but empty or not a writable directory (its metrics would be lost silently), a
    WARNING says so.

    :returns: the directory in use.
    """
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given is not None and _usable_dir(given):
        yield given
        return
    created = tempfile.mkdtemp(prefix="zqsync-metrics-")
    if given is not None:
        log.warning("PROMETHEUS_MULTIPROC_DIR=%r is %s: no metrics could be shared there; using %s instead "
                    "(removed on exit)", given, "empty" if not given else "not a writable directory", created)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = created
    creator = os.getpid()
    try:
        yield created
    finally:
        if os.getpid() == creator:  # never from a forked child unwinding
            shutil.rmtree(created, ignore_errors=True)


@contextlib.contextmanager
def supervisor_metrics(args: argparse.Namespace) -> Iterator[Any]:
    """In a prefork supervisor: serve the children's summed metrics while the block runs.

    :returns: the callback to run when a child exits (``None`` without metrics).
    """
    address = metrics_address(args)
    if address is None:
        yield None
        return
    with multiprocess_dir():
        module = prometheus()
        with listening(address):
            module.start_exporter(address[1], addr=address[0])
        yield module.mark_process_dead


def add_reload_option(worker: argparse.ArgumentParser) -> None:
    """``--reload``, for development."""
    worker.add_argument("--reload", action="store_true",
                        help="development: run the worker in a child process and restart it (warm stop, then a "
                        "fresh start) whenever a file of the task module's package changes (needs the 'reload' "
                        "extra: watchfiles); with port 0 in --bind, each start picks new ports")
    worker.add_argument("--reload-dir", action="append", default=[], metavar="DIR",
                        help="with --reload: watch DIR instead of the task module's package (repeatable; "
                        "manage.py zqsync_worker passes the Django project's directory)")


def watched_paths(app: str) -> list[str]:
    """The files to watch for ``MODULE[:ATTR]``: its top-level package's directories, or the module file.

    :raises SystemExit: the module cannot be found.
    """
    import importlib.util

    top = app.partition(":")[0].split(".")[0]
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    spec = importlib.util.find_spec(top)
    if spec is None or not (spec.submodule_search_locations or spec.origin):
        raise SystemExit(f"zqsync worker --reload: cannot find module {top!r} to watch")
    return list(spec.submodule_search_locations or [spec.origin])  # type: ignore[list-item]


def child_argv(argv: list[str]) -> list[str]:
    """The worker's own arguments minus ``--reload``; ``--parent-pid`` now names the reloader."""
    rest, skip = [], False
    for arg in argv:
        if skip or arg == "--reload" or arg.startswith("--parent-pid="):
            skip = False
        elif arg == "--parent-pid":
            skip = True
        else:
            rest.append(arg)
    return [*rest, "--parent-pid", str(os.getpid())]


def run_with_reload(args: argparse.Namespace, argv: list[str]) -> int:
    """Serve from a child ``zqsync worker`` that restarts on every change of the task package.

    Blocks until TERM/INT (or the death of ``--parent-pid``); returns 0.
    :raises SystemExit: watchfiles is not installed, or the task module cannot be found.
    """
    try:
        import watchfiles
    except ImportError as exc:
        raise SystemExit(f"zqsync worker: --reload needs watchfiles: pip install 'zqsync[reload]' ({exc})") from exc
    paths = [os.path.abspath(path) for path in args.reload_dir] or watched_paths(args.app)
    missing = [path for path in paths if not os.path.isdir(path)]
    if missing:
        raise SystemExit(f"zqsync worker --reload-dir: no such directory: {', '.join(missing)}")
    if args.parent_pid is not None:
        threading.Thread(target=_stop_when_orphaned, args=(args.parent_pid,), daemon=True).start()
    command = shlex.join([sys.executable, "-m", "zqsync", *child_argv(argv)])
    log.info("reload: watching %s", ", ".join(paths))
    # Every restart compiles the task modules from source: cached bytecode passes Python's check
    # (source mtime in whole seconds, and size) after a same-size edit within the same second.
    with tempfile.TemporaryDirectory(prefix="zqsync-reload-") as no_bytecode:
        os.environ.update(PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=no_bytecode)
        watchfiles.run_process(*paths, target=command, target_type="command", callback=_log_changes,
                               sigint_timeout=int(args.graceful_timeout) + 5)
    return 0


def _log_changes(changes: set[Any]) -> None:
    log.info("reload: %s changed; restarting the worker", ", ".join(sorted({path for _, path in changes})))


def _stop_when_orphaned(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    log.warning("parent process %d is gone: stopping", parent_pid)
    os.kill(os.getpid(), signal.SIGTERM)
