"""The options of rate limits, soft time limits and expiry: checked when a task is registered or a job sent."""

from __future__ import annotations

import datetime

import pytest

import zqsync
from zqsync import ConfigurationError
from zqsync.worker import Registry
from zqsync.worker.ratelimit import TokenBucket


@pytest.mark.parametrize("rate, per_second", [("100/s", 100.0), ("10/m", 10 / 60), ("600/h", 1 / 6), (" 2.5 / s ", 2.5)])
def test_a_rate_limit_is_starts_per_second_or_minute_or_hour(rate, per_second):
    task = Registry().add(lambda: None, name="t", rate_limit=rate)
    assert task.rate_limit == pytest.approx(per_second)


@pytest.mark.parametrize("rate", ["100", "0/s", "10/d", "fast", "-1/s", "1/s/s", 10, b"1/s", ""])
def test_a_bad_rate_limit_is_refused_at_registration_naming_the_format(rate):
    registry = Registry()
    with pytest.raises(ConfigurationError, match=r"'N/s', 'N/m' or 'N/h'") as raised:
        registry.add(lambda: None, name="t", rate_limit=rate)
    assert raised.value.setting == "rate_limit" and "t" not in registry


def test_the_bucket_spaces_starts_by_the_interval_and_saves_up_one_start_only():
    now = [100.0]
    bucket = TokenBucket(20.0, clock=lambda: now[0])
    assert [bucket.reserve() for _ in range(3)] == pytest.approx([0.0, 0.05, 0.1])
    now[0] += 60.0  # a long idle time buys one start, not 1,200
    assert [bucket.reserve() for _ in range(2)] == pytest.approx([0.0, 0.05])


@pytest.mark.parametrize("options, message", [
    ({"soft_time_limit": 2.0, "time_limit": 2.0}, "below time_limit"),
    ({"soft_time_limit": 3.0, "time_limit": 2.0}, "below time_limit"),
    ({"soft_time_limit": 0}, "positive number"),
    ({"soft_time_limit": "1"}, "positive number"),
])
def test_a_soft_time_limit_is_positive_and_below_the_hard_one(options, message):
    with pytest.raises(ConfigurationError, match=message) as raised:
        Registry().add(lambda: None, name="t", **options)
    assert raised.value.setting == "soft_time_limit"


def test_a_soft_time_limit_alone_or_below_the_hard_one_is_kept():
    registry = Registry()
    assert registry.add(lambda: None, name="a", soft_time_limit=1.5).soft_time_limit == 1.5
    assert registry.add(lambda: None, name="b", soft_time_limit=1, time_limit=2).soft_time_limit == 1.0


@pytest.mark.parametrize("options, message", [
    ({"expires": datetime.datetime(2030, 1, 1)}, "aware datetime"),
    ({"expires": datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc)}, "in the past"),
    ({"expires": 0}, "above 0"),
    ({"expires": -1.0, "confirm": True}, "above 0"),
    ({"expires": "soon"}, "aware datetime"),
    ({"expires": 1.0, "deadline": 1.0}, "not both"),
])
def test_a_bad_expiry_is_refused_before_sending(options, message):
    with zqsync.Client("tcp://127.0.0.1:1") as client:
        with pytest.raises(ConfigurationError, match=message) as raised:
            client.enqueue_with_options("t", **options)
    assert raised.value.setting == "expires"
