"""workers/: the systemd unit, the container image's command, the compose file and the Kubernetes probe.

What this machine can run is run for real: ``systemd-analyze verify`` on the
unit, the unit's and the image's worker command lines (a real prefork worker,
stopped with TERM), and the liveness probe against a live and a dead worker.
Building the image and applying the manifests need a Docker daemon and a
cluster; the README says so.
"""

from __future__ import annotations

import configparser
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

import pytest

import zqsync
from tests.helpers import wait_for
from zqsync.processes import stop_process

yaml = pytest.importorskip("yaml")


@pytest.fixture
def workers(root):
    return os.path.join(root, "workers")


def unit(workers: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(os.path.join(workers, "zqsync-worker.service"))
    return parser


def dockerfile_cmd(workers: str) -> list[str]:
    with open(os.path.join(workers, "Dockerfile")) as handle:
        (line,) = [line for line in handle if line.startswith("CMD ")]
    return json.loads(line[4:])


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def start_locally(argv: list[str], cwd: str, tmp_path) -> tuple[subprocess.Popen, str]:
    """Run a deployment file's ``zqsync worker`` command here: on an ephemeral loopback port, with a temp state dir."""
    assert os.path.basename(argv[0]) == "zqsync" and argv[1] == "worker", argv
    argv = list(argv)
    argv[argv.index("--bind") + 1] = "tcp://127.0.0.1:0"
    argv[argv.index("--state-dir") + 1] = str(tmp_path / "state")
    ready = tmp_path / "ready"
    command = [sys.executable, "-m", "zqsync", *argv[1:], "--ready-file", str(ready), "--parent-pid", str(os.getpid())]
    log = open(tmp_path / "worker.log", "wb")
    proc = subprocess.Popen(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    log.close()
    wait_for(lambda: proc.poll() is not None or (ready.exists() and ready.read_text().strip()), timeout=60,
             what="the worker to listen")
    assert proc.poll() is None, (tmp_path / "worker.log").read_text()
    return proc, ready.read_text().strip()


def test_systemd_unit_passes_systemd_analyze_verify(workers, tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here")
    with open(os.path.join(workers, "zqsync-worker.service")) as handle:
        text = handle.read()
    # verify checks that ExecStart's binary exists: point it at this environment's zqsync.
    here = os.path.join(os.path.dirname(sys.executable), "zqsync")
    copy = tmp_path / "zqsync-worker.service"
    copy.write_text(text.replace("/opt/myapp/.venv/bin/zqsync", here).replace("/opt/myapp", str(tmp_path)))
    result = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


def test_systemd_unit_settings_fit_the_prefork_worker(workers):
    service = unit(workers)["Service"]
    argv = shlex.split(service["ExecStart"])
    assert service["Restart"] == "on-failure" and service["KillSignal"] == "SIGTERM"
    assert service["KillMode"] == "mixed"  # TERM to the supervisor only; it stops its children
    assert float(service["TimeoutStopSec"]) > float(option(argv, "--graceful-timeout"))
    assert option(argv, "--state-dir") == "/var/lib/" + service["StateDirectory"]
    assert int(option(argv, "--processes")) > 1


#: The descriptors a worker needs for issue 23's fleet: 500 web processes x 3 sockets x pool size 4,
#: plus its own (docs/operations.md, "File descriptors and connections"); the files give ten times that.
FLEET_FDS = 500 * 3 * 4 + 100


def test_the_unit_and_compose_give_the_worker_a_descriptor_limit_for_a_fleet(workers):
    assert int(unit(workers)["Service"]["LimitNOFILE"]) >= 10 * FLEET_FDS
    with open(os.path.join(workers, "compose.yaml")) as handle:
        nofile = yaml.safe_load(handle)["services"]["worker"]["ulimits"]["nofile"]
    assert nofile["soft"] == nofile["hard"] >= 10 * FLEET_FDS


@pytest.mark.timeout(120)
def test_systemd_units_command_runs_a_prefork_worker_that_stops_cleanly_on_term(workers, tmp_path):
    argv = shlex.split(unit(workers)["Service"]["ExecStart"])
    proc, endpoint = start_locally(argv, workers, tmp_path)
    try:
        with zqsync.Client(endpoint, call_timeout=10.0) as client:
            assert client.call("add", 2, 3) == 5
            assert client.enqueue_with_options("send_welcome", args=("ada@example.org",), confirm=True)
    finally:
        started = time.monotonic()
        status = stop_process(proc, timeout=float(unit(workers)["Service"]["TimeoutStopSec"]))
    assert status == 0, (tmp_path / "worker.log").read_text()
    assert time.monotonic() - started < float(option(argv, "--graceful-timeout"))


def test_compose_and_kubernetes_run_the_images_command_with_the_same_probe(workers):
    cmd = dockerfile_cmd(workers)
    with open(os.path.join(workers, "compose.yaml")) as handle:
        compose = yaml.safe_load(handle)
    with open(os.path.join(workers, "kubernetes.yaml")) as handle:
        service, stateful_set = yaml.safe_load_all(handle)
    assert set(compose["services"]) == {"web", "worker"}
    assert compose["services"]["web"]["environment"]["ZQSYNC_ENDPOINT"] == "tcp://worker:5555"
    (container,) = stateful_set["spec"]["template"]["spec"]["containers"]
    assert container["command"] == cmd
    probe = container["livenessProbe"]["exec"]["command"]
    assert compose["services"]["worker"]["healthcheck"]["test"] == ["CMD", *probe]
    assert stateful_set["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > float(
        option(cmd, "--graceful-timeout"))
    assert {port["port"] for port in service["spec"]["ports"]} == {5555, 5556}


def test_kubernetes_service_is_headless_so_clients_resolve_every_replica(workers):
    """A ClusterIP Service hides the pods behind one address: rendezvous hashing, status look-ups and
    retries would land on random pods. A headless one resolves to each ready pod (``client/discovery.py``)."""
    with open(os.path.join(workers, "kubernetes.yaml")) as handle:
        service, stateful_set = yaml.safe_load_all(handle)
    assert service["spec"].get("clusterIP") == "None"
    assert stateful_set["spec"]["serviceName"] == service["metadata"]["name"]
    labels = stateful_set["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert stateful_set["spec"]["replicas"] > 1


@pytest.mark.timeout(120)
def test_the_liveness_probe_passes_on_the_images_worker_and_fails_on_a_dead_one(workers, tmp_path):
    with open(os.path.join(workers, "kubernetes.yaml")) as handle:
        _, stateful_set = yaml.safe_load_all(handle)
    probe = stateful_set["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"]["command"]

    def run_probe(endpoint: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "zqsync", *[endpoint if part.startswith("tcp://") else part for part in probe[1:]]]
        return subprocess.run(command, capture_output=True, text=True, timeout=30)

    proc, endpoint = start_locally(dockerfile_cmd(workers), workers, tmp_path)
    try:
        alive = run_probe(endpoint)
    finally:
        stop_process(proc)
    assert alive.returncode == 0, alive.stderr
    assert alive.stdout.startswith(f"pong from {endpoint} in ")
    dead = run_probe(endpoint)  # the same address, nobody listening
    assert dead.returncode == 1
    assert "CallTimeout" in dead.stderr
