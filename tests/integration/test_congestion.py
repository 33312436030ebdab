"""Congestion control against real workers stalled with SIGSTOP (docs/design.md, "Congestion control"; docs/scenarios.md, S14).

A stopped worker stops draining its PULL socket; once the client's HWM and
the kernel's socket buffers are full, a PUSH cannot send. Payloads are large
so that happens after a few hundred jobs rather than a few hundred thousand.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import zqsync
from tests.helpers import slack, wait_for
from zqsync.client import congestion, transport
from zqsync.client.congestion import STATE, CongestionControl

PAYLOAD = "x" * 65536
SMALL_HWM = ["--hwm", "5"]


@pytest.fixture
def stopped(zq_worker):
    """A worker with a small HWM and a client whose PUSH socket is connected, then the worker SIGSTOPped.

    The connection must exist first: with ZMQ_IMMEDIATE a socket whose
    handshake never completed queues nothing, so it would "fill" at once.
    """
    worker = zq_worker(extra_args=SMALL_HWM)
    client = zqsync.Client(worker.endpoint, hwm=5)
    client.enqueue("echo", "connect")
    wait_for(lambda: worker.stats()["jobs_received"] == 1, what="the connecting job")
    os.kill(worker.pid, signal.SIGSTOP)
    yield worker, client
    os.kill(worker.pid, signal.SIGCONT)
    client.close()


def fill_until_dropped(client: zqsync.Client, limit: int = 5000) -> int:
    """Enqueue big jobs with DROP until one is dropped; returns how many were sent first."""
    for sent in range(limit):
        client.enqueue_with_options("echo", args=(PAYLOAD,), congestion=CongestionControl.DROP)
        if client.stats()["dropped"]:
            return sent
    raise AssertionError(f"{limit} jobs never filled the stopped worker's buffers")


def test_drop_returns_at_once_while_the_worker_is_stopped_and_counts_drops(stopped):
    worker, client = stopped
    sent = fill_until_dropped(client)
    assert sent > 0, "the connected worker took jobs until its buffers filled"
    assert STATE.is_marked(client.endpoints[0])
    before = client.stats()
    started = time.monotonic()
    for _ in range(200):
        client.enqueue_with_options("echo", args=(PAYLOAD,), congestion="drop")
    per_job = (time.monotonic() - started) / 200
    after = client.stats()
    dropped, sent = after["dropped"] - before["dropped"], after["enqueued"] - before["enqueued"]
    # Every job was either handed to ZeroMQ (the kernel's buffers still grow a
    # little as TCP autotunes) or counted as dropped; most were dropped.
    assert dropped + sent == 200 and dropped >= 100, (dropped, sent)
    # Early drop never waits: far below wait_before_drop (1 ms) per job, with slack for a noisy machine.
    assert per_job < slack(client.settings.wait_before_drop * 20)


def test_block_raises_congested_within_its_deadline(stopped):
    worker, client = stopped
    for _ in range(5000):  # BLOCK sends while buffers have room, then must give up at its deadline
        started = time.monotonic()
        try:
            client.enqueue_with_options("echo", args=(PAYLOAD,), congestion="block", send_timeout=0.3)
        except zqsync.Congested as exc:
            elapsed = time.monotonic() - started
            assert exc.timeout == 0.3
            break
    else:
        raise AssertionError("5000 jobs never filled the stopped worker's buffers")
    assert 0.25 <= elapsed < slack(3.0)


def test_after_sigcont_jobs_flow_again_and_the_mark_clears(stopped, tmp_path):
    worker, client = stopped
    target = tmp_path / "after.txt"
    fill_until_dropped(client)
    os.kill(worker.pid, signal.SIGCONT)

    def sent_one() -> bool:
        before = client.stats()["enqueued"]
        client.enqueue_with_options("record", args=(str(target), "flowing"), congestion="drop")
        return client.stats()["enqueued"] > before

    wait_for(sent_one, interval=0.05, what="a DROP enqueue to be sent after SIGCONT")
    assert not STATE.is_marked(client.endpoints[0])
    wait_for(lambda: target.exists() and "flowing" in target.read_text(), what="the job to run")


def test_mark_cannot_stick_when_the_worker_drains_between_deadline_and_mark(stopped, monkeypatch, tmp_path):
    """zenoh's race: the consumer drains after the deadline expired but before the mark is set.

    The window is made reproducible: inside the failed send, after its
    deadline and before congestion.py sets the mark, the worker is resumed
    and the test waits until it has drained.
    """
    worker, client = stopped
    target = tmp_path / "race.txt"
    fill_until_dropped(client)
    STATE._marked.discard(client.endpoints[0])  # the next job takes the waiting (unmarked) path
    real_send = transport.send

    drained = []

    def send_then_drain(sock, frame, timeout):
        sent = real_send(sock, frame, timeout)
        if not sent and timeout:
            os.kill(worker.pid, signal.SIGCONT)
            wait_for(lambda: worker.stats()["jobs_received"] > 1, what="the worker to drain")
            drained.append(True)
        return sent

    monkeypatch.setattr(congestion.transport, "send", send_then_drain)
    for _ in range(200):  # the kernel's buffers may still take a job or two (TCP autotuning) before one fails
        client.enqueue_with_options("echo", args=(PAYLOAD,), congestion="drop")
        if drained:
            break
    monkeypatch.setattr(congestion.transport, "send", real_send)
    assert drained, "200 DROP sends to the stopped worker all went out: the window was never reached"
    assert STATE.is_marked(client.endpoints[0]), "the window was hit: dropped and marked after the drain"

    # The very next job probes, succeeds against the drained worker, and clears the mark. Drained: the
    # worker has received every job the client sent (an idle moment between two jobs is not enough:
    # on a busy machine the client's buffers may still be full then).
    sent = client.stats()["enqueued"]
    wait_for(lambda: worker.stats()["jobs_received"] == sent, what=f"the worker to receive all {sent} jobs")
    client.enqueue_with_options("record", args=(str(target), "after-race"), congestion="drop")
    assert not STATE.is_marked(client.endpoints[0])
    assert client.stats()["enqueued"] >= 2
    wait_for(lambda: target.exists() and "after-race" in target.read_text(), what="the job after the race to run")


def test_two_workers_one_stopped_enqueues_keep_reaching_the_healthy_one(zq_worker, tmp_path):
    stopped = zq_worker(extra_args=SMALL_HWM)
    healthy = zq_worker(extra_args=SMALL_HWM)
    total = 600
    try:
        with zqsync.Client([stopped.endpoint, healthy.endpoint], hwm=5, send_timeout=10.0) as client:
            def both_connected() -> bool:
                client.enqueue("echo", "connect")
                return bool(stopped.stats()["jobs_received"] and healthy.stats()["jobs_received"])

            wait_for(both_connected, what="jobs to reach both workers")  # connected to both before one stops
            connecting_jobs = client.stats()["enqueued"]
            before = healthy.stats()["jobs_received"]
            os.kill(stopped.pid, signal.SIGSTOP)
            for _ in range(total):
                client.enqueue_with_options("echo", args=(PAYLOAD,), congestion="block")
            assert client.stats()["enqueued"] == total + connecting_jobs and client.stats()["dropped"] == 0
        wait_for(lambda: healthy.stats()["in_flight"] == 0, what="the healthy worker to finish")
        share = (healthy.stats()["jobs_received"] - before) / total
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    print(f"healthy worker's share with its peer stopped: {share:.1%} of {total} jobs")
    assert share > 0.5


def test_every_worker_down_block_raises_within_deadline_and_drop_returns_at_once(tmp_path):
    """S14: nothing listens; BLOCK with a 0.5 s deadline, then DROP."""
    with zqsync.Client("tcp://127.0.0.1:9", send_timeout=0.5) as client:
        started = time.monotonic()
        with pytest.raises(zqsync.Congested):
            client.enqueue("add", 1, 2)
        assert 0.45 <= time.monotonic() - started < slack(2.5)
        started = time.monotonic()
        for _ in range(100):
            client.enqueue_with_options("add", args=(1, 2), congestion="drop")
        assert time.monotonic() - started < slack(2.0)  # 100 jobs: one CONNECT_GRACE wait (1 s), then early drops
        assert client.stats()["dropped"] == 100


def test_first_drop_job_of_a_new_socket_survives_a_handshake_slowed_by_a_busy_worker_host(zq_worker):
    """On a loaded machine a new socket's handshake can take longer than 0.1 s: the worker's I/O thread
    waits for a CPU. Made reproducible: the worker is stopped while the client connects and resumed
    0.3 s later; its first DROP job must still go out, not be dropped (``CONNECT_GRACE``)."""
    worker = zq_worker()
    os.kill(worker.pid, signal.SIGSTOP)
    resume = threading.Timer(0.3, os.kill, (worker.pid, signal.SIGCONT))
    try:
        with zqsync.Client(worker.endpoint, congestion="drop", wait_before_drop=0.0) as client:
            resume.start()
            client.enqueue("echo", "first")
            dropped = client.stats()["dropped"]
    finally:
        resume.cancel()
        os.kill(worker.pid, signal.SIGCONT)
    assert dropped == 0, "the first job of a new socket was dropped while the worker's host was busy"
    wait_for(lambda: worker.stats()["jobs_succeeded"] == 1, what="the first job to run")


def test_first_drop_job_of_a_new_socket_waits_for_the_connection_not_just_wait_before_drop(zq_worker):
    """Under DROP, a new socket's handshake (often > 1 ms on a loaded machine) must not cost its first job.

    ``wait_before_drop=0`` makes the handshake always longer than the wait, so
    the test does not depend on the machine's load.
    """
    worker = zq_worker()
    dropped = 0
    for _ in range(20):
        with zqsync.Client(worker.endpoint, congestion="drop", wait_before_drop=0.0) as client:
            client.enqueue("echo", "first")
            dropped += client.stats()["dropped"]
    assert dropped == 0
    wait_for(lambda: worker.stats()["jobs_succeeded"] == 20, what="every first job to run")
