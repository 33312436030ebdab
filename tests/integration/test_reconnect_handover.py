"""A client socket that reconnects with the routing id of a connection the worker still holds (issue 23).

After a link cut, a client whose TCP keepalive gave up on its connection reconnects with the same
routing id (``zq-<pid>-<token>``, ``client/pool.py``), while the worker, which heard no FIN across
the cut, still holds the old connection. libzmq's ROUTER ignores a second connection for a routing
id it holds unless ``ZMQ_ROUTER_HANDOVER`` is set: everything sent on the new one is never read.

Root-free reproduction on loopback: DEALER ``old`` connects with an id and sends one request, and
stays open (the stale connection); DEALER ``new`` connects with the same id and sends more. Every
request sent on ``new`` must reach the worker: the jobs run (their ``record`` lines) and the calls
are answered, on every socket clients connect to (a standalone worker's jobs and rpc sockets, a named
queue's socket, the prefork supervisor's public pair). ``tests/e2e/test_flap.py`` does the same
with a real cut between network namespaces. And the worker's kernel must probe its client
connections (TCP keepalive, seen with ``ss``), so that a stale one is closed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest
import zmq

from tests.helpers import PREFORK_MODES, slack, wait_for
from zqsync.wire.envelope import decode_reply, encode_request

pytestmark = pytest.mark.timeout(60)

N = 20  # requests sent on the second connection


@contextlib.contextmanager
def sockets() -> Iterator[zmq.Context]:
    """A context whose sockets are all closed on the way out (linger 0)."""
    context = zmq.Context()
    try:
        yield context
    finally:
        context.destroy(linger=0)


def dealer(context: zmq.Context, endpoint: str, routing_id: bytes) -> zmq.Socket:
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.ROUTING_ID, routing_id)
    sock.connect(endpoint)
    return sock


def rpc_endpoint(base: str) -> str:
    host, port = base.rsplit(":", 1)
    return f"{host}:{int(port) + 1}"


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def jobs_on_a_held_routing_id(endpoint: str, record: Path) -> None:
    routing_id = b"zq-%d-%s" % (os.getpid(), os.urandom(4).hex().encode())
    with sockets() as context:
        old = dealer(context, endpoint, routing_id)
        old.send(encode_request("job", "old", "record", (str(record), "old")))
        wait_for(lambda: lines(record) == ["old"], what="the first connection's job to run")
        new = dealer(context, endpoint, routing_id)  # `old` stays connected: the worker still holds its id
        for index in range(N):
            new.send(encode_request("job", f"new-{index}", "record", (str(record), f"new {index}")))
        try:
            wait_for(lambda: len(lines(record)) == N + 1, timeout=slack(10), what="the second connection's jobs")
        except AssertionError:
            ran = len(lines(record)) - 1
            raise AssertionError(f"{N - ran} of {N} jobs sent on a reconnect with a held routing id never ran") from None


def calls_on_a_held_routing_id(endpoint: str) -> None:
    routing_id = b"zq-%d-%s" % (os.getpid(), os.urandom(4).hex().encode())
    with sockets() as context:
        old = dealer(context, endpoint, routing_id)
        old.send(encode_request("call", "old", "zqsync.ping"))
        assert old.poll(slack(10) * 1000), "no answer on the first connection"
        assert decode_reply(old.recv()).id == "old"
        new = dealer(context, endpoint, routing_id)
        for index in range(N):
            new.send(encode_request("call", f"new-{index}", "zqsync.ping"))
        answered: list[str] = []
        deadline = time.monotonic() + slack(10)
        while len(answered) < N and new.poll(max(0.0, deadline - time.monotonic()) * 1000):
            answered.append(decode_reply(new.recv()).id)
        assert sorted(answered) == sorted(f"new-{index}" for index in range(N)), (
            f"{N - len(answered)} of {N} calls on a reconnect with a held routing id went unanswered")
        assert not old.poll(0), "a reply went to the old connection"


@pytest.fixture(params=["standalone", *PREFORK_MODES])
def worker(request, zq_worker):
    """A standalone worker, or a prefork worker of two children (the router's public sockets, or the
    children's shared ones)."""
    prefork = PREFORK_MODES.get(request.param)
    return zq_worker(extra_args=["--processes", "2", *prefork] if prefork is not None else [])


def test_jobs_sent_on_a_reconnect_with_a_held_routing_id_run(worker, tmp_path):
    jobs_on_a_held_routing_id(worker.endpoint, tmp_path / "record.txt")


def test_calls_sent_on_a_reconnect_with_a_held_routing_id_are_answered(worker):
    calls_on_a_held_routing_id(rpc_endpoint(worker.endpoint))


def test_a_named_queue_runs_jobs_sent_on_a_reconnect_with_a_held_routing_id(zq_worker, tmp_path):
    worker = zq_worker(extra_args=["--queue", "low=tcp://127.0.0.1:0"])
    jobs_on_a_held_routing_id(worker.stats()["queues"]["low"]["endpoint"], tmp_path / "record.txt")


def keepalive_timers(port: int) -> list[str]:
    """The ``ss`` timer field of each established TCP connection whose local port is ``port``."""
    listed = subprocess.run(["ss", "-Htno", "state", "established", f"( sport = :{port} )"], capture_output=True,
                            text=True, timeout=20, check=True)
    return [line.split("timer:", 1)[1] if "timer:" in line else "(none)" for line in listed.stdout.splitlines()]


@pytest.mark.skipif(shutil.which("ss") is None, reason="iproute2's `ss` is not installed")
def test_the_worker_s_kernel_probes_its_client_connections(worker, tmp_path):
    port = int(worker.endpoint.rsplit(":", 1)[1])
    with sockets() as context:
        jobs = dealer(context, worker.endpoint, b"probe-jobs")
        jobs.send(encode_request("job", "one", "record", (str(tmp_path / "record.txt"), "one")))
        rpc = dealer(context, rpc_endpoint(worker.endpoint), b"probe-rpc")
        rpc.send(encode_request("call", "one", "zqsync.ping"))
        assert rpc.poll(slack(10) * 1000), "no answer"
        wait_for(lambda: lines(tmp_path / "record.txt") == ["one"], what="the job")
        seen: dict[str, list[str]] = {}

        def probed() -> bool:  # a connection with data in flight shows its retransmission timer until the ack
            seen.update(jobs=keepalive_timers(port), rpc=keepalive_timers(port + 1))
            return all(found and all(timer.startswith("(keepalive,") for timer in found) for found in seen.values())

        try:
            wait_for(probed, timeout=slack(5), what="keepalive timers")
        except AssertionError:
            raise AssertionError(f"the worker's client connections have no keepalive timer: {seen}") from None
