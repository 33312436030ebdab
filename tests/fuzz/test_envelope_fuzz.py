"""Property tests of the wire envelope, beyond test_protocol.py.

* Every valid request and reply round-trips to an identical value: same
  types (``True`` is not ``1``, ``1`` is not ``1.0``, ``-0.0`` keeps its sign,
  NaN stays NaN), nested lists and maps (non-str keys inside values), bytes,
  ints at the msgpack edges, nesting up to ``MAX_DEPTH``.
* Every other byte string makes ``decode_request`` and ``decode_reply``
  raise :class:`ProtocolError` and nothing else, or (for random and mutated
  bytes that happen to be valid) return a well-formed value: random bytes,
  every prefix of a valid frame, mutations of valid frames, wrong types in
  each field, missing fields, huge declared lengths, deep nesting (around
  msgpack's 1024-level stack and Python's recursion limit), non-str keys.
  Without hanging (every example has a deadline) or allocating much
  (huge declared lengths are measured with tracemalloc), and with a short
  error message (it is logged, and sent back to the peer).

Extra fields are ignored (forward compatibility), and ``args``, ``kwargs``
and ``result`` may be absent; both are tested as such.
"""

from __future__ import annotations

import array
import datetime
import math
import random
import time
import tracemalloc
from typing import Any, Callable

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.fuzzframes import HUGE_HEADERS, INT_EDGES, fuzz_message
from tests.helpers import slack
from zqsync.errors import ProtocolError
from zqsync.wire import envelope

fuzz_settings = settings(deadline=datetime.timedelta(seconds=slack(2.0)), max_examples=100,
                         suppress_health_check=[HealthCheck.too_slow])

# -- strategies ----------------------------------------------------------------

ints = st.sampled_from(INT_EDGES) | st.integers(-(2**63), 2**64 - 1)
scalars = st.none() | st.booleans() | ints | st.floats() | st.text(max_size=30) | st.binary(max_size=30)
keys = st.text(max_size=8) | ints | st.binary(max_size=4) | st.none() | st.booleans() | st.floats(allow_nan=False)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
                      max_leaves=20)
ids = st.text(min_size=1, max_size=envelope.MAX_ID)
tasks = st.text(min_size=1, max_size=envelope.MAX_TASK_NAME)
str_kwargs = st.dictionaries(st.text(max_size=8), values, max_size=4)
wrong_values = values | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=8))


@st.composite
def valid_requests(draw: Any) -> tuple[envelope.Request, bytes]:
    request = envelope.Request(draw(ids), draw(st.sampled_from(envelope.KINDS)), draw(tasks),
                               draw(st.lists(values, max_size=4)), draw(str_kwargs))
    return request, envelope.encode_request(request.kind, request.id, request.task, request.args, request.kwargs)


@st.composite
def valid_replies(draw: Any) -> tuple[envelope.Reply, bytes]:
    if draw(st.booleans()):
        reply = envelope.Reply(draw(ids), True, draw(values), None)
        return reply, envelope.encode_result(reply.id, reply.result)
    error = {name: draw(st.text(max_size=40)) for name in ("type", "message", "traceback")}
    reply = envelope.Reply(draw(ids | st.just("")), False, None, error)
    return reply, envelope.encode_error(reply.id, error["type"], error["message"], error["traceback"])


any_frame = valid_requests().map(lambda pair: pair[1]) | valid_replies().map(lambda pair: pair[1])

# -- oracles ---------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (1 is not True nor 1.0; -0.0 is not 0.0; NaN is NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return len(a) == len(b) and all(same(ka, kb) and same(va, vb) for (ka, va), (kb, vb) in zip(a.items(), b.items()))
    return a == b


def well_formed_request(request: Any) -> bool:
    return (type(request) is envelope.Request and type(request.id) is str and 1 <= len(request.id) <= envelope.MAX_ID
            and request.kind in envelope.KINDS and type(request.task) is str
            and 1 <= len(request.task) <= envelope.MAX_TASK_NAME and type(request.args) is list
            and type(request.kwargs) is dict and all(type(key) is str for key in request.kwargs))


