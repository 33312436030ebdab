"""``zqsync.testing.run_in_fork``: what a child that hangs tells the parent."""

from __future__ import annotations

import time

import pytest

from zqsync.testing import ForkFailed, run_in_fork

pytestmark = pytest.mark.timeout(60)


def _sleeps_past_the_timeout() -> None:
    time.sleep(30)


def test_a_hung_child_is_killed_and_reported_with_where_it_hung():
    with pytest.raises(ForkFailed) as failure:
        run_in_fork(_sleeps_past_the_timeout, timeout=2.0)
    message = str(failure.value)
    assert "hung for more than 2.0 s and was killed" in message
    assert "_sleeps_past_the_timeout" in message, message


def test_a_childs_result_and_its_exception_reach_the_parent():
    assert run_in_fork(sum, [1, 2, 3]) == 6
    with pytest.raises(ZeroDivisionError) as failure:
        run_in_fork(divmod, 1, 0)
    assert "Traceback in the forked child" in "".join(failure.value.__notes__)
