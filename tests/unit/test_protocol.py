"""The wire envelope: round trips, and every malformed frame raises ProtocolError."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zqsync.errors import ProtocolError
from zqsync.wire import envelope

values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
ids = st.text(min_size=1, max_size=64)


@given(ids, st.sampled_from(envelope.KINDS), st.text(min_size=1, max_size=50), st.lists(values, max_size=4),
       st.dictionaries(st.text(max_size=8), values, max_size=4))
def test_request_round_trip_is_identity(request_id, kind, task, args, kwargs):
    decoded = envelope.decode_request(envelope.encode_request(kind, request_id, task, args, kwargs))
    assert decoded == envelope.Request(request_id, kind, task, args, kwargs)


options = st.fixed_dictionaries({}, optional={"due": st.floats(0, 1e10), "store": st.booleans(),
                                               "expires": st.integers(0, 2**40)})


@given(ids, st.sampled_from(envelope.KINDS), st.text(min_size=1, max_size=50), st.lists(values, max_size=4),
       st.dictionaries(st.text(max_size=8), values, max_size=4), options,
       st.none() | st.floats(0, 1e6))
def test_a_request_encodes_to_the_bytes_of_its_map_packed_whole(request_id, kind, task, args, kwargs, opts, deadline):
    """encode_request writes the map from pieces (envelope.py): the bytes must be msgpack's own for the same map,
    in the same order, whatever the options, the deadline, and the (kind, task) pieces cached meanwhile."""
    frame = envelope.encode_request(kind, request_id, task, args, kwargs, options=opts, deadline=deadline)
    message = {"v": envelope.VERSION, "id": request_id, "kind": kind, "task": task, "args": args, "kwargs": kwargs}
    if opts:
        message["opts"] = opts
    if deadline is not None:
        message["deadline"], message["sent"] = float(deadline), msgpack.unpackb(frame)["sent"]
    assert frame == msgpack.packb(message, use_bin_type=True)


@given(ids, values)
def test_result_reply_round_trip_is_identity(request_id, result):
    assert envelope.decode_reply(envelope.encode_result(request_id, result)) == envelope.Reply(request_id, True, result, None)


def test_error_reply_round_trip_keeps_type_message_and_traceback():
    reply = envelope.decode_reply(envelope.encode_error("r1", "ValueError", "bad", "Traceback..."))
    assert not reply.ok and reply.error == {"type": "ValueError", "message": "bad", "traceback": "Traceback..."}


@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_protocol_error_and_nothing_else(data):
    for decode in (envelope.decode_request, envelope.decode_reply):
        try:
            decode(data)
        except ProtocolError:
            pass


@pytest.mark.parametrize(
    "message, fault",
    [
        ({"v": 2, "id": "a", "kind": "call", "task": "t"}, "version"),
        ({"v": 1, "id": "", "kind": "call", "task": "t"}, "'id'"),
        ({"v": 1, "id": "a", "kind": "exec", "task": "t"}, "'kind'"),
        ({"v": 1, "id": "a", "kind": "call", "task": 5}, "'task'"),
        ({"v": 1, "id": "a", "kind": "call", "task": "t", "args": {}}, "'args'"),
        ({"v": 1, "id": "a", "kind": "call", "task": "t", "kwargs": {1: 2}}, "'kwargs'"),
        ([1, 2], "map"),
    ],
)
def test_invalid_request_fields_are_named_in_the_error(message, fault):
    with pytest.raises(ProtocolError, match=fault):
        envelope.decode_request(msgpack.packb(message))


def test_oversized_frame_is_refused_before_decoding():
    with pytest.raises(ProtocolError, match="exceeds"):
        envelope.decode_request(b"\x00" * 101, max_size=100)


def test_unserialisable_argument_raises_protocol_error():
    with pytest.raises(ProtocolError, match="cannot encode"):
        envelope.encode_request("call", "a", "t", (object(),))
