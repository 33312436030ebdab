"""Logging: the command line's setup (``--log-level``, ``--log-format``, ``--log-config``), and
rate-limited logging for events a peer can cause in bulk (drops, malformed frames)."""

from __future__ import annotations

import argparse
import json
import logging
import logging.config
import os
import time
from typing import Any, Callable, Hashable, Optional

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Fields of each ``--log-format json`` record (one JSON object per line), besides any ``extra``.
JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s"
#: ``--log-config`` file suffixes: ``dictConfig`` from JSON, or ``fileConfig`` (ini).
CONFIG_SUFFIXES = {".json": "dict", ".ini": "file", ".conf": "file", ".cfg": "file"}


def add_logging_options(parser: argparse.ArgumentParser) -> None:
    """``--log-level``, ``--log-format`` and ``--log-config``, shared by every command."""
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                        help="logging level for zqsync's own messages (default: info)")
    parser.add_argument("--log-format", default="text", choices=["text", "json"],
                        help="text lines, or one JSON object per line (needs the 'json-logs' extra: "
                        "python-json-logger) (default: text)")
    parser.add_argument("--log-config", metavar="FILE",
                        help="configure logging from FILE instead: a logging.config dictionary in .json, or an "
                        "ini file (.ini, .conf, .cfg) for logging.config.fileConfig; --log-level and "
                        "--log-format are then ignored")


def configure_logging(level: str = "info", log_format: str = "text", config: Optional[str] = None) -> None:
    """Set up the root logger for a ``zqsync`` command.

    :param level: ``debug``, ``info``, ``warning`` or ``error``.
    :param log_format: ``text`` or ``json`` (python-json-logger's formatter).
    :param config: a ``.json`` (``dictConfig``) or ``.ini``/``.conf``/``.cfg`` (``fileConfig``) file,
        which replaces both other arguments.
    :raises SystemExit: the file cannot be read or is not a valid configuration, or
        ``json`` without python-json-logger; the message says which.
    """
    if config:
        _load_config(config)
        return
    handler = logging.StreamHandler()
    handler.setFormatter(_json_formatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def _json_formatter() -> logging.Formatter:
    try:
        from pythonjsonlogger.json import JsonFormatter
    except ImportError:
        try:  # python-json-logger before 3.1
            from pythonjsonlogger.jsonlogger import JsonFormatter  # type: ignore[no-redef]
        except ImportError as exc:
            raise SystemExit(f"zqsync: --log-format json needs python-json-logger: pip install "
                             f"'zqsync[json-logs]' ({exc})") from exc
    return JsonFormatter(JSON_FIELDS)  # type: ignore[no-any-return]


def _load_config(path: str) -> None:
    kind = CONFIG_SUFFIXES.get(os.path.splitext(path)[1].lower())
    if kind is None:
        raise SystemExit(f"zqsync: --log-config {path!r}: expected a .json, .ini, .conf or .cfg file")
    try:
        if kind == "dict":
            with open(path, encoding="utf-8") as file:
                logging.config.dictConfig(json.load(file))
        else:
            logging.config.fileConfig(path, disable_existing_loggers=False)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError) as exc:
        raise SystemExit(f"zqsync: --log-config {path!r} is not a usable logging configuration: "
                         f"{type(exc).__name__}: {exc}") from exc


class RateLimitedLog:
    """Logs a line per ``key`` at most once every ``interval`` seconds, counting what it held back.

    :param logger: where to log.
    :param interval: seconds between two lines for one key.
    :param clock: monotonic seconds (replaceable in tests).
    """

    def __init__(
        self, logger: logging.Logger, interval: float = 10.0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.logger = logger
        self.interval = interval
        self._clock = clock
        self._held: dict[Hashable, int] = {}
        self._last: dict[Hashable, float] = {}

    def warning(self, key: Hashable, message: str, *args: Any, exc_info: bool = False) -> None:
        """Log ``message % args`` at WARNING (with the current traceback if ``exc_info``), or count it if
        ``key`` was logged less than ``interval`` ago."""
        self.log(logging.WARNING, key, message, *args, exc_info=exc_info)

    def error(self, key: Hashable, message: str, *args: Any) -> None:
        """As `warning`, at ERROR."""
        self.log(logging.ERROR, key, message, *args)

    def log(self, level: int, key: Hashable, message: str, *args: Any, exc_info: bool = False) -> None:
        """Log ``message % args`` at ``level``, or count it if ``key`` was logged less than ``interval`` ago."""
        now = self._clock()
        if now - self._last.get(key, -self.interval) < self.interval:
            self._held[key] = self._held.get(key, 0) + 1
            return
        self._last[key] = now
        held = self._held.pop(key, 0)
        suffix = f" (and {held} more like it in the last {self.interval:.0f} s)" if held else ""
        self.logger.log(level, message + suffix, *args, exc_info=exc_info)
