"""How a user tests their own app for fork safety with zqsync's pytest plugin.

Run it from the repository root (the plugin comes with ``pip install zqsync``)::

    pytest examples/test_fork_safety.py

``zq_worker`` starts a real worker process; ``run_in_fork`` runs a function in
a forked child and hands back its result. The app here is
the demo's Flask app, ``zqsync.demo.webapp``: its client is created at import
time, as in production under ``gunicorn --preload``.
"""

from __future__ import annotations

import importlib
import multiprocessing
import sys

import pytest

from zqsync.testing import run_in_fork

APP = "zqsync.demo.webapp"


@pytest.fixture
def webapp(zq_worker, monkeypatch):
    """The demo's web app imported fresh, pointed at a real worker."""
    worker = zq_worker("zqsync.demo.tasks:registry")
    monkeypatch.setenv("ZQSYNC_ENDPOINT", worker.endpoint)
    sys.modules.pop(APP, None)
    module = importlib.import_module(APP)
    yield module
    module.client.close()


def handle_one_request(n):
    """What a gunicorn worker does per request, without the HTTP."""
    with sys.modules[APP].app.test_client() as http:
        return http.get(f"/?n={n}").get_json()["result"]


def test_forked_child_serves_requests_with_the_inherited_client(webapp):
    assert handle_one_request(1) == 2  # the parent has live pooled sockets now
    assert run_in_fork(handle_one_request, 10) == 11
    assert handle_one_request(2) == 3  # and they still work after the child exits


def request_and_exit_with_status(n):
    """A multiprocessing child: exit 0 only if the request got the right answer."""
    sys.exit(0 if handle_one_request(n) == n + 1 else 1)


def test_multiprocessing_fork_children_each_get_working_sockets(webapp):  # noqa: ARG001
    handle_one_request(0)
    context = multiprocessing.get_context("fork")
    children = [context.Process(target=request_and_exit_with_status, args=(n,)) for n in range(3)]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
    assert [child.exitcode for child in children] == [0, 0, 0]
    assert handle_one_request(5) == 6
