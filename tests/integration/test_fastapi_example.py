"""examples/fastapi_app.py, driven through its ASGI interface (httpx), against the in-process worker core
serving workers/tasks.py."""

from __future__ import annotations

import asyncio
import os
import runpy

import pytest

from tests.helpers import slack

fastapi = pytest.importorskip("fastapi", reason="the FastAPI example needs fastapi (pip install 'zqsync[fastapi]')")
httpx = pytest.importorskip("httpx", reason="the FastAPI example's test needs httpx (pip install 'zqsync[fastapi]')")

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def create_app(root):
    return runpy.run_path(os.path.join(root, "examples", "fastapi_app.py"))["create_app"]


async def requests(app, *calls: tuple) -> list:
    """Run the app's lifespan around ``calls`` (``(method, url)``): each answer as ``(status, json)``."""
    answers = []
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app.invalid") as web:
            for method, url in calls:
                if callable(url):
                    url = url(answers)
                answer = await web.request(method, url)
                answers.append((answer.status_code, answer.json()))
    return answers


def test_the_example_enqueues_calls_and_waits_for_a_result(zq_inprocess, create_app, tmp_path):
    from workers import tasks

    worker = zq_inprocess(tasks.registry, state_dir=str(tmp_path / "state"))
    app = create_app(worker.endpoint, call_timeout=slack(10))
    answers = asyncio.run(requests(
        app, ("POST", "/signup?email=ada@example.org"), ("GET", "/add?a=2&b=3"), ("POST", "/sums?a=20&b=22"),
        ("GET", lambda so_far: f"/sums/{so_far[2][1]['job_id']}"),
    ))
    assert answers[0][0] == 202 and len(answers[0][1]["job_id"]) == 32
    assert answers[1:] == [(200, {"result": 5}), (202, answers[2][1]), (200, {"result": 42})]
    counters = worker.join(2)
    assert counters["jobs_succeeded"] == 2 and counters["calls_succeeded"] >= 1


def test_a_worker_that_does_not_answer_becomes_a_504(create_app):
    app = create_app("tcp://127.0.0.1:9", call_timeout=0.2)
    assert asyncio.run(requests(app, ("GET", "/add?a=1&b=1")))[0][0] == 504
