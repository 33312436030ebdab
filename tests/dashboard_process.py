"""A real ``zqsync dashboard`` subprocess for the dashboard tests, and its tasks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from typing import Optional

import gevent
import requests

from tests.helpers import wait_for
from zqsync.processes import stop_process
from zqsync.worker import Registry

#: Tasks of the dashboard tests' workers (``tests.dashboard_process:registry``).
registry = Registry()


@registry.task
def add(a, b):
    return a + b


@registry.task
def needs_file(path):
    """Fails until ``path`` exists: a dead job that runs once requeued."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no {path} yet")
    return path


@registry.task
def hold(seconds):
    """Runs ``seconds`` (yielding), for a job seen running."""
    gevent.sleep(seconds)


TASKS = "tests.dashboard_process:registry"


class Dashboard:
    """``zqsync dashboard ENDPOINT... --bind HOST:0`` until :meth:`stop`; ``url`` once it listens."""

    def __init__(self, endpoints: list[str], *, host: str = "127.0.0.1", token: Optional[str] = None,
                 interval: float = 1.0) -> None:
        self._dir = tempfile.mkdtemp(prefix="zqsync-dashboard-")
        ready = os.path.join(self._dir, "url")
        argv = [sys.executable, "-m", "zqsync", "dashboard", *endpoints, "--bind", f"{host}:0",
                "--ready-file", ready, "--interval", str(interval), "--metrics-url", "http://127.0.0.1:9/metrics"]
        if token:
            token_file = os.path.join(self._dir, "token")
            with open(token_file, "w") as handle:
                handle.write(token + "\n")
            argv += ["--token-file", token_file]
        self.log_path = os.path.join(self._dir, "dashboard.log")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: os.path.exists(ready) or self.proc.poll() is not None, timeout=30, what="the dashboard")
        if self.proc.poll() is not None:
            raise AssertionError(f"the dashboard exited {self.proc.returncode}: {self.output()}")
        with open(ready) as handle:
            self.url = handle.read().strip().replace("0.0.0.0", "127.0.0.1")

    def output(self) -> str:
        with open(self.log_path) as handle:
            return handle.read()

    def stop(self) -> Optional[int]:
        """SIGTERM, then SIGKILL after 10 s; returns the exit status."""
        return stop_process(self.proc)


def csrf_token(session: requests.Session, url: str) -> str:
    """The CSRF token the page at ``url`` gives ``session`` (from its meta tag)."""
    page = session.get(url + "/", timeout=10)
    page.raise_for_status()
    match = re.search(r'name="csrf-token" content="([^"]+)"', page.text)
    assert match, page.text[:500]
    return match.group(1)