def well_formed_reply(reply: Any) -> bool:
    if type(reply) is not envelope.Reply or type(reply.id) is not str or len(reply.id) > envelope.MAX_ID:
        return False
    if reply.ok is True:
        return bool(reply.id) and reply.error is None
    return (reply.ok is False and type(reply.error) is dict and sorted(reply.error) == ["message", "traceback", "type"]
            and all(type(value) is str for value in reply.error.values()))


DECODERS: tuple[tuple[Callable[[bytes], Any], Callable[[Any], bool]], ...] = (
    (envelope.decode_request, well_formed_request), (envelope.decode_reply, well_formed_reply))


def decodes_or_refuses(data: Any) -> None:
    """Both decoders return a well-formed value or raise ProtocolError; any other exception propagates."""
    for decode, well_formed in DECODERS:
        try:
            value = decode(data)
        except ProtocolError:
            continue
        assert well_formed(value), f"{decode.__name__} returned {value!r:.200}"


def refuses(decode: Callable[[bytes], Any], data: Any) -> ProtocolError:
    """``decode(data)`` raises ProtocolError (any other exception propagates); returns it."""
    with pytest.raises(ProtocolError) as caught:
        decode(data)
    return caught.value


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def pack_map(items: list[tuple[Any, bytes]]) -> bytes:
    """A map of keys and *already packed* values (so a value can be any bytes)."""
    return (bytes([0x80 | len(items)]) if len(items) < 16 else b"\xde" + len(items).to_bytes(2, "big")) + b"".join(
        pack(key) + value for key, value in items)


REQUEST = {"v": 1, "id": "r1", "kind": "call", "task": "add", "args": [1, 2], "kwargs": {"k": 3}}
REPLY_OK = {"v": 1, "id": "r1", "ok": True, "result": 3}
REPLY_ERROR = {"v": 1, "id": "r1", "ok": False, "error": {"type": "T", "message": "m", "traceback": "t"}}


def with_raw(message: dict, field: str, raw: bytes) -> bytes:
    """``message`` packed with ``field`` (or ``error.type``) set to the raw msgpack bytes ``raw``."""
    if field.startswith("error."):
        error = {k: v for k, v in message["error"].items() if k != field[6:]}
        raw = pack_map([*((k, pack(v)) for k, v in error.items()), (field[6:], raw)])
        field = "error"
    return pack_map([*((k, pack(v)) for k, v in message.items() if k != field), (field, raw)])


# -- round trips -------------------------------------------------------------------


@fuzz_settings
@given(valid_requests())
def test_every_valid_request_round_trips_to_an_identical_request(pair):
    request, frame = pair
    assert same(envelope.decode_request(frame), request)
    assert same(envelope.decode_request(bytearray(frame)), request)
    assert same(envelope.decode_request(memoryview(frame)), request)


@fuzz_settings
@given(valid_replies())
def test_every_valid_reply_round_trips_to_an_identical_reply(pair):
    reply, frame = pair
    assert same(envelope.decode_reply(frame), reply)


@pytest.mark.parametrize("number", INT_EDGES)
def test_ints_at_the_msgpack_edges_round_trip(number):
    request = envelope.decode_request(envelope.encode_request("call", "a", "t", [number, [number]], {"n": {number: number}}))
    assert same(request.args, [number, [number]]) and same(request.kwargs, {"n": {number: number}})
    assert same(envelope.decode_reply(envelope.encode_result("a", number)).result, number)


@pytest.mark.parametrize("number", [2**64, -(2**63) - 1, 10**30])
def test_ints_beyond_msgpack_raise_protocol_error_when_encoding(number):
    with pytest.raises(ProtocolError):
        envelope.encode_request("call", "a", "t", [number])
    with pytest.raises(ProtocolError):
        envelope.encode_result("a", {"deep": [number]})


