"""A Flask extension: one pooled `Client` per app, configured from ``app.config``.

::

    from flask import Flask
    from zqsync.contrib.flask import Zqsync

    zq = Zqsync()                       # at import time, in an extensions module

    def create_app():
        app = Flask(__name__)
        app.config["ZQSYNC_ENDPOINT"] = "tcp://127.0.0.1:5555"
        zq.init_app(app)
        return app

    @app.post("/signup")
    def signup():
        zq.enqueue("send_welcome", request.form["email"])   # the current app's client
        ...

Settings read from ``app.config`` by `Zqsync.init_app`:

``ZQSYNC_ENDPOINTS``
    a list of worker endpoints (or a comma-separated string);
``ZQSYNC_ENDPOINT``
    one endpoint (or a comma-separated string), used when ``ZQSYNC_ENDPOINTS``
    is unset; when neither is set, the ``ZQSYNC_ENDPOINT`` environment variable;
``ZQSYNC_CLIENT_OPTIONS``
    a dict of `Client` keyword arguments (``call_timeout``,
    ``pool_size``, ``congestion``, ...); ``curve`` may be a pair of key file paths.

The client lives in ``app.extensions["zqsync"]`` and is closed at process
exit with a bounded linger (`zqsync.contrib._config.EXIT_LINGER` seconds);
an app that is let go (an app factory's test app) takes its client and its
sockets with it.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from flask import Flask, current_app

from ..client.client import Client
from ._config import build_client

EXTENSION_KEY = "zqsync"


class Zqsync:
    """The zqsync extension; works with one app (``Zqsync(app)``) or an app factory (``init_app``).

    :param app: a `flask.Flask` app to initialise at once, or ``None``.
    """

    def __init__(self, app: Optional[Flask] = None) -> None:
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> Client:
        """Build the app's client from its config and store it in ``app.extensions["zqsync"]``.

        Opens no socket (each process opens its own on first use), so it is
        safe before gunicorn forks.

        :returns: the client.
        :raises ConfigurationError: no endpoint configured, a malformed
            endpoint, or an unknown option in ``ZQSYNC_CLIENT_OPTIONS``.
        """
        endpoints_setting = "ZQSYNC_ENDPOINTS" if app.config.get("ZQSYNC_ENDPOINTS") else "ZQSYNC_ENDPOINT"
        endpoints = app.config.get(endpoints_setting) or os.environ.get("ZQSYNC_ENDPOINT")
        client = build_client(endpoints, app.config.get("ZQSYNC_CLIENT_OPTIONS"),
                              endpoints_setting=endpoints_setting, options_setting="ZQSYNC_CLIENT_OPTIONS")
        app.extensions[EXTENSION_KEY] = client
        return client

    @property
    def client(self) -> Client:
        """The current app's client (needs an app context).

        :raises RuntimeError: outside an app context, or ``init_app`` was not called for this app.
        """
        try:
            return current_app.extensions[EXTENSION_KEY]
        except KeyError:
            raise RuntimeError(f"Zqsync.init_app() was not called for the Flask app {current_app.name!r}") from None

    def enqueue(self, task: str, *args: Any, **kwargs: Any) -> str:
        """`zqsync.Client.enqueue` on the current app's client: at most once; returns the job id."""
        return self.client.enqueue(task, *args, **kwargs)

    def call(self, task: str, *args: Any, **kwargs: Any) -> Any:
        """`zqsync.Client.call` on the current app's client: blocks for the result.

        :raises RemoteError: the task raised. :raises CallTimeout: no reply in time.
        """
        return self.client.call(task, *args, **kwargs)
