"""The prefork router and its children classify every rpc message alike: a mismatch would leave a child's
credit loop waiting forever (``dispatch.credit_kind``)."""

from __future__ import annotations

import msgpack
import pytest

from zqsync.wire import envelope
from zqsync.worker.dispatch import ADMIT, SLOT, credit_kind


@pytest.mark.parametrize(("body", "expected"), [
    (envelope.encode_request("confirm", "1", "echo", ("x",)), ADMIT),
    (msgpack.packb({"v": 1, "kind": "confirm", "task": 5}), ADMIT),  # malformed, but its kind says confirm
    (envelope.encode_request("call", "2", "echo", ("x",)), SLOT),
    (envelope.encode_request("job", "3", "echo"), SLOT),
    (b"\xc1 not msgpack", SLOT),
    (msgpack.packb([1, 2]), SLOT),
])
def test_confirmed_jobs_take_admit_credits_and_everything_else_slot_credits(body, expected):
    assert credit_kind(body) == expected
