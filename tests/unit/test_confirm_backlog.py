"""The backlog bound on confirmed jobs: past it, a committed job's acknowledgement waits for a place."""

from __future__ import annotations

import os
import sqlite3
import time

import gevent
import gevent.event
import gevent.pool
import msgpack
import pytest

from tests.helpers import slack
from zqsync.wire import envelope
from zqsync.worker import Registry
from zqsync.worker.runner import Runner
from zqsync.worker.scheduler import build_scheduler

registry = Registry()
RAN: list[str] = []


@registry.task
def noop(key: str) -> None:
    RAN.append(key)


def _wait(condition, what: str) -> None:
    deadline = time.monotonic() + slack(20.0)
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        gevent.sleep(0.01)


def _pending_rows(state_dir: str) -> int:
    with sqlite3.connect(os.path.join(state_dir, "journal.sqlite3")) as db:
        return int(db.execute("SELECT COUNT(*) FROM jobs WHERE state = 'pending'").fetchone()[0])


@pytest.mark.timeout(60)
def test_acknowledgements_past_the_backlog_bound_wait_for_a_free_place(tmp_path):
    slots = gevent.pool.Pool(1)
    gate = gevent.event.Event()
    slots.spawn(gate.wait)  # the only task slot is busy: jobs stay in the backlog
    scheduler = build_scheduler(Runner(registry), slots, str(tmp_path), max_backlog=2, replay_interval=60.0)
    scheduler.start()
    answers: list[dict] = []
    keys = [f"job-{index}" for index in range(5)]
    try:
        for key in keys:
            request = envelope.decode_request(envelope.encode_request("confirm", key, "noop", (key,)))
            scheduler.runner.answer_confirm(request, registry.get("noop"),
                                            lambda reply: answers.append(msgpack.unpackb(reply)))
        _wait(lambda: _pending_rows(str(tmp_path)) == len(keys), "every job to be journaled")
        _wait(lambda: len(answers) >= 2, "the jobs that fit the backlog to be acknowledged")
        gevent.sleep(slack(0.3))
        # two places: one job taken by the dispatcher (waiting for the slot), one queued; the others wait
        assert [answer["id"] for answer in answers] == keys[:2]
        assert RAN == []
        gate.set()
        _wait(lambda: len(answers) == len(keys) and len(RAN) == len(keys), "every job to be acknowledged and run")
    finally:
        scheduler.stop()
    assert [answer["id"] for answer in answers] == keys
    assert all(answer["result"] == {"job_id": answer["id"], "duplicate": False} for answer in answers)
    assert sorted(RAN) == keys
