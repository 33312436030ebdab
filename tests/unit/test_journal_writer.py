"""The journal's writer thread: its loop runs off the hub, and what it posts runs in the hub's thread, in order."""

from __future__ import annotations

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
