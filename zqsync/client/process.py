"""This process's pid and fresh random ids, per call, without a system call each, and right after any fork.

Every lease and every enqueue checks the pid (docs/design.md, pool rule 9), and
every job and request gets a random id. ``os.getpid()`` and ``os.urandom()``
are one system call each, which on a virtual machine with the usual
mitigations costs more than the rest of the check: in a gunicorn worker under
load, ``getpid`` alone was 13% of an enqueue's samples (py-spy).

On Linux (4.14 and later) both come from a page mapped with
``MADV_WIPEONFORK``: the kernel hands every forked child a zeroed copy of it,
whatever forked (``os.fork``, ``multiprocessing``, a C extension calling
``fork(2)``, with or without the at-fork hooks). A non-zero first byte
therefore proves that this process wrote it, after it last forked, so the pid
cached when it was written is still the pid; a zero byte sends the caller to
``os.getpid()``, which refreshes the cache, drops the ids buffered before the
fork (the parent hands out the same ones) and writes the byte again, in that
order. Ids are drawn `IDS_PER_DRAW` at a time from ``os.urandom``: the same
randomness as before, one system call per 64 ids.

Elsewhere (another system, an older kernel, an architecture whose advice
number differs), `getpid` is ``os.getpid`` and `new_id` draws from
``os.urandom`` each time, as before.
"""

from __future__ import annotations

import mmap
import os
import platform
import sys
from typing import Callable, Iterator, Optional

#: Random bytes per id (rendered as twice as many hex characters).
ID_BYTES = 16
#: Ids drawn per ``os.urandom`` call.
IDS_PER_DRAW = 64
#: ``MADV_WIPEONFORK`` on the architectures that use Linux's generic advice numbers (``mman-common.h``).
_WIPEONFORK = 18
_GENERIC_ADVICE = frozenset({"x86_64", "aarch64", "arm64", "armv7l", "armv6l", "i386", "i686", "riscv64",
                             "ppc64le", "ppc64", "s390x", "loongarch64"})


def wiped_on_fork() -> Optional[mmap.mmap]:
    """A private anonymous page the kernel zeroes in every forked child, or ``None`` where that is not
    available. Never raises."""
    advice = getattr(mmap, "MADV_WIPEONFORK", None)
    if advice is None and platform.machine() in _GENERIC_ADVICE:
        advice = _WIPEONFORK
    if not sys.platform.startswith("linux") or advice is None:
        return None
    try:
        page = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE)  # -1: anonymous
        page.madvise(advice)  # EINVAL on a kernel that does not know it
    except (OSError, ValueError, AttributeError):
        return None
    return page


_page = wiped_on_fork()
_pid = 0
_ids: Iterator[str] = iter(())


def _forked() -> int:
    """First use in this process (the page reads 0): cache the pid, drop ids drawn before a fork, arm the page."""
    global _pid, _ids
    _pid = os.getpid()
    _ids = iter(())
    assert _page is not None
    _page[0] = 1  # last: another thread sees the byte only once the pid and the ids are this process's
    return _pid


def _draw() -> str:
    """Draw `IDS_PER_DRAW` ids; return the first and keep the rest for `new_id`."""
    global _ids
    text = os.urandom(ID_BYTES * IDS_PER_DRAW).hex()
    width = 2 * ID_BYTES
    ids = iter([text[start:start + width] for start in range(0, len(text), width)])
    first = next(ids)
    _ids = ids  # a racing thread's draw replaces it: each id is still handed out once
    return first


def _cached_pid() -> int:
    return _pid if _page[0] else _forked()  # type: ignore[index]


def _buffered_id() -> str:
    if not _page[0]:  # type: ignore[index]
        _forked()
    return next(_ids, None) or _draw()


def _fresh_id() -> str:
    return os.urandom(ID_BYTES).hex()


#: This process's pid, right after any fork: ``os.getpid()``'s value, mostly without its system call.
getpid: Callable[[], int] = os.getpid if _page is None else _cached_pid
#: A new random id: `ID_BYTES` bytes from ``os.urandom`` as lowercase hex, never one a parent or child handed out.
new_id: Callable[[], str] = _fresh_id if _page is None else _buffered_id
