"""A periodic task for the beat test: each run appends a line to $ZQSYNC_BEAT_LOG."""

import os
import time

from zqsync.worker import Registry

registry = Registry()


@registry.periodic(every=1.0)
def tick():
    with open(os.environ["ZQSYNC_BEAT_LOG"], "a") as handle:
        handle.write(f"{time.time():.3f}\n")
