"""CURVE refusals are logged at WARNING (rate-limited), and the startup line says whether CURVE is on."""

from __future__ import annotations

import pytest

import zqsync
from tests.helpers import wait_for
from tests.integration.test_security import client_for, curve_args, keys  # noqa: F401  (fixture)

REFUSED = "WARNING zqsync.worker.auth: refused a CURVE client: public key"


@pytest.mark.parametrize("processes", [None, 2], ids=["single", "router"])
def test_refusals_are_warnings_at_most_one_per_interval(zq_worker, keys, processes):  # noqa: F811
    """One authenticator (a standalone worker's, or the router's): one line for three refusals. (Each direct
    child has its own, so each logs one.)"""
    worker = zq_worker(extra_args=curve_args(keys) + (["--processes", str(processes), "--router"] if processes else []))
    assert "CURVE on, 1 client keys" in worker.output()
    for _ in range(3):
        with client_for(worker, keys, "stranger", call_timeout=0.5) as stranger:
            with pytest.raises(zqsync.CallTimeout):
                stranger.call("add", 1, 2)
    wait_for(lambda: REFUSED in worker.output(), what="a refusal warning")
    lines = [line for line in worker.output().splitlines() if REFUSED in line]
    stranger_key = (keys / "others" / "stranger.key").read_text()
    assert len(lines) == 1, lines  # three refused handshakes, one line per 10 s
    assert lines[0].split("public key ")[1].split()[0] in stranger_key


def test_startup_line_says_curve_off(zq_worker):
    worker = zq_worker()
    assert "CURVE off" in worker.output()
