"""The client refuses exactly what the worker refuses, and both refuse what the documented limits say.

``envelope.encode_request`` (the client, before sending) and ``decode_request``
(the worker, on receipt) share ``zqsync/wire/limits.py``'s walk, which skips
every container holding only scalars. Three verdicts are compared for each value
sent as a task argument:

* the client's: does ``encode_request`` accept it?
* the worker's: does ``decode_request`` accept the frame a hand-written client
  would send for it (``msgpack.packb`` of the same dict, no checks)?
* the limits' of ``envelope.py``, computed here by a plain recursive reading of
  them (a scalar counts as a level too): the oracle that catches a fast path
  skipping a check on both sides at once.

Values nest around ``MAX_DEPTH`` in lists, tuples and maps (str and int keys),
and end in scalars, empty containers, maps with tuple keys, msgpack's extension
types, or subclasses of list, dict and str.
"""

from __future__ import annotations

import collections
import datetime
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import slack
from zqsync.errors import ProtocolError
from zqsync.wire import envelope, limits

pytestmark = pytest.mark.timeout(120)


class Listy(list):
    pass


class Key(str):
    pass


def refused_by_the_limits(value: Any, level: int) -> bool:
    """Whether ``value`` at ``level`` breaks a limit of envelope.py's docstring (the oracle)."""
    if level > limits.MAX_DEPTH or isinstance(value, (msgpack.ExtType, msgpack.Timestamp)):
        return True
    if isinstance(value, (list, tuple)):
        return len(value) > limits.MAX_ITEMS or any(refused_by_the_limits(child, level + 1) for child in value)
    if isinstance(value, dict):
        return (len(value) > limits.MAX_ITEMS or not all(isinstance(key, limits.KEY_TYPES) for key in value)
                or any(refused_by_the_limits(child, level + 1) for child in value.values()))
    return False


def verdicts(value: Any) -> tuple[bool, bool, bool]:
    """(client accepts, worker accepts, the limits accept) for ``value`` sent as the one argument.

    A value msgpack cannot pack at all (an int past 64 bits) is refused by the limits' verdict too:
    no frame exists for the worker to see.
    """
    try:
        frame = envelope.encode_request("job", "j", "t", [value])
        client = True
    except ProtocolError:
        client = False
    try:
        raw = msgpack.packb({"v": 1, "id": "j", "kind": "job", "task": "t", "args": [value], "kwargs": {}})
    except (TypeError, ValueError, OverflowError):
        return client, False, False
    try:
        envelope.decode_request(raw)
        worker = True
    except ProtocolError:
        worker = False
    if client:
        assert frame == raw  # the very bytes a hand-written sender sends
    return client, worker, not refused_by_the_limits([value], 1)


leaves = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
          | st.text(max_size=4) | st.binary(max_size=4) | st.just([]) | st.just({}) | st.just(()) | st.just(Listy())
          | st.builds(lambda key: {key: 1}, st.tuples(st.integers()) | st.builds(Key, st.text(max_size=3)))
          | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4))
          | st.builds(msgpack.Timestamp, st.integers(0, 2**32)))
#: How one level wraps the value inside it, beside scalar siblings.
WRAPS = {
    "list": lambda inner, sibling: [sibling, inner],
    "tuple": lambda inner, sibling: (inner, sibling),
    "map": lambda inner, sibling: {"s": sibling, "k": inner},
    "int-keyed map": lambda inner, sibling: {1: inner},
    "ordered map": lambda inner, sibling: collections.OrderedDict(k=inner),
    "list subclass": lambda inner, sibling: Listy([inner]),
}


@st.composite
def nested(draw: Any) -> Any:
    value = draw(leaves)
    for wrap in draw(st.lists(st.sampled_from(sorted(WRAPS)), min_size=limits.MAX_DEPTH - 6,
                              max_size=limits.MAX_DEPTH + 2)):
        value = WRAPS[wrap](value, draw(st.none() | st.integers(0, 9) | st.text(max_size=2)))
    return value


@settings(max_examples=150, deadline=datetime.timedelta(seconds=slack(2.0)),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(nested() | leaves.map(lambda leaf: [leaf, {"a": [leaf]}]))
def test_the_client_refuses_what_the_worker_refuses_and_what_the_limits_say(value):
    client, worker, by_the_limits = verdicts(value)
    assert (client, worker) == (by_the_limits, by_the_limits), (
        f"client accepts: {client}, worker accepts: {worker}, the limits accept: {by_the_limits}")


def nest(levels: int, innermost: Any) -> list:
    value = innermost
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(("value", "accepted"), [
    (nest(limits.MAX_DEPTH - 2, 1), True),  # the args list, 98 lists, a scalar: level 100
    (nest(limits.MAX_DEPTH - 1, 1), False),  # a scalar at level 101
    (nest(limits.MAX_DEPTH - 2, []), True),  # an empty list at level 100
    (nest(limits.MAX_DEPTH - 2, {"k": "v"}), False),  # a map's value at level 101
    ([0] * limits.MAX_ITEMS, True),
    ([[0] * (limits.MAX_ITEMS + 1)], False),
    ([dict.fromkeys(range(limits.MAX_ITEMS + 1))], False),
    ([{"ok": [{(1, 2): "tuple key"}]}], False),
    ([{"ok": 1}, [msgpack.ExtType(1, b"x")]], False),
    ({"at": msgpack.Timestamp(1, 0)}, False),
], ids=["scalar-at-100", "scalar-at-101", "empty-at-100", "map-value-at-101", "max-items", "max-items-plus-one",
        "map-of-max-items-plus-one", "nested-tuple-key", "ext-type", "timestamp"])
def test_the_edges_of_each_limit_get_the_same_verdict_on_both_sides(value, accepted):
    assert verdicts(value) == (accepted, accepted, accepted)
