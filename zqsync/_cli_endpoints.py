"""``ZQSYNC_ENDPOINT`` as the default of the client commands' ENDPOINT arguments.

``zqsync call [ENDPOINT] TASK [ARG...]``: argparse fills an optional leading positional first, so with the
endpoint left out it takes the task's name. An endpoint always has a scheme (``tcp://``, ``srv://``) or at
least a ``:PORT``, and a task name neither, so any other first word is moved back to where it belongs and
the endpoint comes from the variable (its comma-separated list). Commands that take several endpoints (``job``,
``beat``, ``dashboard``) accept none, and argparse leaves the words after them where they belong.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any, Mapping, Optional

from .errors import ConfigurationError
from .settings import default_endpoint

HELP = "worker base endpoint, e.g. tcp://127.0.0.1:5555 (default: ZQSYNC_ENDPOINT)"
HELP_MANY = "worker base endpoints, e.g. tcp://127.0.0.1:5555 (default: ZQSYNC_ENDPOINT, comma-separated)"


def add_endpoint(parser: argparse.ArgumentParser, *, many: bool = False) -> None:
    """The leading ENDPOINT positional (``many``: ENDPOINT...), which ``ZQSYNC_ENDPOINT`` stands in for."""
    if many:
        parser.add_argument("endpoints", metavar="ENDPOINT", nargs="*", help=HELP_MANY)
    else:
        parser.add_argument("endpoint", metavar="ENDPOINT", nargs="?", help=HELP)
    parser.set_defaults(endpoint_arg="endpoints" if many else "endpoint")


def _from_env(command: str, env: Optional[Mapping[str, str]]) -> list[str]:
    try:
        return default_endpoint(env)
    except ConfigurationError:
        raise SystemExit(f"zqsync {command}: no ENDPOINT given and ZQSYNC_ENDPOINT is not set: give a worker "
                         "endpoint such as tcp://127.0.0.1:5555, or set ZQSYNC_ENDPOINT") from None


def json_or_str(text: str) -> Any:
    """A command-line task argument: JSON if it parses, else the string itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _looks_like_endpoint(word: str) -> bool:
    """``tcp://...``, ``srv://...``, or a ``HOST:PORT`` missing its scheme (left to the endpoint check to refuse)."""
    return "://" in word or re.fullmatch(r"[^\s:]+:\d+", word) is not None


def fill_endpoints(args: argparse.Namespace, env: Optional[Mapping[str, str]] = None) -> None:
    """Give ``args`` its endpoint(s) from ``ZQSYNC_ENDPOINT`` where the command line left them out.

    :raises SystemExit: none given and the variable unset or empty.
    """
    name = getattr(args, "endpoint_arg", None)
    if name is None:
        return
    given = getattr(args, name)
    words = [given] if isinstance(given, str) else list(given or ())
    if words and not _looks_like_endpoint(words[0]) and hasattr(args, "task"):  # call/enqueue: the task's name
        args.task, args.args, words = words[0], [json_or_str(args.task), *args.args], []
    if words:
        return
    endpoints = _from_env(args.command, env)
    setattr(args, name, endpoints if name == "endpoints" or len(endpoints) > 1 else endpoints[0])
