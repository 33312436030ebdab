"""Chains, groups and chords on confirmed jobs (docs/guides/canvas.md).

    zqsync worker examples.canvas:registry --state-dir /tmp/zq-canvas --bind tcp://127.0.0.1:5555 &
    python examples/canvas.py tcp://127.0.0.1:5555
"""

from __future__ import annotations

import sys

import zqsync
from zqsync.worker import Registry

registry = Registry()


@registry.task
def fetch(page: int) -> str:
    return f"page {page} " + "word " * page


@registry.task
def count_words(text: str) -> int:
    return len(text.split())


@registry.task
def total(counts: list, label: str = "words") -> str:
    return f"{sum(counts)} {label}"


@registry.task
def fail(text: str) -> None:
    raise ValueError(f"cannot parse {text!r}")


def main(endpoint: str) -> int:
    with zqsync.Client(endpoint) as client:
        # fetch(3), then count_words(<its text>): each step a confirmed job, each result the next one's first argument
        words = zqsync.chain(fetch.s(3), count_words.s()).enqueue(client)
        print("chain:", words.result(timeout=30.0))

        pages = zqsync.group(*(fetch.s(page) for page in range(1, 4))).enqueue(client)
        print("group:", [text.split()[:2] for text in pages.result(timeout=30.0)])

        # count_words on three pages side by side, then total() once with the list of counts
        counted = zqsync.chord(zqsync.group(*(count_words.s(f"page {n} " + "x " * n) for n in range(1, 4))),
                               total.s(label="words in all")).enqueue(client)
        print("chord:", counted.result(timeout=30.0))

        # a failed step stops the chain: count_words never runs, and result() raises fail's error
        broken = zqsync.chain(fetch.s(1), fail.s(), count_words.s()).enqueue(client)
        try:
            broken.result(timeout=30.0)
        except zqsync.RemoteError as exc:
            print("stopped:", broken.status().state, exc.remote_type, exc.remote_message)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"))
