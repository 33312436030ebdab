"""Demo tasks served by ``zqsync demo``, the e2e tests and the benchmarks.

Run them with::

    zqsync worker zqsync.demo.tasks:registry --bind tcp://127.0.0.1:5555
"""

from __future__ import annotations

import hashlib
import os
import time

from zqsync.worker import Registry

registry = Registry()


@registry.task
def add(a, b):
    """Return ``a + b``."""
    return a + b


@registry.task
def echo(value):
    """Return ``value`` unchanged (any msgpack-serialisable value)."""
    return value


@registry.task(time_limit=60.0)
def sleep(seconds):
    """Sleep ``seconds`` (float), cooperatively; return the seconds slept."""
    time.sleep(float(seconds))  # the worker monkey-patches, so this yields
    return seconds


@registry.task
def checksum(data, rounds=1000):
    """CPU-bound: SHA-256 ``rounds`` times over a buffer built from ``data``; return the hex digest.

    :param data: str or bytes seed.
    :param rounds: hashing rounds (int, at most 1,000,000).
    """
    if not 0 < int(rounds) <= 1_000_000:
        raise ValueError(f"rounds must be 1..1000000, got {rounds}")
    seed = data.encode() if isinstance(data, str) else bytes(data)
    buffer = (seed or b"\0") * max(1, 4096 // max(1, len(seed)))
    digest = hashlib.sha256(buffer).digest()
    for _ in range(int(rounds)):
        digest = hashlib.sha256(digest + buffer).digest()
    return digest.hex()


@registry.task
def fail(message):
    """Raise ``RuntimeError(message)``: shows how remote errors reach the caller."""
    raise RuntimeError(message)


@registry.task
def record(path, line, delay=0.0):
    """Append ``line`` and a newline to the file at ``path`` after ``delay`` seconds; return the line.

    Lets tests observe fire-and-forget jobs. One ``write`` on an ``O_APPEND``
    descriptor, so concurrent jobs never interleave within a line.
    """
    if delay:
        time.sleep(float(delay))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)
    return line
