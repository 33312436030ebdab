"""The worker's task slots (``inline.TaskSlots``): a slot held inline counts as the pool counts a spawned
greenlet: free slots, membership, ``wait_available``, ``join`` and ``kill`` all see it, and it is given back."""

from __future__ import annotations

import gevent
import gevent.event
import gevent.pool
import pytest

from zqsync.worker.inline import TaskSlots, run_inline

pytestmark = pytest.mark.timeout(30)


def _holder(slots: TaskSlots, started: gevent.event.Event, go: gevent.event.Event) -> gevent.Greenlet:
    """A greenlet that runs a task inline, holding one slot until ``go`` is set."""

    def task() -> None:
        started.set()
        go.wait()

    return gevent.spawn(run_inline, slots, lambda: None, task)


def test_a_held_slot_is_counted_and_given_back():
    slots = TaskSlots(2)
    started, go = gevent.event.Event(), gevent.event.Event()
    holder = _holder(slots, started, go)
    started.wait()
    assert (slots.free_count(), len(slots), holder in slots) == (1, 1, True)
    spawned = slots.spawn(go.wait)
    assert slots.free_count() == 0
    assert slots.wait_available(timeout=0.01) == 0  # full: nothing is available until one ends
    go.set()
    assert slots.join(timeout=5)  # both ended (a spawned greenlet leaves the pool by its link, a moment after)
    assert holder.dead and spawned.dead
    assert (slots.free_count(), len(slots), holder in slots) == (2, 0, False)


def test_join_waits_for_a_held_slot():
    slots = TaskSlots(1)
    started, go = gevent.event.Event(), gevent.event.Event()
    holder = _holder(slots, started, go)
    started.wait()
    assert not slots.join(timeout=0.05), "join returned while a task held a slot"
    go.set()
    assert slots.join(timeout=5)
    assert holder.dead


def test_kill_ends_a_holder_and_frees_its_slot():
    slots = TaskSlots(1)
    started, go = gevent.event.Event(), gevent.event.Event()
    holder = _holder(slots, started, go)
    started.wait()
    slots.kill(timeout=5)
    assert holder.dead and isinstance(holder.value, gevent.GreenletExit)
    assert (slots.free_count(), len(slots)) == (1, 0)


def test_holding_a_full_pool_raises_and_takes_nothing():
    slots = TaskSlots(1)
    blocker = slots.spawn(gevent.sleep, 5)
    with pytest.raises(gevent.pool.PoolFull):
        slots.hold(gevent.getcurrent())
    assert (slots.free_count(), len(slots), gevent.getcurrent() in slots) == (0, 1, False)
    blocker.kill()
    assert slots.join(timeout=5)
    assert slots.free_count() == 1


def test_a_slot_is_given_back_when_the_task_raises():
    slots = TaskSlots(1)

    def fails() -> None:
        raise ValueError("task failed")

    for _ in range(3):  # a slot not given back would leave none for the second run (PoolFull)
        with pytest.raises(ValueError):
            run_inline(slots, lambda: None, fails)
    assert (slots.free_count(), len(slots), slots.wait_available(timeout=0)) == (1, 0, 1)
