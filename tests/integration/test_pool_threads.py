"""S04: a client built in the main thread and used from other threads (docs/scenarios.md).

Plain run: ``threading.Thread`` is a native thread, which is its own owner
(rule 1), so it dials its own socket. Monkey-patched run: ``threading.Thread``
is a greenlet on the main hub and shares the hub's sockets, one at a time; a
native thread (gevent's threadpool) is a separate owner with its own socket.
Every claim is checked from the peer's side, by the identities it saw.
"""

from __future__ import annotations

import threading

import gevent
import pytest

import zqsync
from tests.conftest import MONKEY_PATCHED

pytestmark = pytest.mark.timeout(90)


def run_thread(target, *args) -> None:
    """Run ``target`` in a ``threading.Thread`` (as is: native plain, greenlet patched) and re-raise its error."""
    errors: list[BaseException] = []

    def body() -> None:
        try:
            target(*args)
        except BaseException as exc:  # re-raised in the test below
            errors.append(exc)

    thread = threading.Thread(target=body, name="scheduler")
    thread.start()
    thread.join(30.0)
    assert not thread.is_alive(), "the thread hung"
    if errors:
        raise errors[0]


def echo_many(client: zqsync.Client, tag: str, count: int, into: list) -> None:
    for n in range(count):
        value = f"{tag}-{n}"
        into.append((value, client.call("echo", value)))


def test_thread_using_a_main_thread_client_gets_its_own_socket_and_main_keeps_its_own(zq_peer):
    """S04 (sequential): calls from other threads all succeed; each native thread dials its own
    socket (never one another thread used) while a greenlet-thread shares its hub's; the main
    thread keeps reusing its socket."""
    peer = zq_peer()
    with zqsync.Client(peer.endpoint, call_timeout=20.0) as client:
        results: list = []
        echo_many(client, "main", 5, results)
        main_ids = peer.identities()
        assert len(main_ids) == 1

        seen = main_ids
        for run in range(8):  # one scheduler thread after another, e.g. a periodic job
            run_thread(echo_many, client, f"thread-{run}", 5, results)
            now = peer.identities()
            if MONKEY_PATCHED:  # greenlet-threads: same hub, same socket (rule 1)
                assert now == main_ids, f"run {run}: a greenlet-thread did not share its hub's socket"
            else:  # native threads: each an owner of its own, never handed another thread's socket
                assert seen < now and len(now - seen) == 1, (
                    f"run {run}: the thread did not dial exactly one socket of its own "
                    f"({len(now - seen)} new identities): it was handed an earlier thread's socket"
                )
            seen = now

        echo_many(client, "main-again", 5, results)
        assert peer.identities() == seen, "the main thread did not reuse its own socket"
        assert all(value == reply for value, reply in results)
        assert len(results) == 50


def test_native_threads_from_gevents_threadpool_get_their_own_socket(zq_peer):
    """S04 (gevent with threads): a native threadpool thread calling a client the main greenlet
    also uses completes without LoopExit or hang, and dials a socket of its own."""
    peer = zq_peer()
    hub = gevent.get_hub()
    with zqsync.Client(peer.endpoint, call_timeout=20.0) as client:
        results: list = []
        echo_many(client, "main", 3, results)
        main_ids = peer.identities()
        pool_thread = hub.threadpool.spawn(echo_many, client, "native", 5, results)
        echo_many(client, "main-meanwhile", 5, results)
        pool_thread.get(timeout=30.0)
        after = peer.identities()
        assert len(after) == 2 and main_ids < after, after
        echo_many(client, "main-after", 3, results)
        assert peer.identities() == after
        assert all(value == reply for value, reply in results) and len(results) == 16


def test_concurrent_threads_each_get_their_own_replies_on_their_own_sockets(zq_peer):
    """S04 (concurrent, scheduler threads beside the main thread): every reply reaches its own
    caller; plain, each native thread adds exactly one identity; patched, greenlet-threads share
    the hub's capped sockets."""
    peer = zq_peer()
    with zqsync.Client(peer.endpoint, call_timeout=20.0, lease_timeout=20.0) as client:
        results: dict[str, list] = {"main": []}
        echo_many(client, "main", 2, results["main"])
        before = peer.identities()
        threads = []
        errors: list[BaseException] = []
        for name in ("t1", "t2", "t3"):
            results[name] = []

            def body(name: str = name) -> None:
                try:
                    echo_many(client, name, 30, results[name])
                except BaseException as exc:  # re-raised below
                    errors.append(exc)

            threads.append(threading.Thread(target=body, name=name))
        for thread in threads:
            thread.start()
        echo_many(client, "main-concurrent", 30, results["main"])
        for thread in threads:
            thread.join(30.0)
            assert not thread.is_alive(), f"{thread.name} hung"
        assert not errors, errors
        for name, pairs in results.items():
            assert all(value == reply for value, reply in pairs), name
            assert len(pairs) == (32 if name == "main" else 30)
        after = peer.identities()
        if MONKEY_PATCHED:  # one hub: at most pool_size (4) sockets for all of them
            assert before <= after and len(after) <= 4
        else:  # three new owners, one socket each; main kept its own
            assert before < after and len(after - before) == 3
