"""A Flask app that enqueues a job and makes a call per request, through one pooled client.

The client is created at import time, so under ``gunicorn --preload`` it is
created in the master and inherited by every forked worker; each worker
still opens its own sockets on first use and reuses them across requests.

Run it (with a worker serving zqsync.demo.tasks:registry on ZQSYNC_ENDPOINT)::

    ZQSYNC_ENDPOINT=tcp://127.0.0.1:5555 gunicorn -c python:zqsync.demo.gunicorn_conf zqsync.demo.webapp:app
"""

from __future__ import annotations

import os

from flask import Flask, jsonify, request

import zqsync

ENDPOINT = os.environ.get("ZQSYNC_ENDPOINT", "tcp://127.0.0.1:5555")
client = zqsync.Client(ENDPOINT)
app = Flask(__name__)


@app.errorhandler(zqsync.ZqsyncError)
def zqsync_failed(exc: zqsync.ZqsyncError):
    status = 504 if isinstance(exc, zqsync.CallTimeout) else 503 if isinstance(exc, zqsync.Congested) else 502
    return jsonify(error=type(exc).__name__, message=str(exc)), status


@app.get("/")
def enqueue_and_call():
    """Enqueue one ``add`` job and call ``add`` once; answer with both outcomes."""
    n = request.args.get("n", default=1, type=int)
    job_id = client.enqueue("add", n, 1)
    result = client.call("add", n, 1)
    return jsonify(job_id=job_id, result=result, pid=os.getpid())


@app.get("/enqueue")
def enqueue_only():
    """Enqueue one ``add`` job."""
    return jsonify(job_id=client.enqueue("add", 1, 1), pid=os.getpid())


@app.get("/call")
def call_only():
    """Call ``add`` once and answer with its result."""
    return jsonify(result=client.call("add", 1, 1), pid=os.getpid())


@app.get("/enqueue-per-request")
def enqueue_per_request():
    """Enqueue one ``add`` job through a Client made for this request alone, then closed.

    The anti-pattern the pool replaces (a new context and socket, a new
    connection, per request), kept for ``zqsync bench`` to compare against.
    """
    with zqsync.Client(ENDPOINT) as one_off:
        job_id = one_off.enqueue("add", 1, 1)
    return jsonify(job_id=job_id, pid=os.getpid())


@app.get("/health")
def health():
    """No zqsync at all: the baseline for benchmarks and the demo's readiness probe."""
    return jsonify(ok=True, pid=os.getpid())
