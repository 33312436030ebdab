"""Discovery's settings and endpoint forms are checked when a client is built, naming what is wrong."""

from __future__ import annotations

import pytest

import zqsync
from zqsync.settings import ClientSettings


@pytest.mark.parametrize(("endpoint", "says"), [
    ("srv://workers.test:5555", "srv://NAME (no port)"),
    ("srv://10.0.0.1", "names an address"),
    ("srv://", "srv://NAME"),
])
def test_a_malformed_srv_endpoint_is_refused(endpoint, says):
    with pytest.raises(zqsync.ConfigurationError, match=says.replace("(", r"\(").replace(")", r"\)")):
        zqsync.Client(endpoint)


@pytest.mark.parametrize("resolver", ["dns.example", "10.0.0.1:0", "10.0.0.1:99999", "[::1]x"])
def test_a_resolver_that_is_not_an_address_and_port_is_refused_naming_the_variable(resolver):
    with pytest.raises(zqsync.ConfigurationError, match="ZQSYNC_RESOLVER") as caught:
        ClientSettings.from_env({"ZQSYNC_RESOLVER": resolver})
    assert "nameserver's IP address" in str(caught.value)


def test_resolver_and_interval_come_from_the_environment_with_documented_defaults():
    assert (ClientSettings().resolver, ClientSettings().resolve_interval) == ("", 10.0)
    settings = ClientSettings.from_env({"ZQSYNC_RESOLVER": "[::1]:8600", "ZQSYNC_RESOLVE_INTERVAL": "2.5"})
    assert (settings.resolver, settings.resolve_interval) == ("[::1]:8600", 2.5)
    with pytest.raises(zqsync.ConfigurationError, match="ZQSYNC_RESOLVE_INTERVAL"):
        ClientSettings.from_env({"ZQSYNC_RESOLVE_INTERVAL": "0"})


def test_a_name_listed_twice_is_refused_as_before():
    with pytest.raises(zqsync.ConfigurationError, match="listed twice"):
        zqsync.Client(["tcp://workers.test:5555", "tcp://WORKERS.test:5555"])