def nest_lists(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_nesting_up_to_max_depth_round_trips_and_one_more_level_is_refused():
    depth = envelope.MAX_DEPTH  # the args list and the kwargs map count as one level
    request = envelope.decode_request(envelope.encode_request("call", "a", "t", nest_lists(depth), {"k": nest_lists(depth - 1)}))
    assert same(request.args, nest_lists(depth)) and same(request.kwargs, {"k": nest_lists(depth - 1)})
    for args, kwargs in ((nest_lists(depth + 1), {}), ((), {"k": nest_lists(depth)})):
        with pytest.raises(ProtocolError, match="MAX_DEPTH"):  # the client refuses it before sending, too
            envelope.encode_request("call", "a", "t", args, kwargs)
        frame = envelope._pack({"v": 1, "id": "a", "kind": "call", "task": "t", "args": list(args), "kwargs": kwargs})
        refuses(envelope.decode_request, frame)


@fuzz_settings
@given(st.lists(values | st.builds(object) | st.sets(st.integers(), max_size=2) | st.just(2**64)
                | st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2), max_size=3))
def test_encoding_anything_gives_a_decodable_frame_or_protocol_error(args):
    try:
        frame = envelope.encode_request("call", "a", "t", args)
    except ProtocolError:
        return
    assert same(envelope.decode_request(frame).args, args)


# -- invalid bytes -----------------------------------------------------------------


@fuzz_settings
@given(st.binary(max_size=4096))
def test_random_bytes_raise_protocol_error_or_decode_to_a_well_formed_value(data):
    decodes_or_refuses(data)


@fuzz_settings
@given(any_frame)
def test_every_prefix_of_a_valid_frame_raises_protocol_error(frame):
    for end in range(len(frame)):
        for decode, _ in DECODERS:
            refuses(decode, frame[:end])


@fuzz_settings
@given(any_frame, st.binary(min_size=1, max_size=8))
def test_trailing_bytes_raise_protocol_error(frame, extra):
    for decode, _ in DECODERS:
        refuses(decode, frame + extra)


