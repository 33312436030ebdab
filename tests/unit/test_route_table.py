"""Route precedence and route validation (no sockets are opened: a Client opens nothing until used)."""

import pytest

from zqsync import Client
from zqsync.client.routes import Routes
from zqsync.errors import ConfigurationError

A, B, C, D = (f"tcp://127.0.0.1:{port}" for port in (6000, 6010, 6020, 6030))


def test_exact_names_then_patterns_in_order_then_the_default():
    routes = Routes({"*": [D], "emails.*": [A], "emails.bulk.*": [B], "emails.send": C})
    assert routes.match("emails.send") == (C,)  # exact beats the patterns listed before it
    assert routes.match("emails.bulk.weekly") == (A,)  # patterns in order: emails.* is listed first
    assert routes.match("reports.daily") == (D,)  # "*" last, although listed first
    assert routes.match("Emails.send") == (D,)  # case-sensitive
    assert routes.endpoint_sets() == [(C,), (A,), (B,), (D,)]


def test_without_a_default_route_unmatched_names_use_the_client_s_endpoints():
    assert Routes({"emails.*": [A]}).match("resize") is None


@pytest.mark.parametrize("routes", [{"": [A]}, {"emails.*": []}, {"emails.*": [""]}, [("emails.*", A)], {3: [A]}])
def test_malformed_routes_are_refused(routes):
    with pytest.raises(ConfigurationError):
        Client(A, routes=routes)


def test_default_workers_come_from_endpoints_or_the_star_route_not_both():
    with pytest.raises(ConfigurationError, match="one of them"):
        Client(A, routes={"*": [B]})
    with pytest.raises(ConfigurationError, match="one of them"):
        Client(routes={"emails.*": [B]})
    with Client(routes={"*": [A, B], "emails.*": [C]}) as client:
        assert client.route("resize") is client and client.endpoints == (A, B)
        assert client.route("emails.send").endpoints == (C,)


def test_routes_to_one_endpoint_set_share_one_client():
    with Client(A, routes={"emails.*": [B], "sms.*": [B], "resize": [A]}) as client:
        assert client.route("emails.x") is client.route("sms.y") is not client
        assert client.route("resize") is client
