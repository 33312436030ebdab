"""The prefork router and its children classify every rpc message alike: a mismatch would leave a child's
credit loop waiting forever (``dispatch.credit_of``), and the router holds a confirmed job under its id."""

from __future__ import annotations

import msgpack
import pytest

from zqsync.wire import envelope
from zqsync.worker.dispatch import ADMIT, SLOT, credit_of


@pytest.mark.parametrize(("body", "expected"), [
    (envelope.encode_request("confirm", "1", "echo", ("x",)), (ADMIT, "1")),
    (msgpack.packb({"v": 1, "kind": "confirm", "task": 5}), (ADMIT, None)),  # malformed, but its kind says confirm
    (msgpack.packb({"v": 1, "kind": "confirm", "id": [1], "task": "echo"}), (ADMIT, None)),  # an id that is no str
    (envelope.encode_request("call", "2", "echo", ("x",)), (SLOT, "2")),
    (envelope.encode_request("job", "3", "echo"), (SLOT, "3")),
    (b"\xc1 not msgpack", (SLOT, None)),
    (msgpack.packb([1, 2]), (SLOT, None)),
])
def test_confirmed_jobs_take_admit_credits_and_everything_else_slot_credits(body, expected):
    assert credit_of(body) == expected
