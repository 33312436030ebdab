"""The dashboard's JSON API, version 1: ``/api/v1/...`` (the unversioned ``/api/...`` paths of
earlier releases answer the same, as aliases). ``docs/dashboard.md`` documents every path.

Reads answer ``{"workers": [{"endpoint", "result"} or {"endpoint", "error"}]}`` per worker asked
(``?endpoint=`` asks one). Actions (POST, JSON body, ``X-CSRF-Token``) run on one worker and answer
``{"endpoint", "result", "did", "why_not"}``: what the worker did, in words, and why it did less
than asked (``null`` when it did all of it); 502 with ``error`` when the worker failed.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from flask import Flask, Response, abort, jsonify, request

from ..errors import ZqsyncError
from .fleet import Fleet

log = logging.getLogger(__name__)

#: Seconds an admin call made for a page request may take.
ADMIN_TIMEOUT = 5.0
#: The API's version prefix; ``/api`` without it is an alias of the same views.
PREFIXES = ("/api/v1", "/api")


def add_api(app: Flask, fleet: Fleet) -> None:
    """Register the API's views on ``app`` under both `PREFIXES`."""
    views: dict[str, tuple[str, Callable[..., Any]]] = {
        "/state": ("GET", lambda: jsonify(workers=fleet.snapshot(), history=list(fleet.history),
                                          interval=fleet.interval)),
        "/jobs": ("GET", lambda: _read(fleet, "zqsync.jobs", state=_arg("state"), task=_arg("task"),
                                       since=_arg("since", float), until=_arg("until", float),
                                       offset=_arg("offset", int) or 0, limit=_arg("limit", int) or 50)),
        "/recent": ("GET", lambda: _read(fleet, "zqsync.recent", state=_arg("state"), task=_arg("task"),
                                         since=_arg("since", float), until=_arg("until", float),
                                         limit=_arg("limit", int) or 100)),
        "/job/<job_id>": ("GET", lambda job_id: _job(fleet, job_id)),
        "/requeue": ("POST", lambda: _requeue(fleet, _body())),
        "/cancel": ("POST", lambda: _cancel(fleet, _body())),
        "/purge": ("POST", lambda: _purge(fleet, _body())),
    }
    for path, (method, view) in views.items():
        name = path.strip("/").split("/")[0]
        for prefix in PREFIXES:
            app.add_url_rule(prefix + path, f"api_{name}{prefix.replace('/', '_')}", view, methods=[method])


def _arg(name: str, kind: type = str) -> Any:
    """A query parameter as ``kind``, or ``None`` when absent or empty; 400 when it is not a ``kind``."""
    text = request.args.get(name, "")
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        abort(_bad(f"{name} must be a {kind.__name__}, got {text!r}"))


def _read(fleet: Fleet, call: str, **kwargs: Any) -> Any:
    endpoint = request.args.get("endpoint")
    targets = [endpoint] if endpoint else [worker.endpoint for worker in fleet.workers]
    wanted = {key: value for key, value in kwargs.items() if value is not None}
    return jsonify(workers=[_answer(fleet, target, call, **wanted) for target in targets])


def _job(fleet: Fleet, job_id: str) -> Any:
    answers = [_answer(fleet, worker.endpoint, "zqsync.job", job_id=job_id) for worker in fleet.workers]
    found = [answer for answer in answers if answer.get("result", {}).get("state", "unknown") != "unknown"]
    return jsonify(found=found, answers=answers), 200 if found else 404


def _requeue(fleet: Fleet, body: dict[str, Any]) -> Any:
    ids = body.get("ids") or None
    as_of = body.get("as_of")
    if as_of is not None and (isinstance(as_of, bool) or not isinstance(as_of, (int, float))):
        abort(_bad("as_of must be the epoch seconds of the listing acted on (its \"now\")"))
    if ids is not None and not (isinstance(ids, list) and all(isinstance(job_id, str) for job_id in ids)):
        abort(_bad("ids must be a list of job ids"))

    def words(result: dict[str, Any]) -> tuple[str, Optional[str]]:
        return f"requeued {result['requeued']} job(s)", result["reason"]

    return _act(fleet, body, "zqsync.requeue", words, ids=ids, all_dead=not ids, as_of=as_of, explain=True)


def _cancel(fleet: Fleet, body: dict[str, Any]) -> Any:
    def words(result: dict[str, Any]) -> tuple[str, Optional[str]]:
        return (f"cancelled job {result['id']}" if result["cancelled"] else "cancelled nothing"), result.get("reason")

    return _act(fleet, body, "zqsync.cancel", words, job_id=_text(body, "id"))


def _purge(fleet: Fleet, body: dict[str, Any]) -> Any:
    older_than = body.get("older_than", 86400.0)
    if not isinstance(older_than, (int, float)) or isinstance(older_than, bool) or older_than < 0:
        abort(_bad("older_than must be a number of seconds >= 0"))

    def words(result: int) -> tuple[str, Optional[str]]:
        why = None if result else f"no dead job was last changed more than {older_than:g} s ago"
        return f"purged {result} dead job(s)", why

    return _act(fleet, body, "zqsync.purge", words, states=["dead"], older_than=float(older_than))


def _body() -> dict[str, Any]:
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        abort(_bad("send a JSON object"))
    return body


def _text(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if isinstance(value, str) and value:
        return value
    abort(_bad(f"{key} must be a non-empty string"))
    raise AssertionError("abort() raises")  # for type checkers that run without Flask installed


def _bad(message: str) -> Response:
    response = jsonify(error=message)
    response.status_code = 400
    return response


def _act(fleet: Fleet, body: dict[str, Any], call: str, words: Callable[[Any], tuple[str, Optional[str]]],
         **kwargs: Any) -> Any:
    """Run an action's admin call on the worker named by ``body["endpoint"]``; 502 if it failed.
    ``words(result)`` says what it did and why not."""
    answer = _answer(fleet, _text(body, "endpoint"), call, **kwargs)
    if "error" in answer:
        log.info("dashboard: %s on %s by %s failed: %s", call, answer["endpoint"], request.remote_addr, answer["error"])
        return jsonify(answer), 502
    answer["did"], answer["why_not"] = words(answer["result"])
    log.info("dashboard: %s on %s by %s: %s%s", call, answer["endpoint"], request.remote_addr, answer["did"],
             f" ({answer['why_not']})" if answer["why_not"] else "")
    return jsonify(answer), 200


def _answer(fleet: Fleet, endpoint: str, call: str, **kwargs: Any) -> dict[str, Any]:
    """``{"endpoint", "result"}`` or ``{"endpoint", "error"}`` of one admin call; 404 for an unknown endpoint."""
    try:
        client = fleet.worker(endpoint).client
    except KeyError:
        abort(Response(f"unknown endpoint {endpoint!r}", status=404))
    try:
        return {"endpoint": endpoint, "result": client.call_with_options(call, kwargs=kwargs, timeout=ADMIN_TIMEOUT)}
    except ZqsyncError as exc:
        text, name = str(exc), type(exc).__name__
        return {"endpoint": endpoint, "error": text if text.startswith(name) else f"{name}: {text}"}
