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
from gevent import monkey

from tests.helpers import slack
from zqsync.wire import envelope
from zqsync.worker import Registry, group_commit
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


def _count_transactions(monkeypatch) -> list[tuple[int, int, int]]:
    """Per journal transaction from now on (by the writer thread or the hub): inserts, starts, outcomes."""
    operations: list[tuple[int, int, int]] = []
    write_all, write_now = Journal.write_all, Journal.write_now

    def counting_all(journal, jobs=(), outcomes=(), starts=()):
        jobs, outcomes, starts = list(jobs), list(outcomes), list(starts)
        operations.append((len(jobs), len(starts), len(outcomes)))
        return write_all(journal, jobs, outcomes, starts)

    def counting_now(journal, jobs=(), outcomes=()):
        jobs, outcomes = list(jobs), list(outcomes)
        written = write_now(journal, jobs, outcomes)
        if written is not None:
            operations.append((len(jobs), 0, len(outcomes)))
        return written

    monkeypatch.setattr(Journal, "write_all", counting_all)
    monkeypatch.setattr(Journal, "write_now", counting_now)
    return operations


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
    operations = _count_transactions(monkeypatch)
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


def _started(tmp_path):
    """A started scheduler with four task slots journaling into ``tmp_path``: no replay meanwhile, and deferred
    outcomes wait for the next batch (the writer thread is never woken for them alone, however slow the machine:
    it could be writing when the hub looks)."""
    scheduler = build_scheduler(Runner(registry), TaskSlots(4), f"sqlite:///{tmp_path}", replay_interval=60.0)
    scheduler._commits._writer._linger = 600.0
    scheduler.start()
    return scheduler


def _journaled_by(monkeypatch) -> list[tuple[str, int, bool]]:
    """Per transaction that holds new jobs: ``("hub" or "writer", jobs, whether in the hub's native thread)``."""
    native_ident = monkey.get_original("_thread", "get_ident")
    hub = native_ident()
    seen: list[tuple[str, int, bool]] = []
    write_all, write_now = Journal.write_all, Journal.write_now

    def all_(journal, jobs=(), outcomes=(), starts=()):
        jobs = list(jobs)
        if jobs:
            seen.append(("writer", len(jobs), native_ident() == hub))
        return write_all(journal, jobs, outcomes, starts)

    def now(journal, jobs=(), outcomes=()):
        jobs = list(jobs)
        written = write_now(journal, jobs, outcomes)
        if written is not None:
            seen.append(("hub", len(jobs), native_ident() == hub))
        return written

    monkeypatch.setattr(Journal, "write_all", all_)
    monkeypatch.setattr(Journal, "write_now", now)
    return seen


def _writer_thread_starting_late(monkeypatch, seconds: float) -> None:
    """The journal's writer thread reaches its loop ``seconds`` after it started, as on a loaded machine."""
    loop = group_commit.GroupCommit._loop
    pause = monkey.get_original("time", "sleep")
    monkeypatch.setattr(group_commit.GroupCommit, "_loop", lambda commits, writer: (pause(seconds), loop(commits, writer)))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("thread_start", ["prompt", "late"])
def test_a_lone_confirm_is_journaled_in_the_hub_and_acknowledged_only_once_its_row_is_committed(
        tmp_path, monkeypatch, thread_start):
    RAN.clear()
    seen = _journaled_by(monkeypatch)
    if thread_start == "late":  # the thread runs but has not reached its loop when the first confirm comes
        _writer_thread_starting_late(monkeypatch, 1.0)
    monkeypatch.setattr(group_commit, "SLOW_COMMIT", 600.0)  # a loaded machine's stalls do not count here
    scheduler = _started(tmp_path)
    if thread_start == "late":
        gevent.sleep(0.1)  # the hub waits: the thread is scheduled
    rows_at_answer: list[tuple] = []

    def confirm(key: str) -> None:
        acknowledged = gevent.event.AsyncResult()
        # read from another connection while the answer is given: only a committed row is there
        _confirm_with(scheduler, key, lambda reply: (rows_at_answer.append(_row(str(tmp_path), key)),
                                                     acknowledged.set(reply)))
        assert acknowledged.get(timeout=slack(10))["result"] == {"job_id": key, "duplicate": False}
        _wait(lambda: key in RAN, f"job {key} to run")

    try:
        confirm("first")
        confirm("second")  # carries the first's outcome along
    finally:
        scheduler.stop()
    assert rows_at_answer == [("pending", 1, 1)] * 2, "an acknowledgement left before its row was committed"
    assert seen == [("hub", 1, True)] * 2, "a lone confirm went through the writer thread"


