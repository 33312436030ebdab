"""Request options on the wire (``opts``): a delayed job's due time and a plain job's store flag."""

from __future__ import annotations

import msgpack
import pytest

from zqsync.errors import ProtocolError
from zqsync.wire import envelope


def test_options_round_trip_and_are_absent_when_unset():
    frame = envelope.encode_request("confirm", "j1", "t", (1,), {}, options={"due": 1.5e9, "store": True})
    assert envelope.decode_request(frame).options == {"due": 1.5e9, "store": True}
    plain = envelope.encode_request("job", "j2", "t")
    assert "opts" not in msgpack.unpackb(plain) and envelope.decode_request(plain).options == {}


@pytest.mark.parametrize("options", [{"due": "soon"}, {"due": True}, {"store": 1}, {"colour": "red"}, ["due"]])
def test_bad_options_are_refused_on_both_sides(options):
    with pytest.raises(ProtocolError):
        envelope.encode_request("confirm", "j1", "t", options=options)
    frame = msgpack.packb({"v": 1, "id": "j1", "kind": "confirm", "task": "t", "args": [], "kwargs": {},
                           "opts": options})
    with pytest.raises(ProtocolError):
        envelope.decode_request(frame)
