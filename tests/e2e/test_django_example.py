"""examples/django end to end: gunicorn -k gevent serving the project's views, and a real worker
started as ``zqsync worker zqsync.contrib.django.worker`` and as ``manage.py zqsync_worker``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request

import pytest

import zqsync
from tests.helpers import wait_for
from zqsync.processes import GunicornProcess, WorkerProcess, stop_process

pytest.importorskip("django")

SETTINGS = {"DJANGO_SETTINGS_MODULE": "mysite.settings"}


@pytest.fixture
def project(root):
    return os.path.join(root, "examples", "django")


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        return json.loads(response.read())


@pytest.mark.timeout(120)
def test_views_under_gunicorn_gevent_enqueue_and_call_a_django_worker(project, tmp_path):
    orders = tmp_path / "orders.log"
    with WorkerProcess("zqsync.contrib.django.worker:registry", cwd=project,
                       env={**SETTINGS, "SHOP_ORDERS_LOG": str(orders)}) as worker:
        with GunicornProcess("mysite.wsgi", chdir=project, config=os.path.join(project, "mysite", "gunicorn_conf.py"),
                             env={**SETTINGS, "ZQSYNC_ENDPOINT": worker.endpoint}) as web:
            answers = [get_json(f"{web.url}/order/{n}?quantity={n}") for n in range(1, 31)]
        assert [answer["price"] for answer in answers] == [{"cents": n * 250, "currency": "EUR"} for n in range(1, 31)]
        assert len({answer["job_id"] for answer in answers}) == 30
        wait_for(lambda: orders.exists() and len(orders.read_text().splitlines()) == 30, what="30 recorded orders")
        assert sorted(orders.read_text().splitlines()) == sorted(f"order {n}" for n in range(1, 31))
        stats = worker.stats()
        assert stats["jobs_succeeded"] == 30 and stats["calls_succeeded"] == 30
        # Pooled: a few DEALER sockets per gunicorn process (pool size 4, 2 processes), not one per request.
        assert 1 <= len(worker.identities()) <= 8


@pytest.mark.timeout(60)
def test_manage_py_zqsync_worker_serves_autodiscovered_tasks_with_django_set_up(project, tmp_path):
    ready = tmp_path / "ready"
    command = [sys.executable, "manage.py", "zqsync_worker", "--", "--bind", "tcp://127.0.0.1:0",
               "--ready-file", str(ready), "--parent-pid", str(os.getpid())]
    with open(tmp_path / "worker.log", "wb") as log:
        proc = subprocess.Popen(command, cwd=project, env={**os.environ, "SHOP_ORDERS_LOG": str(tmp_path / "o.log")},
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: proc.poll() is not None or (ready.exists() and ready.read_text().strip()),
                 timeout=30, what="the worker to listen")
        assert proc.poll() is None, (tmp_path / "worker.log").read_text()
        with zqsync.Client(ready.read_text().strip(), call_timeout=10.0) as client:
            assert client.call("quote", 2, 100) == {"cents": 200, "currency": "EUR"}  # settings read in the worker
            stats = client.call("zqsync.stats")
        assert stats["tasks"] == ["quote", "record_order"]
        assert stats["pid"] == proc.pid  # exec'd: TERM to this pid reaches the worker itself
    finally:
        status = stop_process(proc)
    assert status == 0, (tmp_path / "worker.log").read_text()
    assert "concurrency 50" in (tmp_path / "worker.log").read_text()  # from settings.ZQSYNC["WORKER"]


def test_the_worker_module_without_django_settings_says_what_to_set(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run([sys.executable, "-m", "zqsync", "worker", "zqsync.contrib.django.worker",
                             "--bind", "tcp://127.0.0.1:0"], cwd=str(tmp_path), env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1
    assert "set DJANGO_SETTINGS_MODULE" in result.stderr


def test_two_apps_registering_one_task_name_stop_the_worker_with_both_names(tmp_path):
    for app in ("billing", "mail"):
        (tmp_path / app).mkdir()
        (tmp_path / app / "__init__.py").write_text("")
        (tmp_path / app / "tasks.py").write_text(
            "from zqsync.worker import Registry\nregistry = Registry()\nregistry.add(len, name='send')\n")
    (tmp_path / "dupsettings.py").write_text("INSTALLED_APPS = ['zqsync.contrib.django', 'billing', 'mail']\n"
                                             "SECRET_KEY = 'x'\n")
    result = subprocess.run([sys.executable, "-m", "zqsync", "worker", "zqsync.contrib.django.worker",
                             "--bind", "tcp://127.0.0.1:0"], cwd=str(tmp_path),
                            env={**os.environ, "DJANGO_SETTINGS_MODULE": "dupsettings"}, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().endswith(
        "ConfigurationError: task 'send' is registered by both billing.tasks and mail.tasks"), result.stderr


@pytest.mark.timeout(120)
def test_manage_py_zqsync_worker_reload_restarts_on_an_edit_in_the_project(project, tmp_path):
    pytest.importorskip("watchfiles")
    copy = tmp_path / "project"
    shutil.copytree(project, copy, ignore=shutil.ignore_patterns("__pycache__", "*.sqlite3"))
    ready = tmp_path / "ready"
    command = [sys.executable, "manage.py", "zqsync_worker", "--", "--reload", "--bind", "tcp://127.0.0.1:0",
               "--ready-file", str(ready), "--parent-pid", str(os.getpid())]
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=copy, env={**os.environ, "SHOP_ORDERS_LOG": str(tmp_path / "o.log")},
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: proc.poll() is not None or (ready.exists() and ready.read_text().strip()),
                 timeout=60, what="the worker to listen")
        assert proc.poll() is None, log_path.read_text()
        ready.unlink()
        with open(copy / "shop" / "tasks.py", "a") as tasks:
            tasks.write("\n# edited\n")
        wait_for(lambda: ready.exists() and ready.read_text().strip(), timeout=60, what="the restarted worker")
        assert "tasks.py changed; restarting the worker" in log_path.read_text()
        with zqsync.Client(ready.read_text().strip(), call_timeout=10.0) as client:
            assert client.call("quote", 2, 100) == {"cents": 200, "currency": "EUR"}
    finally:
        stop_process(proc)
