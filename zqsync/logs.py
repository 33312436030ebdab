"""Rate-limited logging, for events a peer can cause in bulk (drops, malformed frames)."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Hashable


class RateLimitedLog:
    """Logs a warning per ``key`` at most once every ``interval`` seconds, counting what it held back.

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
        """Log ``message % args`` (with the current traceback if ``exc_info``), or count it if ``key``
        was logged less than ``interval`` ago."""
        now = self._clock()
        if now - self._last.get(key, -self.interval) < self.interval:
            self._held[key] = self._held.get(key, 0) + 1
            return
        self._last[key] = now
        held = self._held.pop(key, 0)
        suffix = f" (and {held} more like it in the last {self.interval:.0f} s)" if held else ""
        self.logger.warning(message + suffix, *args, exc_info=exc_info)
