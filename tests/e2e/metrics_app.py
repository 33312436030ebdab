"""A Flask app for gunicorn's metrics test: one enqueue per request, and the fleet's metrics.

Run with ``PROMETHEUS_MULTIPROC_DIR`` set and ``zqsync.demo.gunicorn_conf``'s hooks.
"""

import os

from flask import Flask, Response, jsonify

import zqsync
from zqsync.contrib.prometheus import multiprocess_text

client = zqsync.Client(os.environ["ZQSYNC_ENDPOINT"])
app = Flask(__name__)


@app.get("/enqueue")
def enqueue():
    return jsonify(job_id=client.enqueue("add", 1, 1), pid=os.getpid())


@app.get("/metrics")
def metrics():
    return Response(multiprocess_text(), mimetype="text/plain")


@app.get("/health")
def health():
    return "ok"
