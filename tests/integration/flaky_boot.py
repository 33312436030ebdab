"""A task module that fails to import while the file named by ``ZQSYNC_TEST_BREAK_BOOT`` exists
(a deploy caught half-way)."""

import os

if os.path.exists(os.environ.get("ZQSYNC_TEST_BREAK_BOOT", "")):
    raise ImportError("caught mid-deploy: a module is half-written")

from zqsync.demo.tasks import registry  # noqa: E402

__all__ = ["registry"]
