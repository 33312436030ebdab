"""A link cut long enough for the client's keepalive to drop its connections, then healed (issue 23 item 1).

Two hosts of a network-namespace lab (``tests/e2e/netns.py``): ``w`` runs a real ``zqsync worker``,
``c`` a client process with one ``Client``. The client sends a job and a call, so it holds a job and
a call connection; then the worker's cable is cut until the client's kernel has given up on both
connections (its TCP keepalive on the job socket, ZMTP heartbeats on the call socket: ``ZQSYNC_HEARTBEAT``
is 1 s). No FIN crosses the cut, so the worker still holds both. The cable comes back, the client
reconnects with the same routing ids (``client/pool.py``) and sends N plain jobs and N calls of the
``record`` task: at the worker, every one must run once, and every call must be answered without a
timeout. Before ``ZMQ_ROUTER_HANDOVER`` none of the jobs ran. Then the worker's TCP keepalive
(``--keepalive-idle``, short here) must close the stale connections: the worker's host ends with one
connection per socket. The cut is shorter than the worker's keepalive idle time, so the worker has
not noticed the old connections when the new ones come (the case the handover is for).

Needs root and iproute2 (``ip``, ``ss``); skipped otherwise. The client runs monkey-patched when the suite does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MONKEY_PATCHED, ROOT
from tests.e2e.netns import Host
from tests.helpers import slack, wait_for

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(shutil.which("ss") is None, reason="iproute2's `ss` is not installed")]

PORT = 5555  # jobs; rpc on PORT + 1
N = 100  # plain jobs and calls sent after the heal
WORKER_KEEPALIVE_IDLE = 20  # seconds: longer than the cut, so the worker still holds the old connections
CALL_TIMEOUT = 3.0

CLIENT_SCRIPT = r'''
"""The client host: a job and a call, wait for "go", then N jobs and N calls; one JSON line per step."""
import json
import os
import sys
import time

config = json.loads(open(sys.argv[1]).read())
if config["gevent"]:
    from gevent import monkey

    monkey.patch_all()

import zqsync

events = os.open(config["events"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def emit(**event):
    os.write(events, (json.dumps(event) + "\n").encode())


def wait_file(path):
    while not os.path.exists(path):
        time.sleep(0.05)


def call(client, line):
    try:
        return client.call("record", config["record"], line) == line
    except zqsync.CallTimeout:
        return False


with zqsync.Client(config["endpoint"], call_timeout=config["call_timeout"]) as client:
    client.enqueue("record", config["record"], "job warm")
    emit(kind="warm", ok=call(client, "call warm"))
    wait_file(config["go"])
    accepted = [client.enqueue("record", config["record"], f"job {index}") for index in range(config["n"])]
    answered = [call(client, f"call {index}") for index in range(config["n"])]
    emit(kind="sent", accepted=len(accepted), answered=sum(answered), stats=client.stats())
    wait_file(config["stop"])
emit(kind="done")
'''


def established(host: Host, port: int) -> list[int]:
    """The send queue (unacknowledged bytes) of each ESTABLISHED TCP connection on ``host`` whose local or
    remote port is ``port`` (``ss``: Recv-Q, Send-Q, local and peer address)."""
    listed = subprocess.run(host.command(["ss", "-Htn", "state", "established"]), capture_output=True, text=True,
                            timeout=20, check=True)
    rows = [line.split() for line in listed.stdout.splitlines()]
    return [int(row[1]) for row in rows if any(end.rsplit(":", 1)[1] == str(port) for end in row[2:4])]


def count(host: Host, port: int) -> int:
    return len(established(host, port))


def connections(host: Host) -> str:
    """``ss -tno`` on ``host``: every TCP connection with its timers, for a failure message."""
    return subprocess.run(host.command(["ss", "-tnoa"]), capture_output=True, text=True, timeout=20).stdout


class Flap:
    """The paths and processes of one run: worker host ``w``, client host ``c``."""

    def __init__(self, lab, tmp: Path) -> None:
        self.lab, self.tmp = lab, tmp
        self.client_host, self.worker_host = lab.add_host("c", 1), lab.add_host("w", 11)
        self.record, self.events_path = tmp / "record.txt", tmp / "events.jsonl"
        self.go, self.stop = tmp / "go", tmp / "stop"
        self.logs = {"worker": tmp / "worker.log", "client": tmp / "client.log"}
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        endpoint = f"tcp://{self.worker_host.address}:{PORT}"
        ready = self.tmp / "ready"
        worker = [sys.executable, "-m", "zqsync", "worker", "zqsync.demo.tasks:registry", "--bind", endpoint,
                  "--ready-file", str(ready), "--parent-pid", str(os.getpid()),
                  "--keepalive-idle", str(WORKER_KEEPALIVE_IDLE), "--keepalive-interval", "1"]
        self.procs["worker"] = self.lab.popen(self.worker_host, worker, log_path=str(self.logs["worker"]), cwd=ROOT)
        wait_for(lambda: ready.exists() or self.procs["worker"].poll() is not None, timeout=60, what="the worker")
        assert self.procs["worker"].poll() is None, self.tails()
        config = {"gevent": MONKEY_PATCHED, "endpoint": endpoint, "call_timeout": CALL_TIMEOUT, "n": N,
                  "record": str(self.record), "events": str(self.events_path), "go": str(self.go),
                  "stop": str(self.stop)}
        (self.tmp / "client.json").write_text(json.dumps(config))
        (self.tmp / "client.py").write_text(CLIENT_SCRIPT)
        self.procs["client"] = self.lab.popen(
            self.client_host, [sys.executable, str(self.tmp / "client.py"), str(self.tmp / "client.json")],
            log_path=str(self.logs["client"]), cwd=ROOT, env={**os.environ, "ZQSYNC_HEARTBEAT": "1"},
        )

    def event(self, kind: str) -> dict[str, Any] | None:
        assert self.procs["client"].poll() in (None, 0), f"the client failed:\n{self.tails()}"
        lines = self.events_path.read_text().split("\n")[:-1] if self.events_path.exists() else []
        found = [json.loads(line) for line in lines]
        return next((event for event in found if event["kind"] == kind), None)

    def ran(self) -> Counter:
        return Counter(self.record.read_text().splitlines()) if self.record.exists() else Counter()

    def tails(self) -> str:
        return "\n".join(f"--- {name} ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:])
                         for name, path in self.logs.items() if path.exists())


@pytest.fixture
def flap(lab, tmp_path):
    made = Flap(lab, tmp_path)
    yield made
    print(made.tails())  # shown only when the test fails
    lab.close()  # processes by pid first, then the namespaces


def test_jobs_and_calls_after_a_healed_cut_all_run_and_the_stale_connections_close(flap):
    flap.start()
    warm = wait_for(lambda: flap.event("warm"), timeout=60, what="the client's first job and call")
    assert warm["ok"] and flap.ran() == Counter(["job warm", "call warm"]), flap.tails()
    client, worker = flap.client_host, flap.worker_host
    # Cut only once the worker has acknowledged everything: keepalive never probes a connection with data in
    # flight (a delayed ack of the warm job did that once), and the client would hold it for minutes.
    wait_for(lambda: established(client, PORT) == established(client, PORT + 1) == [0], timeout=slack(10),
             what="the worker to acknowledge the client's data")

    worker.cut()
    try:
        wait_for(lambda: count(client, PORT) == count(client, PORT + 1) == 0, timeout=slack(30), interval=0.2,
                 what="the client's kernel to give up on its job and call connections")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the client host's connections:\n{connections(client)}") from None
    assert count(worker, PORT) == 1, "the worker noticed the cut"
    worker.restore()
    wait_for(lambda: count(client, PORT) == count(client, PORT + 1) == 1, timeout=slack(30), interval=0.2,
             what="the client to reconnect")
    # The job connection died in the client's kernel without a FIN: the worker holds it next to the new one. (The
    # call socket's libzmq closed its connection, so its FIN may reach the worker once the link is back.)
    wait_for(lambda: count(worker, PORT) == 2, timeout=slack(5), interval=0.2,
             what="the worker to hold the new job connection next to the old one")

    flap.go.touch()
    sent = wait_for(lambda: flap.event("sent"), timeout=slack(60), interval=0.2,
                    what="the client's jobs and calls after the heal")
    jobs = {f"job {index}" for index in range(N)}
    try:
        wait_for(lambda: jobs <= set(flap.ran()), timeout=slack(20), interval=0.2, what="every job to run")
    except AssertionError:
        pass  # counted below
    ran = flap.ran()
    lost = len(jobs - set(ran))
    calls_ran = sum(1 for index in range(N) if ran[f"call {index}"])
    print(f"\nhealed cut: {sent['accepted']} plain jobs accepted after the heal, {lost} never ran; "
          f"{sent['answered']} of {N} calls answered, {calls_ran} ran at the worker")
    assert lost == 0, f"{lost} of {N} plain jobs accepted after a healed cut never ran"
    assert sent["accepted"] == N and sent["answered"] == N and calls_ran == N, sent
    assert max(ran.values()) == 1, "a job or call ran twice"
    wait_for(lambda: count(worker, PORT) == count(worker, PORT + 1) == 1,
             timeout=slack(WORKER_KEEPALIVE_IDLE + 20), interval=0.5,
             what="the worker's keepalive to close the stale connections")
    flap.stop.touch()
    assert flap.procs["client"].wait(30) == 0, flap.tails()
