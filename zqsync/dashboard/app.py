"""``zqsync dashboard``: a Flask page over the workers' admin calls, served by gevent's WSGIServer.

It keeps no database: the fleet view comes from polling ``zqsync.stats``
(`zqsync.dashboard.fleet`), the journal views and actions from the
``zqsync.jobs``/``job``/``requeue``/``cancel``/``purge`` calls, made when asked.

Safety: it binds loopback unless given a token (`check_bind`). With a
token, every page and API call needs it: the login form stores it in the
session cookie, or a script sends ``Authorization: Bearer TOKEN``. Every POST
also needs the session's CSRF token in the ``X-CSRF-Token`` header. Without a
token, a request naming another ``Host`` than loopback is refused (DNS rebinding).
"""

from __future__ import annotations

import hmac
import logging
import secrets
from typing import Any, Optional

from flask import Flask, Response, jsonify, redirect, render_template, request, session, url_for

from ..errors import ConfigurationError
from ..wire.endpoints import is_loopback
from .api import add_api
from .fleet import Fleet

log = logging.getLogger(__name__)

#: Views that need no token (the login form and the vendored static files).
OPEN_VIEWS = ("login", "static")
#: Headers of every response: no MIME sniffing, no framing, and a CSP that runs only the page's own
#: files (no inline script or style, no other origin: the vendored uPlot is served from ``/static``).
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


def check_bind(host: str, token: Optional[str]) -> None:
    """Refuse to serve off loopback without a token.

    :param host: the address to bind (``127.0.0.1``, ``::1``, ``localhost``, ``0.0.0.0``...).
    :param token: the login token, or ``None``.
    :raises ConfigurationError: ``host`` is not loopback and ``token`` is empty.
    """
    if not (token or is_loopback(host)):
        raise ConfigurationError(f"binding {host} (not loopback) needs --token-file: anyone who reaches the "
                                 "page could requeue, cancel and purge jobs", setting="bind")


def _host_name(host: str) -> str:
    """``HOST`` of a ``Host`` header ``HOST[:PORT]`` (``[V6]:PORT`` too)."""
    if host.startswith("["):
        return host[1:host.find("]")]
    return host.rsplit(":", 1)[0]


def create_app(fleet: Fleet, *, token: Optional[str] = None, metrics_url: Optional[str] = None) -> Flask:
    """The dashboard's Flask app over ``fleet`` (which the caller starts and stops).

    :param token: the secret the page asks for; ``None``: no login (loopback only).
    :param metrics_url: the Prometheus endpoint to link to, if any.
    """
    app = Flask(__name__)
    app.config.update(SECRET_KEY=secrets.token_bytes(32), SESSION_COOKIE_HTTPONLY=True,
                      SESSION_COOKIE_SAMESITE="Strict")
    _guard(app, token)
    _pages(app, fleet, token, metrics_url)
    add_api(app, fleet)

    @app.after_request
    def harden(response: Response) -> Response:
        response.headers.update(SECURITY_HEADERS)
        return response

    return app


def _guard(app: Flask, token: Optional[str]) -> None:
    """Before each request: the token (if any) for every view but login; CSRF on every POST."""

    @app.before_request
    def check() -> Any:
        # Without a token only loopback is served: refuse another Host name, which a page that
        # re-pointed its own DNS name at 127.0.0.1 (DNS rebinding) would send.
        if not token and not is_loopback(_host_name(request.host)):
            return jsonify(error=f"Host {request.host!r} is not loopback; serve off loopback with --token-file"), 403
        if request.endpoint in OPEN_VIEWS:
            return None
        if token and not (session.get("authed") or _bearer_ok(token)):
            if request.path.startswith("/api/"):
                return jsonify(error="log in first: the dashboard needs its token"), 401
            return redirect(url_for("login"))
        if request.method == "POST" and not _bearer_ok(token):
            sent, expected = request.headers.get("X-CSRF-Token", ""), session.get("csrf", "")
            if not (expected and hmac.compare_digest(sent.encode(), expected.encode())):
                return jsonify(error="missing or wrong CSRF token (X-CSRF-Token header)"), 403
        return None


def _bearer_ok(token: Optional[str]) -> bool:
    sent = request.headers.get("Authorization", "")
    return bool(token) and hmac.compare_digest(sent.encode(), f"Bearer {token}".encode())


def _csrf() -> str:
    if "csrf" not in session:
        session["csrf"] = secrets.token_urlsafe(32)
    return str(session["csrf"])


def _pages(app: Flask, fleet: Fleet, token: Optional[str], metrics_url: Optional[str]) -> None:
    @app.get("/")
    def index() -> str:
        return render_template("index.html", csrf=_csrf(), interval=fleet.interval, metrics_url=metrics_url,
                               endpoints=[worker.endpoint for worker in fleet.workers])

    @app.route("/login", methods=["GET", "POST"])
    def login() -> Any:
        if not token:
            return redirect(url_for("index"))
        if request.method == "POST":
            if hmac.compare_digest(request.form.get("token", "").encode(), token.encode()):
                session.clear()
                session["authed"] = True
                return redirect(url_for("index"))
            log.warning("dashboard: a wrong token from %s", request.remote_addr)
            return Response(render_template("login.html", wrong=True), status=403)
        return render_template("login.html", wrong=False)


