"""``zqsync dashboard``: see and steer a fleet of workers from a web page (needs the ``web`` extra).

`serve` runs it; `zqsync.dashboard.app.create_app` builds the Flask app.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Optional

import gevent

from ..wire.curve import Curve

log = logging.getLogger(__name__)


def serve(endpoints: list[str], *, host: str = "127.0.0.1", port: int = 8008, token: Optional[str] = None,
          curve: Optional[Curve] = None, metrics_url: Optional[str] = None, interval: float = 1.0,
          ready: Optional[str] = None) -> None:
    """Poll ``endpoints`` and serve the dashboard on ``host:port`` until SIGTERM or SIGINT (blocks).

    :param token: the login token; required when ``host`` is not loopback.
    :param interval: seconds between polls of each worker's ``zqsync.stats``.
    :param ready: a file to write ``http://HOST:PORT`` into once listening (port 0 picks a free one).
    :raises ConfigurationError: off loopback without a token, or a malformed endpoint.
    """
    from gevent.pywsgi import WSGIServer

    from .app import check_bind, create_app
    from .fleet import Fleet

    check_bind(host, token)
    fleet = Fleet(endpoints, interval=interval, curve=curve)
    server = WSGIServer((host, port), create_app(fleet, token=token, metrics_url=metrics_url), log=None)
    server.start()
    url = f"http://{host if ':' not in host else f'[{host}]'}:{server.server_port}"
    log.info("zqsync dashboard on %s, polling %s every %s s", url, ", ".join(endpoints), interval)
    if ready:
        with open(ready + ".tmp", "w") as handle:
            handle.write(url)
        os.replace(ready + ".tmp", ready)
    fleet.start()
    for signum in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(signum, server.stop)
    try:
        server.serve_forever()
    finally:
        fleet.stop()
        server.stop(timeout=1)
