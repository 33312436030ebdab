"""The asyncio client's API on the in-process worker core: calls, plain and confirmed jobs, results,
task handles, and congestion control for plain jobs."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

import zqsync
from tests.helpers import slack
from tests.integration import aio_tasks, job_tasks
from zqsync.aio import AsyncClient, AsyncJob, AsyncTask
from zqsync.aio import tasks as aio_tasks_module
from zqsync.client import congestion

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def journaled(zq_inprocess, tmp_path):
    return zq_inprocess(job_tasks.registry, state_dir=str(tmp_path / "state"))


def test_calls_and_jobs_plain_and_confirmed_with_their_results(journaled, zq_async_client):
    client = zq_async_client(journaled.endpoint, call_timeout=slack(20))

    async def scenario() -> list:
        confirmed = await client.enqueue_with_options("add", args=(2, 3), confirm=True)
        stored = await client.enqueue_with_options("whoami", args=("me",), store_result=True)
        plain = await client.enqueue("add", 1, 1)
        with pytest.raises(zqsync.RemoteError, match="no good") as raised:
            await client.call("boom", "no good")
        with pytest.raises(zqsync.UnknownTask):
            await client.call("no.such.task")
        status = await confirmed.status()
        return [isinstance(confirmed, AsyncJob) and len(plain) == 32, await client.call("add", 20, 22),
                await confirmed.result(timeout=slack(20)), (await stored.result(timeout=slack(20)))[0],
                status.state in ("pending", "running", "done"), raised.value.remote_type]

    assert asyncio.run(scenario()) == [True, 42, 5, "me", True, "ValueError"]
    counters = journaled.join(3)
    assert counters["confirmed_accepted"] == 1 and counters["plain_received"] == 2
    stats = client.stats()
    assert (stats["enqueued"], stats["confirmed"], stats["calls"], stats["call_errors"]) == (2, 1, 3, 2)


def test_a_confirmed_job_to_a_worker_without_a_journal_raises_its_refusal(zq_inprocess, zq_async_client):
    worker = zq_inprocess(job_tasks.registry)
    client = zq_async_client(worker.endpoint)
    with pytest.raises(zqsync.NoJournal):
        asyncio.run(client.enqueue_with_options("add", args=(1, 2), confirm=True, send_timeout=slack(10)))


def test_async_task_handles_send_through_a_client_or_the_default_one(journaled, zq_async_client, monkeypatch):
    add = AsyncTask(job_tasks.add, zq_async_client(journaled.endpoint))

    async def scenario(handle: AsyncTask) -> list:
        job = await handle.aenqueue_with_options(args=(4, 4), confirm=True)
        return [await handle.acall(20, 22), await handle.acall_with_options(args=(1, 1)), await job.result(),
                len(await handle.aenqueue(0, 0))]

    assert asyncio.run(scenario(add)) == [42, 2, 8, 32]
    monkeypatch.setenv("ZQSYNC_ENDPOINT", journaled.endpoint)
    monkeypatch.setattr(aio_tasks_module, "_default", None)
    try:
        assert asyncio.run(AsyncTask(job_tasks.add).acall(2, 2)) == 4
        assert asyncio.run(aio_tasks_module.default_client().task(job_tasks.add).acall(3, 3)) == 6
    finally:
        aio_tasks_module.default_client().close()
    counters = journaled.join(2)
    assert counters["jobs_succeeded"] == 2 and counters["calls_succeeded"] == 4


@pytest.fixture
def absent_endpoint():
    """A base endpoint with nothing listening on its job port (bound, never listened: nobody else takes it)."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    yield f"tcp://127.0.0.1:{holder.getsockname()[1]}"
    holder.close()


def test_block_raises_congested_at_its_deadline_and_drop_drops_then_drops_early(absent_endpoint, zq_async_client,
                                                                                 caplog):
    client = zq_async_client(absent_endpoint, wait_before_drop=0.05)
    congestion.STATE._marked.discard(absent_endpoint)  # a mark another test left would skip DROP's first wait

    async def scenario() -> list:
        with pytest.raises(zqsync.Congested):
            await client.enqueue_with_options("add", args=(1, 2), congestion="block", send_timeout=0.05)
        drops = congestion.STATE.drops
        first = await client.enqueue_with_options("add", args=(1, 2), congestion="drop")  # waits CONNECT_GRACE
        marked = congestion.STATE.is_marked(absent_endpoint)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await client.enqueue_with_options("add", args=(1, 2), congestion="drop")  # marked: no wait at all
        return [len(first), marked, congestion.STATE.drops - drops, loop.time() - started < congestion.CONNECT_GRACE]

    with caplog.at_level(logging.WARNING, logger="zqsync.client.congestion"):
        assert asyncio.run(scenario()) == [32, True, 2, True]
    assert client.stats()["dropped"] == 2 and "dropped a job for" in caplog.text
    congestion.STATE._marked.discard(absent_endpoint)


def test_a_worker_s_plain_jobs_all_arrive(zq_inprocess, zq_async_client):
    worker = zq_inprocess(aio_tasks.registry)
    client = zq_async_client(worker.endpoint, pool_size=2)

    async def scenario() -> None:
        await asyncio.gather(*(client.enqueue("add", n, n) for n in range(200)))

    asyncio.run(scenario())
    assert worker.join(200)["plain_received"] == 200
    assert client.stats()["job_sockets"]["opened"] <= 2


def test_a_closed_client_refuses_requests():
    client = AsyncClient("tcp://127.0.0.1:9")
    client.close()
    with pytest.raises(zqsync.ClientClosed):
        asyncio.run(client.call("add", 1, 2))
    with pytest.raises(zqsync.ConfigurationError):
        AsyncClient("srv://workers.invalid")
