"""``zqsync.ping`` and ``zqsync.stats`` answer within 100 ms while every task slot is busy and the confirm
backlog is full, standalone and under the prefork supervisor (real worker processes).

A raw DEALER floods the worker with confirmed jobs whose task holds its slot until a gate file
exists: the first ones fill the slots, the next 1000 (the scheduler's backlog) are acknowledged, and the
rest wait unacknowledged, past every admission bound (the prefork router's hold included), sent again
under the same ids every second as a client does (``ZQSYNC_CONFIRM_RETRY``). Then the health calls are
timed from another socket, and no more confirms may have been acknowledged than were journaled.
Afterwards the gate opens, and every job must be acknowledged and run exactly once: holding or
shedding confirms loses none.
"""

from __future__ import annotations

import statistics
import time
import uuid

import msgpack
import pytest
import zmq

from tests.helpers import slack, wait_for
from zqsync.wire import envelope
from zqsync.wire.endpoints import split_endpoint

TASKS = "tests.integration.health_tasks:registry"
SLOTS = 2
BACKLOG = 1000  # scheduler.JobScheduler's max_backlog
ADMISSIONS = 64  # admission.ADMISSIONS: confirms in flight per process, here journaled past the backlog
ROUTER_HOLD = 1000  # dispatch.HOLD_MAX: confirms the prefork router holds for an admit credit
EXTRA = 50  # past every bound above (prefork)
HELD = 600  # standalone: confirms past the admissions (held, or shed from the first burst), sent RESENDS more
# times: more than the hold's 1000 messages, but fewer ids
RESENDS = 2
ROUNDS = 5
CONFIRM_RETRY = 1.0  # seconds, the client's default ZQSYNC_CONFIRM_RETRY

pytestmark = pytest.mark.timeout(180)


def _replies(sock: zmq.Socket, timeout: float) -> list[dict]:
    """The replies waiting on ``sock``, waiting up to ``timeout`` seconds for the first."""
    found = []
    while sock.poll(int(timeout * 1000) if not found else 0):
        found.append(msgpack.unpackb(sock.recv(), raw=False))
    return found


def _timed_call(sock: zmq.Socket, task: str) -> tuple[float, dict]:
    """Seconds until ``sock`` gets the reply to a call of ``task`` (``inf`` if none within 5 s), and the reply."""
    request_id = uuid.uuid4().hex
    started = time.perf_counter()
    sock.send(envelope.encode_request("call", request_id, task))
    while sock.poll(int(slack(5.0) * 1000)):
        reply = msgpack.unpackb(sock.recv(), raw=False)
        if reply.get("id") == request_id:
            return time.perf_counter() - started, reply
    return float("inf"), {}


def _flooded(worker, tmp_path, processes: int, extra: int) -> dict:
    """Flood, time the health calls while full, open the gate; returns the last ``zqsync.stats`` while full."""
    gate, ran = tmp_path / "gate", tmp_path / "ran"
    children = max(1, processes)
    acknowledged_at_once = children * (SLOTS + BACKLOG)
    journaled_at_most = children * (SLOTS + BACKLOG + ADMISSIONS)
    flood = journaled_at_most + (ROUTER_HOLD if processes else 0) + extra
    ids = [uuid.uuid4().hex for _ in range(flood)]
    bodies = {job_id: envelope.encode_request("confirm", job_id, "gated", (str(gate), str(ran), job_id))
              for job_id in ids}
    context = zmq.Context()
    dealer, probe = context.socket(zmq.DEALER), context.socket(zmq.DEALER)
    acks: dict[str, dict] = {}
    try:
        for sock in (dealer, probe):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(split_endpoint(worker.endpoint)[1])
        _send_until(dealer, bodies, acks, lambda: len(acks) >= acknowledged_at_once,
                    f"{acknowledged_at_once} confirms (every slot and the backlog) acknowledged")
        shed_before = _timed_call(probe, "zqsync.stats")[1].get("result", {}).get("confirms_shed")
        for _ in range(RESENDS):  # as the clients of the unacknowledged ones do
            _send_until(dealer, bodies, acks, lambda: False, "", rounds=1)
        latencies: dict[str, list[float]] = {"zqsync.ping": [], "zqsync.stats": []}
        for _ in range(ROUNDS):
            for task, seconds in latencies.items():
                took, reply = _timed_call(probe, task)
                seconds.append(took)
                assert took < slack(1.0), f"{task}: no reply within {min(took, slack(5.0)):.3f} s (so far {latencies})"
        acks.update((reply["id"], reply) for reply in _replies(dealer, 0.0))
        stats = {**reply["result"], "shed_before_resends": shed_before}
        assert stats["state"] == "busy", stats
        assert len(acks) <= journaled_at_most, f"{len(acks) - journaled_at_most} confirm(s) acknowledged early"
        print(f"while full ({processes or 'no'} prefork children): {latencies}")
        for task, seconds in latencies.items():
            assert statistics.median(seconds) < slack(0.1), f"{task} took {seconds} s"
        gate.touch()
        _send_until(dealer, bodies, acks, lambda: len(acks) == flood, "every confirm acknowledged")
    finally:
        dealer.close()
        probe.close()
        context.term()
    assert all(reply.get("ok") is True for reply in acks.values()), [r for r in acks.values() if not r.get("ok")]
    wait_for(lambda: ran.exists() and len(ran.read_text().split()) >= flood, what=f"all {flood} jobs to run")
    assert sorted(ran.read_text().split()) == sorted(ids)
    return stats


def _send_until(dealer: zmq.Socket, bodies: dict[str, bytes], acks: dict[str, dict], done, what: str, *,
                rounds: int = -1) -> None:
    """What a client does: send each unacknowledged confirm, again under its id every ``CONFIRM_RETRY``
    seconds, until ``done()`` or ``rounds`` sends (the first answer to an id counts; a later one to a
    resend says duplicate)."""
    deadline = time.monotonic() + slack(60.0)
    while not done() and rounds:
        rounds -= 1
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {len(acks)} of {len(bodies)} acknowledged"
        for job_id, body in bodies.items():
            if job_id not in acks:
                dealer.send(body)
        resend_at = time.monotonic() + CONFIRM_RETRY
        while not done() and time.monotonic() < resend_at:
            for reply in _replies(dealer, max(0.0, resend_at - time.monotonic())):
                acks.setdefault(reply["id"], reply)


def test_health_calls_answer_a_standalone_worker_whose_slots_and_confirm_backlog_are_full(zq_worker, tmp_path):
    worker = zq_worker(TASKS, concurrency=SLOTS, extra_args=["--state-dir", str(tmp_path / "state")])
    stats = _flooded(worker, tmp_path, 0, HELD)
    shed = stats["confirms_shed"] - stats["shed_before_resends"]
    assert shed == 0, f"resends under held ids took room in the hold: {shed} more shed"


def test_health_calls_answer_a_prefork_worker_whose_slots_and_confirm_backlog_are_full(zq_worker, tmp_path):
    worker = zq_worker(TASKS, concurrency=SLOTS,
                       extra_args=["--processes", "2", "--state-dir", str(tmp_path / "state")])
    _flooded(worker, tmp_path, 2, EXTRA)
