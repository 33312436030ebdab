"""A real PostgreSQL server for the tests, from the machine's own packages (Debian's ``postgresql``).

:func:`start` runs ``initdb`` and ``pg_ctl`` into a fresh directory, on loopback and an ephemeral
port, with trust authentication for one superuser, ``zq``; :meth:`Server.stop` stops it by its pid.
PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user (made by the
Debian package), or ``nobody``. :func:`unavailable` says why there is no server to start (the tests
then skip with that reason). pytest-postgresql was tried first: it runs ``pg_ctl`` as the calling
user, so it cannot start a server as root, which CI is.

For hosts in network namespaces (``tests/e2e/netns.py``), ``start(host=ADDRESS, prefix=[...])`` runs the
server inside one (``prefix`` is ``ip netns exec NS``, the user switched there with ``runuser``) listening
only on that lab address; the test process reaches it through its Unix socket (:attr:`Server.admin_url`),
which crosses namespaces, and the hosts through :attr:`Server.url`.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from typing import Any, Optional, Sequence

from tests.helpers import slack

USER = "zq"


def bindir() -> Optional[str]:
    """The directory of ``pg_ctl`` and ``initdb``: ``ZQSYNC_TEST_PG_BIN``, else Debian's newest
    ``/usr/lib/postgresql/N/bin``, else the ``PATH``'s; ``None`` if there is none."""
    wanted = os.environ.get("ZQSYNC_TEST_PG_BIN")
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda path: int(path.split("/")[4]))
    found = shutil.which("pg_ctl")
    for candidate in (wanted and os.path.join(wanted, "pg_ctl"), debian[-1] if debian else None, found):
        if candidate and os.access(candidate, os.X_OK) and os.access(os.path.join(os.path.dirname(candidate), "initdb"),
                                                                      os.X_OK):
            return os.path.dirname(candidate)
    return None


def _runner() -> Optional[str]:
    """The unprivileged user to run the server as, when we are root; ``None`` when we are not."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name).pw_name
        except KeyError:
            continue
    raise RuntimeError("running as root, with neither a postgres nor a nobody user to run PostgreSQL as")


def unavailable() -> Optional[str]:
    """Why no PostgreSQL server can be started here, or ``None`` if one can."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'zqsync[postgresql]')"
    if bindir() is None:
        return ("PostgreSQL's pg_ctl and initdb are not installed (Debian: apt-get install postgresql; "
                "or set ZQSYNC_TEST_PG_BIN to their directory)")
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    """One running server: :attr:`url` is the ``postgres`` maintenance database's URL over TCP at ``host``,
    :attr:`admin_url` the same over the server's Unix socket; ``prefix`` runs its commands in a namespace."""

    def __init__(self, directory: str, port: int, user: Optional[str], host: str = "127.0.0.1",
                 prefix: Sequence[str] = ()) -> None:
        self.directory, self.port, self.user, self.host, self.prefix = directory, port, user, host, list(prefix)
        self.data = os.path.join(directory, "data")

    @property
    def url(self) -> str:
        return f"postgresql://{USER}@{self.host}:{self.port}/postgres"

    @property
    def admin_url(self) -> str:
        return self.local(self.url)

    def local(self, url: str) -> str:
        """``url`` (one of this server's databases) over its Unix socket, for the test process's side."""
        return f"postgresql://{USER}@/{url.rsplit('/', 1)[1]}?host={self.directory}&port={self.port}"

    def _run(self, *command: str, **options: Any) -> subprocess.CompletedProcess:
        program = [os.path.join(bindir() or "", command[0]), *command[1:]]
        if self.prefix:  # `ip netns exec` needs root: the user is switched inside the namespace
            argv, user = [*self.prefix, *(["runuser", "-u", self.user, "--"] if self.user else []), *program], None
        else:
            argv, user = program, self.user
        return subprocess.run(argv, user=user, capture_output=True, text=True, timeout=slack(120), **options)

    def start(self) -> bool:
        """Start the server; ``False`` if it did not (its port taken meanwhile)."""
        settings = f"-c listen_addresses={self.host} -p {self.port} -k {self.directory} -c max_connections=200"
        done = self._run("pg_ctl", "-D", self.data, "-l", os.path.join(self.directory, "log"), "-w",
                         "-t", str(int(slack(60))), "-o", settings, "start")
        return done.returncode == 0

    def pid(self) -> Optional[int]:
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as pidfile:
                return int(pidfile.readline())
        except (OSError, ValueError):
            return None

    def pids(self) -> list[int]:
        """The postmaster's pid and those of its live children (backends, WAL writer, ...); empty if it is down."""
        root = self.pid()
        if root is None:
            return []
        children = []
        for name in os.listdir("/proc"):
            try:
                with open(f"/proc/{name}/stat") as stat:
                    if name.isdigit() and int(stat.read().rsplit(")", 1)[1].split()[1]) == root:
                        children.append(int(name))
            except (OSError, ValueError, IndexError):
                continue  # not a process, or one that ended meanwhile
        return [root, *children]

    def database(self) -> str:
        """A new, empty database; returns its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def drop(self, url: str) -> None:
        """Drop the database at ``url`` (its connections closed first)."""
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")

    def stop(self) -> None:
        """Stop the server (``immediate``), then kill its postmaster by pid if it still runs; remove its files."""
        pid = self.pid()
        self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.directory, ignore_errors=True)


def start(host: str = "127.0.0.1", prefix: Sequence[str] = (), clients: Optional[str] = None) -> Server:
    """A new server in a fresh directory, listening on ``host`` only, its commands run after ``prefix``,
    trusting loopback and the ``clients`` network (``10.254.7.0/24``) if given (see the module docstring).

    :raises RuntimeError: ``initdb`` failed, or the server did not start on any of 5 ports (with its log).
    """
    user = _runner()
    directory = tempfile.mkdtemp(prefix="zq-pg-")
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(directory, entry.pw_uid, entry.pw_gid)
    server = Server(directory, _free_port(), user, host, prefix)
    done = server._run("initdb", "-D", server.data, "-U", USER, "--auth=trust", "--no-sync", "-E", "UTF8")
    if done.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        raise RuntimeError(f"initdb failed: {done.stderr}")
    if clients is not None:
        with open(os.path.join(server.data, "pg_hba.conf"), "a") as hba:
            hba.write(f"host all {USER} {clients} trust\n")
    for _ in range(5):
        if server.start():
            return server
        server.port = _free_port()
        time.sleep(0.1)
    with open(os.path.join(directory, "log")) as log:
        text = log.read()
    server.stop()
    raise RuntimeError(f"PostgreSQL did not start: {text[-2000:]}")
