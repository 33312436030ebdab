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
HOLD = 1000  # admission.HELD_CONFIRMS, dispatch.HOLD_MAX: confirms held unacknowledged past the admissions
EXTRA = 50  # past every bound above
ROUNDS = 5
CONFIRM_RETRY = 1.0  # seconds, the client's default ZQSYNC_CONFIRM_RETRY

pytestmark = pytest.mark.timeout(180)


def _replies(sock: zmq.Socket, timeout: float) -> list[dict]:
    """The replies waiting on ``sock``, waiting up to ``timeout`` seconds for the first."""
    found = []
    while sock.poll(int(timeout * 1000) if not found else 0):
        found.append(msgpack.unpackb(sock.recv(), raw=False))
    return found


class Confirms:
    """A raw DEALER sending confirmed ``gated`` jobs to ``endpoint``'s rpc socket, as a client would.

    ``acks`` maps each answered job id to its first answer (a later one, to a resend, says duplicate).
    """

    def __init__(self, context: zmq.Context, endpoint: str, tmp_path) -> None:
        self.gate, self.ran = tmp_path / "gate", tmp_path / "ran"
        self.sock = _dealer(context, endpoint)
        self.bodies: dict[str, bytes] = {}
        self.acks: dict[str, dict] = {}

    def add(self, count: int) -> None:
        """``count`` new jobs, not sent yet."""
        for _ in range(count):
            job_id = uuid.uuid4().hex
            self.bodies[job_id] = envelope.encode_request("confirm", job_id, "gated",
                                                          (str(self.gate), str(self.ran), job_id))

    def send_unanswered(self) -> None:
        """Send every job not answered yet, once (again, for those sent before: same id)."""
        for job_id, body in self.bodies.items():
            if job_id not in self.acks:
                self.sock.send(body)

    def collect(self, timeout: float) -> None:
        """Read the answers waiting, waiting up to ``timeout`` seconds for the first."""
        for reply in _replies(self.sock, timeout):
            self.acks.setdefault(reply["id"], reply)

    def send_until(self, done, what: str) -> None:
        """Send the unanswered jobs again every ``CONFIRM_RETRY`` seconds until ``done()``."""
        deadline = time.monotonic() + slack(60.0)
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {len(self.acks)} answered"
            self.send_unanswered()
            resend_at = time.monotonic() + CONFIRM_RETRY
            while not done() and time.monotonic() < resend_at:
                self.collect(resend_at - time.monotonic())

    def ran_once(self) -> None:
        """Every job was answered ``ok``, and ran exactly once."""
        assert all(reply.get("ok") is True for reply in self.acks.values()), \
            [reply for reply in self.acks.values() if not reply.get("ok")]
        wait_for(lambda: self.ran.exists() and len(self.ran.read_text().split()) >= len(self.bodies),
                 what=f"all {len(self.bodies)} jobs to run")
        assert sorted(self.ran.read_text().split()) == sorted(self.bodies)


def _dealer(context: zmq.Context, endpoint: str) -> zmq.Socket:
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.connect(split_endpoint(endpoint)[1])
    return sock


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


@pytest.mark.parametrize("processes", [0, 2], ids=["standalone", "router"])
def test_health_calls_answer_while_every_slot_is_busy_and_the_confirm_backlog_is_full(zq_worker, tmp_path,
                                                                                       processes):
    args = ["--state-dir", str(tmp_path / "state"), *(["--processes", str(processes), "--router"] if processes else [])]
    worker = zq_worker(TASKS, concurrency=SLOTS, extra_args=args)
    children = max(1, processes)
    acknowledged_at_once = children * (SLOTS + BACKLOG)
    journaled_at_most = children * (SLOTS + BACKLOG + ADMISSIONS)
    context = zmq.Context()
    confirms, probe = Confirms(context, worker.endpoint, tmp_path), _dealer(context, worker.endpoint)
    try:
        confirms.add(journaled_at_most + (HOLD if processes else 0) + EXTRA)
        confirms.send_until(lambda: len(confirms.acks) >= acknowledged_at_once,
                            f"{acknowledged_at_once} confirms (every slot and the backlog) acknowledged")
        latencies: dict[str, list[float]] = {"zqsync.ping": [], "zqsync.stats": []}
        for _ in range(ROUNDS):
            for task, seconds in latencies.items():
                took, reply = _timed_call(probe, task)
                seconds.append(took)
                assert took < slack(1.0), f"{task}: no reply within {min(took, slack(5.0)):.3f} s (so far {latencies})"
        assert reply["result"]["state"] == "busy", reply["result"]
        confirms.collect(0.0)
        assert len(confirms.acks) <= journaled_at_most, \
            f"{len(confirms.acks) - journaled_at_most} confirm(s) acknowledged before they were journaled"
        print(f"while full ({processes or 'no'} prefork children): {latencies}")
        for task, seconds in latencies.items():
            assert statistics.median(seconds) < slack(0.1), f"{task} took {seconds} s"
        confirms.gate.touch()
        confirms.send_until(lambda: len(confirms.acks) == len(confirms.bodies), "every confirm answered")
    finally:
        confirms.sock.close()
        probe.close()
        context.term()
    confirms.ran_once()


@pytest.mark.parametrize("processes", [0, 1], ids=["standalone", "router"])
def test_a_resent_confirm_takes_one_place_in_the_hold(zq_worker, tmp_path, processes):
    """Confirms held past a full backlog and sent twice more under their ids, then more new ones: fewer
    jobs than the hold's places, though more messages. Once the slots free up, every one is answered
    without another resend: none was shed."""
    args = ["--state-dir", str(tmp_path / "state"), *(["--processes", str(processes), "--router"] if processes else [])]
    worker = zq_worker(TASKS, concurrency=SLOTS, extra_args=args)
    context = zmq.Context()
    confirms = Confirms(context, worker.endpoint, tmp_path)
    try:
        confirms.add(SLOTS + BACKLOG + ADMISSIONS)
        confirms.send_until(lambda: len(confirms.acks) >= SLOTS + BACKLOG, "every slot and the backlog taken")
        confirms.add(HOLD // 2)
        for _ in range(3):
            confirms.send_unanswered()
        confirms.add(HOLD // 2 - ADMISSIONS - EXTRA)
        confirms.send_unanswered()  # without the resends taking places, these fit in the hold
        confirms.collect(0.1)
        assert len(confirms.acks) <= SLOTS + BACKLOG + ADMISSIONS, "confirms acknowledged before their journaling"
        confirms.gate.touch()
        deadline = time.monotonic() + slack(30.0)
        while len(confirms.acks) < len(confirms.bodies) and time.monotonic() < deadline:
            confirms.collect(0.5)
        missing = len(confirms.bodies) - len(confirms.acks)
        assert not missing, f"{missing} of {len(confirms.bodies)} confirms unanswered without a resend: they were shed"
    finally:
        confirms.sock.close()
        context.term()
    confirms.ran_once()