@fuzz_settings
@given(any_frame, any_frame, st.data())
def test_mutated_valid_frames_raise_protocol_error_or_decode_to_a_well_formed_value(frame, other, data):
    buf = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(buf)))
        operation = data.draw(st.sampled_from(("flip", "set", "insert", "delete", "splice", "huge")))
        if operation == "flip" and at < len(buf):
            buf[at] ^= 1 << data.draw(st.integers(0, 7))
        elif operation == "set" and at < len(buf):
            buf[at] = data.draw(st.integers(0, 255))
        elif operation == "insert":
            buf[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        elif operation == "delete":
            del buf[at: at + data.draw(st.integers(1, 8))]
        elif operation == "splice":
            buf[at:] = other[data.draw(st.integers(0, len(other))):]
        elif operation == "huge":
            buf[at:at] = data.draw(st.sampled_from(HUGE_HEADERS))
    decodes_or_refuses(bytes(buf))


@settings(fuzz_settings, max_examples=50)
@given(st.randoms(use_true_random=False))
def test_the_worker_fuzzer_inputs_raise_protocol_error_or_decode_to_a_well_formed_value(rng):
    for _ in range(5):
        for part in fuzz_message(rng)[1]:
            decodes_or_refuses(part)


@pytest.mark.parametrize("data", [None, "text", 1, [b"\x80"], array.array("I", [1, 2]), memoryview(array.array("I", [1]))])
def test_frames_that_are_not_bytes_raise_protocol_error(data):
    for decode, _ in DECODERS:
        refuses(decode, data)


def test_the_size_limit_admits_exactly_max_size_bytes():
    frame = envelope.encode_request("call", "a", "t", [b"x" * 1000])
    assert envelope.decode_request(frame, max_size=len(frame)).args == [b"x" * 1000]
    assert "exceeds" in str(refuses(lambda data: envelope.decode_request(data, max_size=len(frame) - 1), frame))


# -- wrong shapes ----------------------------------------------------------------------


def invalid_for(field: str, value: Any) -> bool:
    """Whether ``value`` is invalid for request ``field`` (values equal to 1 for ``v``: see the version test)."""
    if field == "v":
        return value != 1
    if field in ("id", "task"):
        return type(value) is not str or not 1 <= len(value) <= (envelope.MAX_ID if field == "id" else envelope.MAX_TASK_NAME)
    if field == "kind":
        return value not in envelope.KINDS
    if field == "args":
        return type(value) is not list
    return type(value) is not dict or not all(type(key) is str for key in value)


@fuzz_settings
@given(st.sampled_from(("v", "id", "kind", "task", "args", "kwargs")),
       wrong_values | st.text(min_size=envelope.MAX_ID + 1, max_size=envelope.MAX_TASK_NAME + 2) | st.just(""))
def test_a_wrong_type_or_value_in_any_request_field_raises_protocol_error(field, value):
    if isinstance(value, msgpack.ExtType) or invalid_for(field, value):
        refuses(envelope.decode_request, pack({**REQUEST, field: value}))


@fuzz_settings
@given(st.sampled_from(("v", "id", "ok", "error")), wrong_values)
def test_a_wrong_type_or_value_in_any_reply_field_raises_protocol_error(field, value):
    valid = {"v": lambda v: v == 1,  # True and 1.0: see the version test
             "id": lambda v: type(v) is str and len(v) <= envelope.MAX_ID,  # "" is allowed in an error reply
             "ok": lambda v: type(v) is bool, "error": lambda v: type(v) is dict}[field]
    if isinstance(value, msgpack.ExtType) or not valid(value):
        refuses(envelope.decode_reply, pack({**REPLY_ERROR, field: value}))


@pytest.mark.parametrize("value", [True, 1.0], ids=["true", "float"])
def test_the_version_is_the_integer_1_not_a_bool_or_a_float(value):
    refuses(envelope.decode_request, pack({**REQUEST, "v": value}))
    refuses(envelope.decode_reply, pack({**REPLY_OK, "v": value}))


@pytest.mark.parametrize("field", ["v", "id", "kind", "task"])
def test_a_missing_request_field_raises_protocol_error(field):
    refuses(envelope.decode_request, pack({k: v for k, v in REQUEST.items() if k != field}))


@pytest.mark.parametrize("message, field", [(REPLY_OK, "v"), (REPLY_OK, "id"), (REPLY_OK, "ok"),
                                            (REPLY_ERROR, "v"), (REPLY_ERROR, "ok"), (REPLY_ERROR, "error")])
def test_a_missing_reply_field_raises_protocol_error(message, field):
    refuses(envelope.decode_reply, pack({k: v for k, v in message.items() if k != field}))


#: Optional request fields, checked when present (``envelope.py``): not "extra".
OPTIONAL = ("opts", "deadline", "sent")


def test_args_kwargs_and_result_are_optional():
    request = envelope.decode_request(pack({k: v for k, v in REQUEST.items() if k not in ("args", "kwargs")}))
    assert request.args == [] and request.kwargs == {}
    assert envelope.decode_reply(pack({k: v for k, v in REPLY_OK.items() if k != "result"})).result is None


@fuzz_settings
@given(st.dictionaries(keys.filter(lambda key: key not in REQUEST and key not in REPLY_ERROR and key not in OPTIONAL),
                       values, min_size=1, max_size=4))
def test_extra_fields_of_any_key_type_are_ignored(extra):
    assert same(envelope.decode_request(pack({**REQUEST, **extra})), envelope.decode_request(pack(REQUEST)))
    assert same(envelope.decode_reply(pack({**REPLY_ERROR, **extra})), envelope.decode_reply(pack(REPLY_ERROR)))


@pytest.mark.parametrize("key", [b"k", 1, None, True, 1.5, -(2**63)], ids=repr)
def test_kwargs_with_a_non_str_key_raise_protocol_error(key):
    refuses(envelope.decode_request, pack({**REQUEST, "kwargs": {"ok": 1, key: 2}}))


def test_non_str_keys_inside_argument_values_are_fine():
    args = [{1: "a", b"b": 2, None: [True], 1.5: {2: 3}}]
    assert same(envelope.decode_request(pack({**REQUEST, "args": args})).args, args)


def test_byte_string_envelope_keys_raise_protocol_error():
    for decode, message in ((envelope.decode_request, REQUEST), (envelope.decode_reply, REPLY_OK)):
        refuses(decode, pack({key.encode(): value for key, value in message.items()}))


@pytest.mark.parametrize("raw_key", [b"\x91\x01", b"\x81\xa1k\x01", b"\x90"], ids=["array", "map", "empty-array"])
def test_unhashable_map_keys_raise_protocol_error(raw_key):
    frame = b"\x85" + b"".join(pack(k) + pack(v) for k, v in REQUEST.items() if k != "kwargs") + raw_key + b"\x01"
    for decode, _ in DECODERS:
        refuses(decode, frame)


# -- hostile sizes and depths -------------------------------------------------------------------


PLACES = ["frame", "v", "id", "kind", "task", "args", "kwargs", "key"]


@pytest.mark.parametrize("header", HUGE_HEADERS, ids=lambda header: header[:5].hex())
def test_huge_declared_lengths_raise_protocol_error_without_allocating(header):
    tracemalloc.start()
    try:
        for place in PLACES:
            if place == "frame":
                frame = header + b"\x00" * 8
            elif place == "key":
                frame = b"\x81" + header + b"\x00" * 8
            else:
                frame = with_raw(REQUEST, place, header + b"\x00" * 8)
            for decode, _ in DECODERS:
                refuses(decode, frame)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024, f"decoding frames of a few bytes took {peak} bytes"


def deep(levels: int, shape: str) -> bytes:
    unit = {"array": b"\x91", "map": b"\x81\xa1k", "array32": b"\xdd\x00\x00\x00\x01"}[shape]
    return unit * levels + b"\xc0"


DEEP_CASES = [
    *((envelope.decode_request, REQUEST, field) for field in REQUEST),
    *((envelope.decode_reply, REPLY_OK, field) for field in REPLY_OK),
    *((envelope.decode_reply, REPLY_ERROR, field) for field in ("ok", "error", "error.type", "error.message")),
]


def test_deep_nesting_in_any_field_raises_protocol_error_and_nothing_else():
    """Around msgpack's 1024-level stack and Python's recursion limit (1000), in every field and at the top."""
    failures = []
    for levels in (990, 1000, 1010, 1023, 1024, 1025, 5000, 100_000):
        for shape in ("array", "map", "array32"):
            cases = [(decode, deep(levels, shape), "frame") for decode, _ in DECODERS]
            cases += [(decode, with_raw(message, field, deep(levels, shape)), field) for decode, message, field in DEEP_CASES]
            for decode, frame, field in cases:
                started = time.process_time()  # CPU seconds: a busy machine stretches wall-clock time
                try:
                    decode(frame)  # a deep result is valid; everything else must be refused
                except ProtocolError:
                    pass
                except Exception as exc:
                    failures.append(f"{decode.__name__}, {field}, {levels} levels of {shape}: {type(exc).__name__}: {exc}")
                assert time.process_time() - started < slack(2.0), f"{decode.__name__}, {field}, {levels} levels: too slow"
    assert not failures, f"{len(failures)} deeply nested frames raise something other than ProtocolError:\n" + "\n".join(
        failures[:12])


@pytest.mark.parametrize("field", ["v", "id", "kind", "task"])
def test_the_error_message_stays_short_for_a_huge_field(field):
    """The message is logged by the worker and sent back in the error reply: it must not grow with the frame."""
    for value in (b"\x00" * 1_000_000, [False] * 999_999, "\x00" * 1_000_000):
        error = refuses(envelope.decode_request, pack({**REQUEST, field: value}))
        assert len(str(error)) <= 1000, f"a {len(pack(value))}-byte {field!r} gives a {len(str(error))}-character message"


@pytest.mark.parametrize("shape", ["nils", "args-of-lists"])
def test_big_legal_structures_decode_without_hanging(shape):
    items = 1_000_000 if shape == "nils" else 200_000  # a million containers is slow under pytest's many live objects (gc)
    frame = {"nils": b"\xdd" + items.to_bytes(4, "big") + b"\xc0" * items,
             "args-of-lists": with_raw(REQUEST, "args", b"\xdd" + items.to_bytes(4, "big") + b"\x91\x90" * items)}[shape]
    started = time.process_time()  # CPU seconds: a busy machine stretches wall-clock time
    decodes_or_refuses(frame)
    assert time.process_time() - started < slack(10.0)


def test_the_fuzzer_is_reproducible():
    assert [fuzz_message(random.Random(7)) for _ in range(3)] == [fuzz_message(random.Random(7)) for _ in range(3)]
