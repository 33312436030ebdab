"""Confirmed jobs in the scheduler: journal operations per job, and the backlog bound (past it, a committed
job's acknowledgement waits for a place)."""

from __future__ import annotations

import os
import sqlite3
import time

import gevent
import gevent.event
import msgpack
import pytest

from tests.helpers import slack
from zqsync.wire import envelope
from zqsync.worker import Registry
from zqsync.worker.inline import TaskSlots
from zqsync.worker.journal import Journal
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
    slots = TaskSlots(1)
    gate = gevent.event.Event()
    slots.spawn(gate.wait)  # the only task slot is busy: jobs stay in the backlog
    scheduler = build_scheduler(Runner(registry), slots, f"sqlite:///{tmp_path}", max_backlog=2, replay_interval=60.0)
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


def _confirm(scheduler, key: str, answers: list) -> None:
    _confirm_with(scheduler, key, answers.append)


def _confirm_with(scheduler, key: str, answer) -> None:
    """Confirm a ``noop(key)`` job; ``answer`` gets its decoded reply, in the hub."""
    request = envelope.decode_request(envelope.encode_request("confirm", key, "noop", (key,)))
    scheduler.runner.answer_confirm(request, registry.get("noop"), lambda reply: answer(msgpack.unpackb(reply)))


@pytest.mark.timeout(60)
def test_a_job_with_a_free_slot_costs_two_journal_operations_and_one_waiting_for_a_slot_three(tmp_path, monkeypatch):
    operations: list[tuple[int, int, int]] = []  # per transaction: inserts, starts, outcomes
    write_all = Journal.write_all

    def counting(journal, jobs=(), outcomes=(), starts=()):
        jobs, outcomes, starts = list(jobs), list(outcomes), list(starts)
        operations.append((len(jobs), len(starts), len(outcomes)))
        return write_all(journal, jobs, outcomes, starts)

    monkeypatch.setattr(Journal, "write_all", counting)
    slots = TaskSlots(1)
    scheduler = build_scheduler(Runner(registry), slots, f"sqlite:///{tmp_path}", replay_interval=60.0)
    scheduler.start()
    answers: list[dict] = []
    try:
        _confirm(scheduler, "free-slot", answers)
        _wait(lambda: "free-slot" in RAN and sum(op[2] for op in operations) == 1, "the job to run and settle")
        assert sum(op[1] for op in operations) == 0, "its first attempt was counted by its insert"
        gate = gevent.event.Event()
        slots.spawn(gate.wait)  # the only slot is busy: the next job waits, so its insert counts nothing
        _confirm(scheduler, "no-slot", answers)
        _wait(lambda: len(answers) == 2, "the second job to be acknowledged")
        gate.set()
        _wait(lambda: "no-slot" in RAN and sum(op[2] for op in operations) == 2, "the second job to run and settle")
        assert sum(op[1] for op in operations) == 1, "its attempt was counted before it started, on its own"
    finally:
        scheduler.stop()
    assert sum(op[0] for op in operations) == 2


GATE = gevent.event.Event()


@registry.task
def gated(key: str) -> None:
    GATE.wait()
    RAN.append(key)


@pytest.mark.timeout(60)
def test_a_job_that_yields_hands_dispatching_over_so_later_jobs_start_beside_it(tmp_path):
    RAN.clear()
    GATE.clear()
    scheduler = build_scheduler(Runner(registry), TaskSlots(3), f"sqlite:///{tmp_path}", replay_interval=60.0)
    scheduler.start()
    answers: list[dict] = []
    try:
        request = envelope.decode_request(envelope.encode_request("confirm", "gated", "gated", ("gated",)))
        scheduler.runner.answer_confirm(request, registry.get("gated"), lambda reply: answers.append(reply))
        _wait(lambda: len(answers) == 1, "the gated job to be acknowledged")
        for key in ("fast-1", "fast-2"):
            _confirm(scheduler, key, answers)
        _wait(lambda: sorted(RAN) == ["fast-1", "fast-2"], "the fast jobs to run while the gated one waits")
        GATE.set()
        _wait(lambda: len(RAN) == 3, "the gated job to finish")
    finally:
        GATE.set()
        scheduler.stop()
    assert RAN[-1] == "gated"


def _row(state_dir: str, job_id: str) -> tuple:
    with sqlite3.connect(os.path.join(state_dir, "journal.sqlite3")) as db:
        return db.execute("SELECT state, attempts, running FROM jobs WHERE id = ?", (job_id,)).fetchone()


@pytest.mark.timeout(60)
def test_a_stop_turns_jobs_counted_by_their_insert_but_never_started_back_into_plain_pending_rows(tmp_path):
    RAN.clear()
    slots = TaskSlots(2)
    scheduler = build_scheduler(Runner(registry), slots, f"sqlite:///{tmp_path}", replay_interval=60.0)
    scheduler.start()
    answers: list[dict] = []
    gate = gevent.event.Event()
    try:
        for key in ("x", "y"):  # two free slots: both inserts count a first attempt...
            _confirm(scheduler, key, answers)
        for _ in range(2):  # ...but the slots are taken before the commits
            slots.spawn(gate.wait)
        _wait(lambda: len(answers) == 2, "both jobs to be acknowledged")
        assert _row(str(tmp_path), "x") == ("pending", 1, 1)
        scheduler.pause()
    finally:
        scheduler.stop()
        gate.set()
    assert RAN == []
    assert [_row(str(tmp_path), key) for key in ("x", "y")] == [("pending", 0, 0)] * 2


@pytest.mark.timeout(60)
def test_the_journal_flush_timer_fires_at_most_once_per_linger_period_over_sequential_confirmed_jobs(tmp_path):
    RAN.clear()
    scheduler = build_scheduler(Runner(registry), TaskSlots(4), f"sqlite:///{tmp_path}", replay_interval=60.0)
    writer = scheduler._commits._writer
    fires: list[float] = []  # monotonic seconds of each real timer callback
    wake = writer._wake_for_deferred
    writer._wake_for_deferred = lambda: (fires.append(time.monotonic()), wake())
    scheduler.start()
    jobs = 200
    try:
        started = time.monotonic()
        for index in range(jobs):  # one at a time, as a sequential client: each waits for its acknowledgement
            acknowledged = gevent.event.AsyncResult()
            _confirm_with(scheduler, f"seq-{index}", acknowledged.set)
            assert acknowledged.get(timeout=slack(10))["result"]["duplicate"] is False
        _wait(lambda: len(RAN) == jobs, "every job to run")
        elapsed = time.monotonic() - started
        fired = sum(started <= at <= started + elapsed for at in fires)
    finally:
        scheduler.stop()
    linger = writer._linger
    bound = elapsed / linger + 2
    assert fired <= bound, (f"{fired} flush timer fires in {elapsed:.3f} s for {jobs} sequential confirmed jobs "
                            f"({fired / jobs:.1f} per job): more than one per {linger * 1e3:g} ms linger ({bound:.0f})")