@pytest.mark.timeout(60)
def test_confirms_read_in_one_hub_iteration_share_one_group_commit_in_the_writer_thread(tmp_path, monkeypatch):
    RAN.clear()
    seen = _journaled_by(monkeypatch)
    scheduler = _started(tmp_path)
    answers: list[dict] = []
    try:
        keys = [f"burst-{index}" for index in range(20)]
        for key in keys:  # no yield in between: as the receiver admits what one read of its socket found
            _confirm(scheduler, key, answers)
        _wait(lambda: len(answers) == len(keys), "every job to be acknowledged")
    finally:
        scheduler.stop()
    assert sorted(answer["id"] for answer in answers) == sorted(keys)
    assert seen == [("writer", len(keys), False)], "a burst was not handed to the writer thread as one batch"


@pytest.mark.timeout(60)
def test_the_hub_never_waits_for_a_write_lock_another_connection_holds(tmp_path, monkeypatch):
    RAN.clear()
    seen = _journaled_by(monkeypatch)
    scheduler = _started(tmp_path)
    held = slack(2.0)
    gaps: list[float] = []

    def tick() -> None:
        last = time.monotonic()
        while True:
            gevent.sleep(0.01)
            gaps.append(time.monotonic() - last)
            last = time.monotonic()

    lock = sqlite3.connect(os.path.join(str(tmp_path), "journal.sqlite3"), isolation_level=None,
                           check_same_thread=False)
    lock.execute("BEGIN IMMEDIATE")
    release = gevent.get_hub().threadpool.spawn(lambda: (time.sleep(held), lock.rollback()))
    ticker = gevent.spawn(tick)
    acknowledged = gevent.event.AsyncResult()
    try:
        gevent.sleep(0.05)
        _confirm_with(scheduler, "locked-out", acknowledged.set)
        answer = acknowledged.get(timeout=slack(20))
        release.get(timeout=slack(20))
    finally:
        ticker.kill()
        scheduler.stop()
        lock.close()
    assert answer["result"] == {"job_id": "locked-out", "duplicate": False}
    assert seen == [("writer", 1, False)], "the hub wrote beside a held write lock"
    assert max(gaps) < held / 2, f"the hub stalled {max(gaps):.2f} s while the write lock was held for {held:.1f} s"


@pytest.mark.timeout(120)
def test_the_wal_stays_bounded_while_the_hub_journals_sequential_confirms(tmp_path):
    RAN.clear()
    scheduler = _started(tmp_path)
    wal = os.path.join(str(tmp_path), "journal.sqlite3-wal")
    jobs = 1500
    try:
        for index in range(jobs):  # one at a time, each alone in its hub iteration: all journaled by the hub
            acknowledged = gevent.event.AsyncResult()
            _confirm_with(scheduler, f"wal-{index}", acknowledged.set)
            acknowledged.get(timeout=slack(10))
        size = os.path.getsize(wal)
    finally:
        scheduler.stop()
    pages = size // 4096
    # Unchecked, the WAL holds a few pages per commit (at least 3 here: 4,500 for 1,500 jobs); SQLite's
    # automatic checkpoint restarts it once it holds 1000 pages, so it stays below that plus a lap of hub commits.
    assert pages < 2000, f"the WAL grew to {pages} pages ({size} bytes) over {jobs} confirms: never checkpointed"


@pytest.mark.timeout(60)
def test_after_a_slow_commit_in_the_hub_lone_confirms_go_to_the_writer_thread(tmp_path, monkeypatch):
    RAN.clear()
    seen = _journaled_by(monkeypatch)
    monkeypatch.setattr(group_commit, "SLOW_PAUSE", 600.0)
    write_now, stall = Journal.write_now, monkey.get_original("time", "sleep")
    stalls = [group_commit.SLOW_COMMIT * 3]

    def stalled_once(journal, jobs=(), outcomes=()):
        if stalls:
            stall(stalls.pop())  # as a write the kernel holds up for writeback
        return write_now(journal, jobs, outcomes)

    monkeypatch.setattr(Journal, "write_now", stalled_once)
    scheduler = _started(tmp_path)
    try:
        for key in ("stalled", "next", "and-next"):
            acknowledged = gevent.event.AsyncResult()
            _confirm_with(scheduler, key, acknowledged.set)
            assert acknowledged.get(timeout=slack(10))["result"] == {"job_id": key, "duplicate": False}
    finally:
        scheduler.stop()
    assert seen == [("hub", 1, True), ("writer", 1, False), ("writer", 1, False)]
