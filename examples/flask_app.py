"""A Flask app using the zqsync extension, with an app factory.

Serve ``workers/tasks.py`` and run the app (from the repository root)::

    zqsync worker workers.tasks:registry --bind tcp://127.0.0.1:5555 &
    ZQSYNC_ENDPOINT=tcp://127.0.0.1:5555 gunicorn -k gevent 'examples.flask_app:create_app()'

``POST /signup`` enqueues a welcome mail job; ``GET /add?a=1&b=2`` calls the
``add`` task and returns its result. A zqsync error becomes a JSON answer
with a 502, 503 or 504 status instead of a 500 page.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from flask import Flask, jsonify, request

import zqsync
from zqsync.contrib.flask import Zqsync

zq = Zqsync()


def create_app(config: Optional[dict[str, Any]] = None) -> Flask:
    """Build the app; ``config`` overrides ``app.config`` (the tests pass ``ZQSYNC_ENDPOINT`` here)."""
    app = Flask(__name__)
    app.config["ZQSYNC_ENDPOINT"] = os.environ.get("ZQSYNC_ENDPOINT", "tcp://127.0.0.1:5555")
    app.config["ZQSYNC_CLIENT_OPTIONS"] = {"call_timeout": 5.0, "pool_size": 4}
    app.config.update(config or {})
    zq.init_app(app)
    app.register_error_handler(zqsync.ZqsyncError, zqsync_failed)
    app.add_url_rule("/signup", view_func=signup, methods=["POST"])
    app.add_url_rule("/add", view_func=add)
    app.add_url_rule("/health", view_func=health)
    return app


def zqsync_failed(exc: zqsync.ZqsyncError) -> Any:
    status = 504 if isinstance(exc, zqsync.CallTimeout) else 503 if isinstance(exc, zqsync.Congested) else 502
    return jsonify(error=type(exc).__name__, message=str(exc)), status


def signup() -> Any:
    """Enqueue ``send_welcome`` for the posted address; answers 202 with the job id."""
    return jsonify(job_id=zq.enqueue("send_welcome", request.form["email"])), 202


def add() -> Any:
    """Call ``add`` with the query's ``a`` and ``b``."""
    return jsonify(result=zq.call("add", request.args.get("a", 0, type=int), request.args.get("b", 0, type=int)))


def health() -> Any:
    return jsonify(ok=True)
