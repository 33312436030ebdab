"""zqsync.contrib.flask and examples/flask_app.py against a real worker serving workers/tasks.py."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
import textwrap

import pytest
from flask import Flask

import zqsync
from tests.helpers import wait_for
from zqsync.contrib.flask import Zqsync


@pytest.fixture
def example(root):
    return runpy.run_path(os.path.join(root, "examples", "flask_app.py"))


def test_the_example_enqueues_and_calls_through_the_extension(zq_worker, example, root):
    worker = zq_worker("workers.tasks:registry", cwd=root)
    app = example["create_app"]({"ZQSYNC_ENDPOINT": worker.endpoint})
    web = app.test_client()

    answer = web.post("/signup", data={"email": "ada@example.org"})
    assert answer.status_code == 202, answer.get_data(as_text=True)
    assert len(answer.get_json()["job_id"]) == 32
    wait_for(lambda: worker.stats()["jobs_succeeded"] == 1, what="the welcome job to run")
    wait_for(lambda: "welcome mail to ada@example.org" in worker.output(), what="the job's log line")

    answer = web.get("/add?a=2&b=3")
    assert answer.status_code == 200 and answer.get_json() == {"result": 5}
    assert worker.stats()["calls_succeeded"] == 1


def test_a_dead_worker_becomes_a_504_naming_the_error(example):
    app = example["create_app"]({"ZQSYNC_ENDPOINT": "tcp://127.0.0.1:9", "ZQSYNC_CLIENT_OPTIONS": {"call_timeout": 0.3}})
    answer = app.test_client().get("/add?a=1&b=1")
    assert answer.status_code == 504
    assert answer.get_json()["error"] == "CallTimeout"


def test_one_client_per_app_built_from_its_config():
    first, second = Flask("first"), Flask("second")
    first.config.update(ZQSYNC_ENDPOINTS=["tcp://127.0.0.1:5555", "tcp://127.0.0.1:5565"],
                        ZQSYNC_CLIENT_OPTIONS={"call_timeout": 2.5, "pool_size": 2})
    second.config["ZQSYNC_ENDPOINT"] = "tcp://127.0.0.1:5575"
    zq = Zqsync()
    zq.init_app(first)
    Zqsync(second)
    clients = first.extensions["zqsync"], second.extensions["zqsync"]
    assert all(isinstance(client, zqsync.Client) for client in clients)
    assert clients[0].endpoints == ("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5565")
    assert clients[0].settings.call_timeout == 2.5 and clients[0].settings.pool_size == 2
    assert clients[1].endpoints == ("tcp://127.0.0.1:5575",)
    with second.app_context():
        assert zq.client is clients[1]
    for client in clients:
        client.close()


def test_bad_configuration_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("ZQSYNC_ENDPOINT", raising=False)
    with pytest.raises(zqsync.ConfigurationError, match="ZQSYNC_ENDPOINT is not set") as missing:
        Zqsync(Flask("none"))
    assert missing.value.setting == "ZQSYNC_ENDPOINT"

    app = Flask("typo")
    app.config.update(ZQSYNC_ENDPOINT="tcp://127.0.0.1:5555", ZQSYNC_CLIENT_OPTIONS={"call_timout": 1.0})
    with pytest.raises(zqsync.ConfigurationError, match="unknown client option.*call_timout") as typo:
        Zqsync(app)
    assert typo.value.setting == "ZQSYNC_CLIENT_OPTIONS"
    with Flask("plain").app_context(), pytest.raises(RuntimeError, match="init_app"):
        Zqsync().client  # noqa: B018  (the property raises)


def test_the_client_is_closed_at_process_exit(zq_worker, tmp_path):
    worker = zq_worker()
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(f"""
        import atexit
        from flask import Flask
        import zqsync
        from zqsync.contrib.flask import Zqsync

        app = Flask("exit")
        app.config["ZQSYNC_ENDPOINT"] = {worker.endpoint!r}

        def after_the_extension():  # registered first, so it runs after the extension's hook
            try:
                app.extensions["zqsync"].call("add", 1, 1)
            except zqsync.ClientClosed:
                print("closed at exit")

        atexit.register(after_the_extension)
        Zqsync(app)
        print("result", app.extensions["zqsync"].call("add", 1, 2))
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["result 3", "closed at exit"]


def test_app_factories_leave_the_open_file_descriptors_flat(zq_worker, tmp_path):
    """Each app's client is let go with its app: nothing (an ``atexit`` hook, say) keeps it alive."""
    worker = zq_worker()
    script = tmp_path / "factories.py"
    script.write_text(textwrap.dedent(f"""
        import gc, os
        from flask import Flask
        from zqsync.contrib.flask import Zqsync

        zq = Zqsync()

        def create_app():
            app = Flask("factory")
            app.config["ZQSYNC_ENDPOINT"] = {worker.endpoint!r}
            zq.init_app(app)

            @app.get("/")
            def index():
                zq.enqueue("echo", "x")
                return str(zq.call("add", 1, 2))

            return app

        def one_request():
            assert create_app().test_client().get("/").get_data(as_text=True) == "3"

        def open_fds():
            gc.collect()
            return len(os.listdir("/proc/self/fd"))

        one_request()
        before = open_fds()
        for _ in range(200):
            one_request()
        print("extra fds", open_fds() - before)
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    extra = int(result.stdout.split()[-1])
    assert abs(extra) <= 10, f"200 app factories left {extra} more open fds"
    wait_for(lambda: worker.stats()["jobs_succeeded"] == 201, what="every app's job to run")
