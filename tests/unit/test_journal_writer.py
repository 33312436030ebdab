"""The journal's writer thread: its loop runs off the hub, and what it posts runs in the hub's thread, in order."""

from __future__ import annotations

import time

import gevent
import gevent.event
import pytest
from gevent import monkey

from zqsync.worker.journal_writer import WriterThread

native_ident = monkey.get_original("_thread", "get_ident")


@pytest.mark.timeout(60)
def test_the_loop_blocks_its_own_thread_while_the_hub_runs_and_posts_arrive_in_order_in_the_hub():
    seen: list[tuple[int, int]] = []
    loop_thread = gevent.event.AsyncResult()
    done = gevent.event.Event()

    def loop(writer: WriterThread) -> None:
        writer.post(loop_thread.set, native_ident())
        while True:
            batch = writer.next_batch(True, 10)
            writer.sleep(0.3)  # a slow commit: must not stall the hub
            for item in batch:
                if item is None:
                    writer.post(done.set)
                    return
                writer.post(lambda value: seen.append((value, native_ident())), item)

    writer = WriterThread(loop)
    for item in range(20):
        writer.put(item)
    writer.put(None)
    ticks = []
    ticker = gevent.spawn(lambda: [ticks.append(gevent.sleep(0.01)) for _ in range(1000)])
    gevent.sleep(0)
    writer.start()
    assert done.wait(timeout=30)
    ticker.kill()
    writer.close()
    hub = native_ident()
    assert loop_thread.get(timeout=1) != hub
    assert seen == [(item, hub) for item in range(20)]
    assert len(ticks) >= 20  # at least two slow batches (0.6 s) passed with the hub ticking every 10 ms


def _batches_of(writer: WriterThread, batches: list[list], taken: gevent.event.Event) -> None:
    """A writer loop that records each non-empty batch it takes (until a ``None`` item)."""
    while True:
        batch = writer.next_batch(True, 100)
        if batch:
            batches.append(batch)
            writer.post(taken.set)
        if None in batch:
            return


def _recording_writer(linger: float) -> tuple[WriterThread, list[list], gevent.event.Event]:
    """A started writer with :func:`_batches_of` as its loop: (writer, its batches, set on each batch)."""
    batches: list[list] = []
    taken = gevent.event.Event()
    writer = WriterThread(lambda w: _batches_of(w, batches, taken), linger=linger)
    writer.start()
    return writer, batches, taken


@pytest.mark.timeout(60)
def test_a_deferred_item_waits_for_the_next_batch_and_is_taken_first():
    writer, batches, taken = _recording_writer(linger=30.0)
    try:
        writer.defer("outcome")
        gevent.sleep(0.3)
        assert batches == [], "a deferred item alone does not wake the thread before its linger"
        writer.put("insert")
        assert taken.wait(timeout=10)
        assert batches == [["outcome", "insert"]]
    finally:
        writer.put(None)
        writer.close()


@pytest.mark.timeout(60)
def test_a_deferred_item_with_nothing_else_to_go_with_is_taken_after_its_linger():
    writer, batches, taken = _recording_writer(linger=0.2)
    try:
        started = time.monotonic()
        writer.defer("outcome")
        assert taken.wait(timeout=10)
        waited = time.monotonic() - started
        assert batches == [["outcome"]]
        assert waited >= 0.2, waited
        taken.clear()
        writer.defer("older")  # arms the timer
        gevent.sleep(0.1)
        writer.put("insert")  # takes "older" along
        assert taken.wait(timeout=10)
        taken.clear()
        started = time.monotonic()
        writer.defer("younger")  # the timer armed for "older" fires first, finds it gone, and waits on
        assert taken.wait(timeout=10)
        waited = time.monotonic() - started
        assert batches[1:] == [["older", "insert"], ["younger"]]
        assert waited >= 0.2, f"taken {waited:.3f} s after it was deferred: the older item's timer flushed it"
    finally:
        writer.put(None)
        writer.close()


@pytest.mark.timeout(60)
def test_a_thread_busy_elsewhere_is_woken_once_for_deferred_items_so_wake_ups_never_crowd_out_work():
    resume = monkey.get_original("_thread", "allocate_lock")()
    resume.acquire()
    batches: list[list] = []
    taken = gevent.event.Event()

    def loop(writer: WriterThread) -> None:
        batches.append(writer.next_batch(True, 5))
        writer.post(taken.set)
        resume.acquire()  # busy elsewhere, as while retrying a failed write
        batches.append(writer.next_batch(False, 5))
        writer.post(taken.set)

    writer = WriterThread(loop, linger=0.005)
    fires = []
    wake = writer._wake_for_deferred
    writer._wake_for_deferred = lambda: (fires.append(1), wake())
    writer.start()
    try:
        writer.put("first")
        assert taken.wait(timeout=10)
        taken.clear()
        writer.defer("outcome")
        while len(fires) < 10:  # the outcome waits past its linger, many times over
            gevent.sleep(0.005)
        writer.put("insert")
        resume.release()
        assert taken.wait(timeout=10)
        assert batches == [["first"], ["outcome", "insert"]], f"after {len(fires)} timer fires"
    finally:
        writer.close()


@pytest.mark.timeout(60)
def test_pause_holds_off_a_waiting_thread_and_refuses_while_it_writes_a_batch():
    writing = monkey.get_original("_thread", "allocate_lock")()
    writing.acquire()  # released to let the thread finish the batch it holds
    batches: list[list] = []
    taken = gevent.event.Event()

    def loop(writer: WriterThread) -> None:
        while True:
            batch = writer.next_batch(True, 10)
            batches.append(batch)
            writer.post(taken.set)
            if "slow" in batch:
                writing.acquire()  # a long commit
            if None in batch:
                return

    writer = WriterThread(loop)
    writer.start()
    try:
        writer.put("first")
        assert taken.wait(timeout=10)
        taken.clear()
        assert writer.pause(), "the thread waits for work with nothing queued"
        writer.put("queued while paused")
        assert not taken.wait(timeout=0.3), f"the paused thread took {batches[-1]}"
        writer.resume([])
        assert taken.wait(timeout=10)
        taken.clear()
        assert batches == [["first"], ["queued while paused"]]
        writer.put("slow")
        assert taken.wait(timeout=10)
        assert not writer.pause(), "the thread is writing a batch: the hub must not write beside it"
    finally:
        writing.release()
        writer.put(None)
        writer.close()
