"""Rendezvous hashing: one preferred endpoint per key, the same in any order, and failover past a bound."""

from __future__ import annotations

import threading
import time

from zqsync.client.health import Health
from zqsync.client.rendezvous import Route, rank

ENDPOINTS = [f"tcp://10.0.0.{n}:5556" for n in range(1, 5)]


def test_the_preferred_endpoint_does_not_depend_on_the_order_of_endpoints():
    for key in (f"job-{n}" for n in range(50)):
        assert rank(key, ENDPOINTS) == rank(key, ENDPOINTS[::-1])


def test_keys_spread_over_the_endpoints_and_removing_one_moves_only_its_keys():
    keys = [f"job-{n}" for n in range(2000)]
    preferred = {key: rank(key, ENDPOINTS)[0] for key in keys}
    assert all(300 < list(preferred.values()).count(endpoint) < 700 for endpoint in ENDPOINTS)
    after = {key: rank(key, ENDPOINTS[1:])[0] for key in keys}
    assert {key for key in keys if after[key] != preferred[key]} == {
        key for key in keys if preferred[key] == ENDPOINTS[0]}


def health(probe=lambda endpoint: None, backoff=10.0):
    return Health(probe, backoff=backoff, backoff_max=10.0, probe_timeout=0.1)


def test_a_route_fails_over_only_past_the_bound_while_the_endpoint_is_connected():
    """A probe that finds the endpoint connected but silent (``None``: a busy worker) keeps the job there."""
    probes = []
    view = health(lambda endpoint: probes.append(endpoint))
    route = Route("job-1", ENDPOINTS, failover_after=0.2, health=view)
    first = route.endpoint
    route.unanswered()
    route.unanswered()
    assert route.endpoint == first and probes == [first], "within the bound: retry there, probed once"
    time.sleep(0.25)
    route.unanswered()
    assert route.endpoint == rank("job-1", ENDPOINTS)[1] and view.endpoints_down() == [first]
    assert Route("job-1", ENDPOINTS, 0.2, view).endpoint == rank("job-1", ENDPOINTS)[1]


def test_a_route_moves_on_at_once_when_nothing_was_sent_or_the_probe_finds_no_connection():
    route = Route("job-1", ENDPOINTS, failover_after=60.0, health=health())
    route.unanswered(sent=False)
    assert route.endpoint == rank("job-1", ENDPOINTS)[1]
    route = Route("job-2", ENDPOINTS, failover_after=60.0, health=health(lambda endpoint: False))
    route.unanswered()
    assert route.endpoint == rank("job-2", ENDPOINTS)[1]


def test_a_down_endpoint_is_skipped_until_a_probe_answers_and_probes_back_off():
    """Run in a thread of its own: a gevent hub another test left in this one would never run the
    background probe's greenlet while this test sleeps (a real caller yields to it on its sockets)."""
    failures = []

    def run():
        try:
            skipped_until_answered()
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and not failures, failures


def skipped_until_answered():
    answers = {"value": False}
    probes = []

    def probe(endpoint):
        probes.append(time.monotonic())
        return answers["value"]

    view = health(probe, backoff=0.05)
    first = rank("job-1", ENDPOINTS)[0]
    view.mark_down(first)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert Route("job-1", ENDPOINTS, 60.0, view).endpoint != first
        time.sleep(0.005)
    gaps = [later - earlier for earlier, later in zip(probes, probes[1:])]
    assert 2 <= len(probes) <= 6 and all(b > a for a, b in zip(gaps, gaps[1:])), gaps
    answers["value"] = True
    while view.down(first):
        time.sleep(0.005)
    assert Route("job-1", ENDPOINTS, 60.0, view).endpoint == first
