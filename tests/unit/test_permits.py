"""FairPermits: first come, first served under one hub; timeouts and interrupts never leak a permit."""

from __future__ import annotations

import gevent
import pytest

from zqsync.client.permits import FairPermits


def test_waiters_are_served_in_arrival_order_even_against_a_greedy_releaser():
    permits = FairPermits(1)
    order: list[str] = []

    def greedy() -> None:
        for _ in range(5):
            assert permits.acquire()
            order.append("greedy")
            gevent.sleep(0.05)  # the others queue up meanwhile
            permits.release()  # then tries to take it straight back

    def patient(name: str) -> None:
        assert permits.acquire(timeout=5)
        order.append(name)
        permits.release()

    first = gevent.spawn(greedy)
    gevent.sleep(0)
    waiters = [gevent.spawn(patient, f"w{i}") for i in range(3)]
    gevent.joinall([first, *waiters], timeout=10, raise_error=True)
    # A barging semaphore lets "greedy" take all five turns before any waiter.
    assert order[:4] == ["greedy", "w0", "w1", "w2"]


def test_timed_out_waiter_leaves_the_queue_and_the_permit_count_is_intact():
    permits = FairPermits(1)
    assert permits.acquire()
    assert permits.acquire(timeout=0.05) is False
    permits.release()
    assert permits.acquire(blocking=False)


def test_a_waiter_interrupted_as_its_turn_comes_passes_the_permit_on():
    permits = FairPermits(1)
    assert permits.acquire()
    waiter = gevent.spawn(permits.acquire)
    gevent.sleep(0)
    waiter.kill(block=False)  # the kill is delivered first ...
    permits.release()  # ... though the permit was already handed to the waiter
    gevent.joinall([waiter], timeout=5)
    assert waiter.successful() is False or waiter.value is not True
    assert permits.acquire(timeout=1), "the permit vanished with the interrupted waiter"


def test_a_waiter_interrupted_while_queued_leaves_the_queue():
    permits = FairPermits(1)
    assert permits.acquire()
    waiter = gevent.spawn(permits.acquire)
    gevent.sleep(0)
    waiter.kill()
    permits.release()
    assert permits.acquire(blocking=False), "a dead waiter must not be handed the permit"


def test_non_blocking_acquire_does_not_jump_the_queue():
    permits = FairPermits(1)
    assert permits.acquire()
    waiter = gevent.spawn(permits.acquire, timeout=5)
    gevent.sleep(0)
    permits.release()
    assert permits.acquire(blocking=False) is False
    assert waiter.get(timeout=5) is True


@pytest.mark.parametrize("value", [1, 4])
def test_never_more_holders_than_permits(value):
    permits = FairPermits(value)
    holders = [0]
    peak = [0]

    def use() -> None:
        assert permits.acquire(timeout=5)
        holders[0] += 1
        peak[0] = max(peak[0], holders[0])
        gevent.sleep(0.001)
        holders[0] -= 1
        permits.release()

    gevent.joinall([gevent.spawn(use) for _ in range(40)], timeout=10, raise_error=True)
    assert peak[0] == value
