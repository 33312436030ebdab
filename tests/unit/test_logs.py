"""Rate-limited logging: a flood of drops or malformed frames becomes one line per interval."""

import logging

from zqsync.logs import RateLimitedLog


def test_a_flood_is_logged_once_per_interval_with_a_count(caplog):
    limited = RateLimitedLog(logging.getLogger("flood"), interval=60.0)
    with caplog.at_level(logging.WARNING, logger="flood"):
        for index in range(1000):
            limited.warning("k", "dropped job %d", index)
        limited.warning("other", "a different key is logged on its own")
    assert [record.getMessage() for record in caplog.records] == [
        "dropped job 0", "a different key is logged on its own",
    ]


def test_the_next_line_after_the_interval_says_how_many_were_held_back(caplog):
    now = [100.0]
    limited = RateLimitedLog(logging.getLogger("flood2"), interval=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="flood2"):
        limited.warning("k", "first")
        limited.warning("k", "held")
        limited.warning("k", "held")
        now[0] += 10.0
        limited.warning("k", "later")
    assert [record.getMessage() for record in caplog.records] == [
        "first", "later (and 2 more like it in the last 10 s)",
    ]
