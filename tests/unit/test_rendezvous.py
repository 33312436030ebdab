"""Rendezvous hashing: one preferred endpoint per key, the same in any order, and failover past a bound."""

from __future__ import annotations

import time

from zqsync.client.rendezvous import Down, Route, rank

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


def test_a_route_fails_over_only_past_the_bound_and_later_routes_skip_the_down_endpoint():
    down = Down()
    route = Route("job-1", ENDPOINTS, failover_after=0.2, down=down)
    first = route.endpoint
    route.unanswered()
    assert route.endpoint == first, "within the bound: retry the preferred endpoint"
    time.sleep(0.25)
    route.unanswered()
    assert route.endpoint == rank("job-1", ENDPOINTS)[1] and first in down
    assert Route("job-1", ENDPOINTS, 0.2, down).endpoint == rank("job-1", ENDPOINTS)[1]
    time.sleep(0.25)
    assert Route("job-1", ENDPOINTS, 0.2, down).endpoint == first, "down only for the bound"
