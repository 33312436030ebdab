"""A FastAPI app that enqueues and calls zqsync tasks with :class:`zqsync.aio.AsyncClient`.

Serve ``workers/tasks.py`` and run the app (from the repository root)::

    zqsync worker workers.tasks:registry --bind tcp://127.0.0.1:5555 --state-dir /tmp/zq-state &
    ZQSYNC_ENDPOINT=tcp://127.0.0.1:5555 uvicorn --factory examples.fastapi_app:create_app

``POST /signup?email=...`` enqueues a welcome mail job (202 with its id); ``GET /add?a=1&b=2`` calls
``add`` and returns its result; ``POST /sums?a=1&b=2`` enqueues ``add`` as a confirmed job and
``GET /sums/{job_id}`` waits for its result. No handler blocks the event loop: every request to a
worker is an ``await``. One client serves the whole app (it keeps sockets per event loop), built
when the app starts and closed when it stops (the lifespan). A zqsync error becomes a JSON answer
with a 502, 503 or 504 status instead of a 500.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, AsyncIterator, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

import zqsync
from zqsync.aio import AsyncClient


def create_app(endpoint: Optional[str] = None, **client_options: Any) -> FastAPI:
    """Build the app for the worker at ``endpoint`` (default ``ZQSYNC_ENDPOINT``, else port 5555 here);
    ``client_options`` go to the :class:`AsyncClient` (``call_timeout=``, ``pool_size=``, ...)."""
    target = endpoint or os.environ.get("ZQSYNC_ENDPOINT", "tcp://127.0.0.1:5555")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncClient(target, **{"call_timeout": 5.0, "pool_size": 4, **client_options}) as client:
            app.state.zq = client
            yield

    app = FastAPI(lifespan=lifespan)
    app.add_exception_handler(zqsync.ZqsyncError, zqsync_failed)  # type: ignore[arg-type]

    @app.post("/signup", status_code=202)
    async def signup(email: str, request: Request) -> dict[str, str]:
        return {"job_id": await request.app.state.zq.enqueue("send_welcome", email)}

    @app.get("/add")
    async def add(a: int, b: int, request: Request) -> dict[str, int]:
        return {"result": await request.app.state.zq.call("add", a, b)}

    @app.post("/sums", status_code=202)
    async def enqueue_sum(a: int, b: int, request: Request) -> dict[str, str]:
        job = await request.app.state.zq.enqueue_with_options("add", args=(a, b), confirm=True)
        return {"job_id": str(job)}

    @app.get("/sums/{job_id}")
    async def sum_result(job_id: str, request: Request) -> dict[str, int]:
        return {"result": await request.app.state.zq.result(job_id, timeout=10.0)}

    return app


async def zqsync_failed(request: Request, exc: zqsync.ZqsyncError) -> JSONResponse:
    status = 504 if isinstance(exc, zqsync.CallTimeout) else 503 if isinstance(exc, zqsync.Congested) else 502
    return JSONResponse({"error": type(exc).__name__, "message": str(exc)}, status_code=status)
