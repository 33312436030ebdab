"""A blocking client called from a coroutine says so, once; run in a thread it is quiet."""

from __future__ import annotations

import asyncio
import warnings

import pytest

import zqsync
from tests.conftest import MONKEY_PATCHED
from zqsync.client import client as client_module

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def unwarned(monkeypatch):
    monkeypatch.setattr(client_module, "_warned_event_loop", False, raising=False)


def test_a_call_from_a_coroutine_warns_once_with_the_remedy(zq_worker, unwarned):
    worker = zq_worker()

    async def handler(client: zqsync.Client) -> list:
        with pytest.warns(zqsync.ZqsyncWarning,
                          match=r"stalls the asyncio event loop.*zqsync\.aio\.AsyncClient.*asyncio\.to_thread"):
            first = client.call("add", 1, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return [first, client.call("add", 2, 2)]

    with zqsync.Client(worker.endpoint) as client:
        assert asyncio.run(handler(client)) == [3, 4]


@pytest.mark.skipif(MONKEY_PATCHED, reason="monkey-patched, asyncio.to_thread's threads are greenlets of the "
                                           "loop's own thread: the loop is running there")
def test_a_call_in_a_thread_of_an_asyncio_program_is_quiet(zq_worker, unwarned):
    worker = zq_worker()

    async def handler(client: zqsync.Client) -> int:
        return await asyncio.to_thread(client.call, "add", 20, 22)

    with zqsync.Client(worker.endpoint) as client, warnings.catch_warnings():
        warnings.simplefilter("error")
        assert asyncio.run(handler(client)) == 42
