"""Confirms are admitted without a greenlet each, and acknowledged only after their group commit.

The journal's write lock is held by another connection, so the worker's
writer thread waits on it (``--journal-busy-timeout``) with confirms in
flight. Seen from the worker's side: how many greenlets it runs meanwhile
(a task of its own counts them), and that no acknowledgement leaves before
the commit.
"""

from __future__ import annotations

import os
import sqlite3
import uuid

import msgpack
import pytest
import zmq

import zqsync
from tests.helpers import slack, wait_for
from zqsync.wire import envelope
from zqsync.wire.endpoints import split_endpoint

TASKS = "tests.integration.confirm_ack_tasks:registry"
CONFIRMS = 40

pytestmark = pytest.mark.timeout(60)


def _hold_write_lock(state_dir: str) -> sqlite3.Connection:
    """A connection holding the journal's write lock until it rolls back."""
    connection = sqlite3.connect(os.path.join(state_dir, "journal.sqlite3"), isolation_level=None)
    connection.execute("BEGIN IMMEDIATE")
    return connection


def test_confirms_waiting_for_a_commit_hold_no_greenlet_and_are_acknowledged_after_it(zq_worker, tmp_path):
    state = str(tmp_path / "state")
    worker = zq_worker(TASKS, extra_args=["--state-dir", state, "--journal-busy-timeout", "30"])
    target = tmp_path / "out.txt"
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    try:
        dealer.connect(split_endpoint(worker.endpoint)[1])
        with zqsync.Client(worker.endpoint) as client:
            before = client.call("live_greenlets")
            lock = _hold_write_lock(state)
            try:
                ids = [uuid.uuid4().hex for _ in range(CONFIRMS)]
                for job_id in ids:
                    dealer.send(envelope.encode_request("confirm", job_id, "record", (str(target), job_id)))
                wait_for(lambda: worker.stats()["confirmed_received"] == CONFIRMS, what="every confirm to be read")
                during = client.call("live_greenlets")
                assert not dealer.poll(int(slack(0.3) * 1000)), "a confirm was acknowledged before its commit"
            finally:
                lock.rollback()
                lock.close()
        answers = {}
        while len(answers) < CONFIRMS and dealer.poll(int(slack(10.0) * 1000)):
            reply = msgpack.unpackb(dealer.recv(), raw=False)
            answers[reply["id"]] = reply
    finally:
        dealer.close(linger=0)
        context.term()
    assert during - before < CONFIRMS // 4, f"{during - before} more greenlets with {CONFIRMS} confirms waiting"
    assert sorted(answers) == sorted(ids)
    assert all(reply.get("result") == {"job_id": reply["id"], "duplicate": False} for reply in answers.values()), answers
    wait_for(lambda: target.exists() and len(target.read_text().splitlines()) == CONFIRMS, what="every job to run")
