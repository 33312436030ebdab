"""Request deadlines on the wire: old frames stay valid, bad ones are refused, the budget counts from receipt."""

from __future__ import annotations

import time

import msgpack
import pytest

import zqsync
from zqsync.errors import ConfigurationError, ProtocolError
from zqsync.wire import envelope


def test_a_request_without_a_deadline_never_expires():
    frame = msgpack.packb({"v": 1, "id": "a", "kind": "call", "task": "t", "args": [], "kwargs": {}})
    request = envelope.decode_request(frame)
    assert request.deadline is None and request.sent is None and request.expires is None


def test_the_budget_is_stamped_on_receipt_by_the_monotonic_clock():
    frame = envelope.encode_request("call", "a", "t", deadline=2.5)
    before = time.monotonic()
    request = envelope.decode_request(frame)
    assert request.deadline == 2.5
    assert before + 2.5 <= request.expires <= time.monotonic() + 2.5


def test_a_request_sent_long_ago_by_the_wall_clock_expires_on_receipt():
    """A frame that waited in a stopped worker's buffers: its budget is long spent by the sender's clock."""
    stale = msgpack.packb({"v": 1, "id": "a", "kind": "job", "task": "t", "args": [], "kwargs": {},
                           "deadline": 0.5, "sent": time.time() - 0.5 - envelope.CLOCK_SKEW - 1.0})
    assert envelope.decode_request(stale).expires < time.monotonic()


@pytest.mark.parametrize("fields", [{"deadline": -1.0, "sent": 1.0}, {"deadline": "1", "sent": 1.0},
                                    {"deadline": float("nan"), "sent": 1.0}, {"deadline": 1.0},
                                    {"sent": 1.0}, {"deadline": True, "sent": 1.0}])
def test_a_malformed_deadline_is_a_protocol_error(fields):
    frame = msgpack.packb({"v": 1, "id": "a", "kind": "call", "task": "t", "args": [], "kwargs": {}, **fields})
    with pytest.raises(ProtocolError, match="must be a finite number of seconds"):
        envelope.decode_request(frame)


@pytest.mark.parametrize("options", [{"deadline": 0}, {"deadline": -1}])
def test_a_bad_job_deadline_is_refused_before_sending(options):
    with zqsync.Client("tcp://127.0.0.1:1") as client:
        with pytest.raises(ConfigurationError) as raised:
            client.enqueue_with_options("t", **options)
    assert raised.value.setting == "deadline"
