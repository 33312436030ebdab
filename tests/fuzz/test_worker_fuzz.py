"""Fuzzing a live worker: 22,000 random and mutated messages on its jobs and rpc sockets.

The inputs come from ``tests/fuzz/fuzzframes.py`` (shared with the long run,
``tests/fuzz/fuzz_worker.py``), drawn from a seeded ``random.Random``:
valid requests, mutations of valid requests (bit flips, truncation,
splicing, field swaps, wrong types, extra and missing fields, huge declared
lengths, deep nesting, non-str keys), raw garbage, multipart messages with
extra and empty frames, sent to the jobs ROUTER (over DEALER) and the rpc
ROUTER (over DEALERs with odd identities, and over a ROUTER). Then raw TCP
garbage below ZeroMQ, and frames at and just over ZMQ_MAXMSGSIZE.

Replies are drained without waiting for each one. Every part is also
decoded here with the same ``zqsync.wire.envelope``, which predicts what the
worker must count; the exact ``malformed`` and ``jobs_received`` counts and
the reply count prove that the worker processed everything.
"""

from __future__ import annotations

import random
import time

import zqsync
from tests.fuzz.fuzzframes import FuzzDriver, Stalled, frame_of_size, raw_tcp_garbage, rss_bytes, send_oversized
from tests.helpers import wait_for
from zqsync.wire import envelope

SEED = 62  # the seed of the long run in docs/scenarios.md
WARMUP = 2_000
MESSAGES = 20_000
RAW_TCP_CONNECTIONS = 40
MB = 1024 * 1024


def big_frames(endpoint: str) -> dict[str, str]:
    """Frames of exactly the limit (accepted) and one byte over it (the worker drops the connection)."""
    limit = envelope.MAX_MESSAGE_SIZE
    return {
        "jobs, at the limit": send_oversized(endpoint, "jobs", frame_of_size(limit)),
        "rpc, at the limit": send_oversized(endpoint, "rpc", frame_of_size(limit, "call", "no_such_task")),
        "jobs, limit + 1": send_oversized(endpoint, "jobs", frame_of_size(limit + 1)),
        "rpc, limit + 1": send_oversized(endpoint, "rpc", frame_of_size(limit + 1, "call", "no_such_task")),
    }


EXPECTED_BIG = {"jobs, at the limit": "sent", "rpc, at the limit": "replied",
                "jobs, limit + 1": "disconnected", "rpc, limit + 1": "disconnected"}


class Broken(AssertionError):
    """A phase found the worker broken; the rest is skipped."""


def fuzz(worker, driver: FuzzDriver, base: dict) -> tuple[int, int]:
    """Warm up, fuzz, check every count, then raw TCP garbage; returns the worker's RSS after warm-up and at the end.

    :raises Broken: the worker stopped answering, miscounted, or answered wrongly.
    """
    jobs_at_limit = 0

    def phase(messages: int) -> None:
        nonlocal jobs_at_limit
        try:
            driver.run(messages)
        except Stalled as exc:
            raise Broken(f"the worker stopped taking messages after {driver.counts['messages']}: {exc}") from None
        big = big_frames(worker.endpoint)
        wrong = [f"{where}: {outcome}, expected {EXPECTED_BIG[where]}" for where, outcome in big.items()
                 if outcome != EXPECTED_BIG[where]]
        jobs_at_limit += big["jobs, at the limit"] == "sent"
        wrong += [f"a reply that does not decode ({error}): {frames!r:.200}" for error, frames in driver.bad_replies[:3]]
        if not driver.settle(timeout=10.0):
            wrong.append(f"{driver.counts['replies']} replies of {driver.counts['expected_replies']} expected "
                         f"(the worker logged {worker.output().count('dropped a reply')} dropped replies)")
            raise Broken("\n".join(wrong))  # rpc is not answering: no stats either
        expected = {"malformed": driver.counts["expected_malformed"],
                    "jobs_received": driver.counts["expected_jobs"] + jobs_at_limit}
        try:
            wait_for(lambda: all(worker.stats(timeout=5.0)[k] - base[k] >= v for k, v in expected.items()),
                     timeout=20.0, what="the worker to count every frame")
            stats = worker.stats(timeout=5.0)
        except Exception as exc:
            raise Broken("\n".join([*wrong, f"the worker did not count every frame: {exc}"])) from None
        counted = {k: stats[k] - base[k] for k in expected}
        if counted != expected:
            wrong.append(f"counted {counted}, expected {expected}")
        if wrong:
            raise Broken("\n".join(wrong))

    phase(WARMUP)
    rss_before = rss_bytes(worker.pid)
    phase(MESSAGES)
    # Last, as it cannot be predicted: libzmq reads bytes without a 0xFF greeting as ZMTP 1.0 frames.
    raw_tcp_garbage(driver.rng, worker.endpoint, RAW_TCP_CONNECTIONS)
    return rss_before, rss_bytes(worker.pid)


def greenlet_death(output: str) -> str:
    """The traceback of the first worker greenlet killed by an exception (gevent's "failed with" line), or ""."""
    end = output.find("failed with")
    if end < 0:
        return ""
    start = output.rfind("Traceback (most recent call last)", 0, end)
    return output[start: output.find("\n", end)]


def test_worker_survives_fuzzing_and_counts_every_malformed_frame(zq_worker):
    worker = zq_worker()
    started = time.monotonic()
    base = worker.stats()
    driver = FuzzDriver(worker.endpoint, random.Random(SEED))
    problems = []
    try:
        rss_before, rss_after = fuzz(worker, driver, base)
        print(f"worker RSS after warm-up {rss_before / MB:.1f} MiB, after fuzzing {rss_after / MB:.1f} MiB")
        if rss_after > 2 * rss_before + 50 * MB:
            problems.append(f"RSS grew from {rss_before / MB:.1f} MiB to {rss_after / MB:.1f} MiB")
    except Broken as exc:
        problems.append(str(exc))
    finally:
        driver.close()
    print(f"sent {driver.counts['messages']} messages ({driver.counts['frames']} frames) with seed {SEED} "
          f"in {time.monotonic() - started:.1f} s: expected malformed {driver.counts['expected_malformed']}, "
          f"replies {driver.counts['replies']}/{driver.counts['expected_replies']}; inputs {dict(driver.labels)}")
    if worker.proc.poll() is not None:
        problems.append(f"the worker died with status {worker.proc.returncode}")
    else:
        try:
            with zqsync.Client(worker.endpoint) as client:
                assert client.call_with_options("add", args=(2, 3), timeout=5.0) == 5
        except Exception as exc:
            problems.append(f"the worker no longer answers a valid call: {exc!r}")
    if driver.decoder_bugs:
        error, frame = driver.decoder_bugs[0]
        problems.append(f"{len(driver.decoder_bugs)} frames make decode_request raise something other than "
                        f"ProtocolError, first {error}; frame {frame[:100].hex()}... ({len(frame)} bytes)")
    death = greenlet_death(worker.output())
    if death:
        problems.append(f"a worker greenlet died:\n{death}")
    assert not problems, "\n".join(problems)
