"""Discovery by DNS (issue 23, item 3): a name's every address gets work, and its changes are followed.

A real resolver runs on loopback (``tests/dns_server.py``, dnspython, answering from a file the test
rewrites); the clients ask it through the ``resolver`` setting. The system's resolver is tested in a
client process with a private ``/etc/hosts`` (a mount namespace: root only, skipped elsewhere).
Workers listen on 127.0.0.2, .3, .4 (Linux routes all of 127/8 to lo) on one port, and say who they
are (``dns_tasks.py``): every claim is checked from the workers' side, by what they answered,
logged or counted.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import zqsync
from tests.helpers import slack, wait_for
from zqsync.client.rendezvous import rank
from zqsync.testing import run_in_fork

pytest.importorskip("dns.resolver", reason="dnspython (zqsync[dns]) is not installed")

APP = "tests.integration.dns_tasks:registry"
HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


class Zone:
    """The test nameserver's records: ``set()`` them, ``resolver`` is where it listens."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.set()
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).parent.parent / "dns_server.py"), str(path)],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.resolver = f"127.0.0.1:{int(self.proc.stdout.readline())}"

    def set(self, ttl: int = 30, **records: dict) -> None:
        """Replace every record, atomically: ``set(A={"name": [addresses]}, SRV={...})``."""
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"ttl": ttl, **records}))
        os.replace(temporary, self.path)

    def questions(self) -> list[str]:
        log = Path(f"{self.path}.log")
        return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def zone(tmp_path):
    zone = Zone(tmp_path / "zone.json")
    yield zone
    zone.proc.kill()
    zone.proc.wait()
    zone.proc.stdout.close()


@pytest.fixture
def workers(zq_worker, tmp_path):
    """``workers(n, port=0, hosts=HOSTS, journal=False)``: ``n`` workers on ``hosts[:n]``, all on one port
    (the first one's ephemeral port unless given), with a journal each if asked; returns ``(port, [worker])``."""

    def start(count: int, port: int = 0, hosts: tuple = HOSTS, journal: bool = False) -> tuple[int, list]:
        started = []
        for host in hosts[:count]:
            env = {"ZQSYNC_TEST_WORKER": host, "ZQSYNC_TEST_LOG": str(tmp_path / f"{host}.log")}
            state = ["--state-dir", str(tmp_path / f"{host}.state")] if journal else []
            worker = zq_worker(APP, bind=f"tcp://{host}:{port}", env=env, extra_args=state)
            port = port or int(worker.endpoint.rpartition(":")[2])
            started.append(worker)
        return port, started

    return start


def jobs_at(tmp_path: Path, host: str) -> list[str]:
    log = tmp_path / f"{host}.log"
    return log.read_text().splitlines() if log.exists() else []


def answered(client: zqsync.Client, calls: int) -> set[str]:
    """The workers that answered ``calls`` calls."""
    return {client.call("where") for _ in range(calls)}


def reaches(client: zqsync.Client, hosts) -> None:
    """Wait until calls have reached each of ``hosts`` and no other (connections complete one by one)."""
    seen: set[str] = set()

    def every_one() -> bool:
        seen.update(answered(client, 5))
        assert seen <= set(hosts), f"calls reached {seen - set(hosts)}"
        return seen == set(hosts)

    wait_for(every_one, what=f"calls to reach each of {hosts}")


def test_a_name_with_three_addresses_sends_calls_and_jobs_to_all_three(zone, workers, tmp_path):
    port, _ = workers(3)
    zone.set(A={"workers.test": list(HOSTS)})
    with zqsync.Client(f"tcp://workers.test:{port}", resolver=zone.resolver) as client:
        reaches(client, HOSTS)
        assert sorted(client.stats()["endpoints"]) == [f"tcp://{host}:{port}" for host in HOSTS]
        sent = 0

        def each_worker_ran_one() -> bool:  # a job at a time: ZeroMQ spreads over the connections it has
            nonlocal sent
            client.enqueue("note", f"job-{sent}")
            sent += 1
            return all(jobs_at(tmp_path, host) for host in HOSTS)

        wait_for(each_worker_ran_one, interval=0.005, what="a job at each of the 3 workers")
    wait_for(lambda: len(_ran(tmp_path)) == sent, what="every job to run")
    assert sorted(_ran(tmp_path)) == sorted(f"job-{n}" for n in range(sent))


CALLS_UNTIL_EACH_ANSWERED = """
import json, sys, time, zqsync
with zqsync.Client(sys.argv[1]) as client:
    for line in sys.stdin:  # the workers to reach, then seconds to try for
        want, seconds = json.loads(line)
        seen, started = set(), time.monotonic()
        while seen != set(want) and time.monotonic() - started < seconds:
            seen.add(client.call("where"))
        print(json.dumps([sorted(seen), time.monotonic() - started]), flush=True)
"""


class PrivateHosts:
    """A client process in a mount namespace of its own, whose ``/etc/hosts`` is ``path`` (the machine's
    file is untouched): the system's resolver (``getaddrinfo``) answers from it, with no ``resolver``."""

    def __init__(self, path: Path, endpoint: str, env: dict) -> None:
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            pytest.skip("needs root and unshare(1), for a private /etc/hosts in a mount namespace")
        self.path = path
        script = f"mount --bind {path} /etc/hosts && exec {sys.executable} -c '{CALLS_UNTIL_EACH_ANSWERED}' \"$0\""
        self.proc = subprocess.Popen(["unshare", "--mount", "sh", "-c", script, endpoint], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env})

    def list(self, name: str, hosts) -> None:
        """Make ``name`` stand for ``hosts`` (rewritten in place: the mount follows the file)."""
        self.path.write_text("127.0.0.1 localhost\n" + "".join(f"{host} {name}\n" for host in hosts))

    def reach(self, hosts, seconds: float) -> tuple[list, float]:
        """Have the client call until each of ``hosts`` answered or ``seconds`` passed: (who answered, seconds)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([list(hosts), seconds]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            stderr = self.proc.stderr.read() if self.proc.stderr else ""
            if "mount" in stderr and "zqsync" not in stderr:
                pytest.skip(f"no private mount namespace here: {stderr.strip()}")
            raise AssertionError(f"the client process ended: {stderr}")
        seen, elapsed = json.loads(line)
        return seen, elapsed

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def private_hosts(tmp_path):
    started = []

    def start(endpoint: str, **env: str) -> PrivateHosts:
        client = PrivateHosts(tmp_path / "hosts", endpoint, env)
        started.append(client)
        return client

    yield start
    for client in started:
        client.close()


def test_the_systems_resolver_gives_every_address_of_a_name(workers, private_hosts):
    port, _ = workers(3)
    client = private_hosts(f"tcp://workers.test:{port}")
    client.list("workers.test", HOSTS)
    assert client.reach(HOSTS, slack(10))[0] == sorted(HOSTS)


def test_the_systems_resolver_is_asked_again_and_an_added_address_gets_work(workers, private_hosts):
    port, _ = workers(3)
    interval = 1.0
    client = private_hosts(f"tcp://workers.test:{port}", ZQSYNC_RESOLVE_INTERVAL=str(interval))
    client.list("workers.test", HOSTS[:1])
    assert client.reach(HOSTS[:1], slack(10))[0] == sorted(HOSTS[:1])
    client.list("workers.test", HOSTS)
    seen, elapsed = client.reach(HOSTS, slack(2 * interval))
    assert seen == sorted(HOSTS), f"after {elapsed:.2f} s only {seen} answered"


def test_an_address_added_gets_work_within_two_resolve_intervals(zone, workers):
    port, _ = workers(3)
    zone.set(A={"workers.test": list(HOSTS[:2])})
    interval = 1.0
    with zqsync.Client(f"tcp://workers.test:{port}", resolver=zone.resolver, resolve_interval=interval) as client:
        reaches(client, HOSTS[:2])
        zone.set(A={"workers.test": list(HOSTS)})
        changed = time.monotonic()
        while client.call("where") != HOSTS[2]:
            assert time.monotonic() - changed < slack(2 * interval), "the added worker got no call in time"
        assert len(client.stats()["endpoints"]) == 3


def test_a_shorter_ttl_than_the_interval_is_honoured(zone, workers):
    port, _ = workers(2)
    zone.set(ttl=1, A={"workers.test": [HOSTS[0]]})
    with zqsync.Client(f"tcp://workers.test:{port}", resolver=zone.resolver, resolve_interval=600) as client:
        assert answered(client, 5) == {HOSTS[0]}
        zone.set(ttl=1, A={"workers.test": list(HOSTS[:2])})
        changed = time.monotonic()
        while client.call("where") != HOSTS[1]:
            assert time.monotonic() - changed < slack(2.0), "the 1 s TTL was not honoured"


def test_an_address_removed_is_drained_and_dropped_without_losing_a_job(zone, workers, tmp_path):
    port, started = workers(3)
    zone.set(A={"workers.test": list(HOSTS)})
    removed = started[2]
    with zqsync.Client(f"tcp://workers.test:{port}", resolver=zone.resolver, resolve_interval=0.5) as client:
        sent = [client.enqueue("note", f"before-{i}") for i in range(300)]
        reaches(client, HOSTS)
        zone.set(A={"workers.test": list(HOSTS[:2])})
        n = 0
        while len(client.stats()["endpoints"]) == 3:  # jobs go on while the client has not looked again
            sent.append(client.enqueue("note", f"during-{n}"))
            n += 1
            time.sleep(0.005)
        after = [client.enqueue("note", f"after-{i}") for i in range(300)]
        reaches(client, HOSTS[:2])
        # Dropped: the removed worker sees every connection of this client closed, while it still runs.
        wait_for(lambda: _closed_all(removed.stats()), what="the removed worker's connections to close")
    wait_for(lambda: len(_ran(tmp_path)) >= len(sent) + len(after), what="every accepted job to run")
    expected = [*(f"before-{i}" for i in range(300)), *(f"during-{i}" for i in range(n)),
                *(f"after-{i}" for i in range(300))]
    assert sorted(_ran(tmp_path)) == sorted(expected)
    assert not [key for key in jobs_at(tmp_path, HOSTS[2]) if key.startswith("after-")]


def _closed_all(stats: dict) -> bool:
    """Every job and call connection closed, but the one of the test's stats probe (``WorkerProcess.stats``)."""
    return (stats["disconnections_jobs"] == stats["connections_jobs"] > 0
            and stats["disconnections_rpc"] == stats["connections_rpc"] - 1 > 0)


def _ran(tmp_path: Path) -> list[str]:
    """The keys of every job the workers ran."""
    return [key for host in HOSTS for key in jobs_at(tmp_path, host)]


def test_an_added_address_takes_over_only_the_confirmed_job_ids_that_now_prefer_it(zone, workers, tmp_path):
    """Each worker journals the ids it accepted and drops a duplicate: sending the same ids again after a
    third address appears runs again exactly the ids whose preferred worker is now the new one."""
    port, _ = workers(3, journal=True)
    zone.set(A={"workers.test": list(HOSTS[:2])})
    ids = [f"id-{n}" for n in range(60)]
    with zqsync.Client(f"tcp://workers.test:{port}", resolver=zone.resolver, resolve_interval=0.2) as client:
        for job_id in ids:
            client.enqueue_with_options("note", args=(job_id,), confirm=True, job_id=job_id)
        zone.set(A={"workers.test": list(HOSTS)})
        wait_for(lambda: answered(client, 3) and len(client.stats()["endpoints"]) == 3, what="the third address")
        for job_id in ids:
            client.enqueue_with_options("note", args=(job_id,), confirm=True, job_id=job_id)
    rpc = {host: f"tcp://{host}:{port + 1}" for host in HOSTS}  # rendezvous ranks the rpc endpoints
    must_move = sorted(job_id for job_id in ids if rank(job_id, list(rpc.values()))[0] == rpc[HOSTS[2]])
    assert 5 < len(must_move) < 40  # about a third
    wait_for(lambda: sorted(jobs_at(tmp_path, HOSTS[2])) == must_move, what="the moved ids to run at the new worker")
    for host in HOSTS[:2]:  # the others ran each id they prefer among two, once
        assert sorted(jobs_at(tmp_path, host)) == sorted(i for i in ids if rank(i, [rpc[h] for h in HOSTS[:2]])[0] == rpc[host])


def test_srv_records_give_each_workers_host_and_port(zone, workers):
    first, _ = workers(1)
    second, _ = workers(1, hosts=HOSTS[1:])  # on a port of its own: only its SRV record tells it
    assert first != second
    zone.set(A={"one.test": [HOSTS[0]], "two.test": [HOSTS[1]]},
             SRV={"_zqsync._tcp.svc.test": [[0, 0, first, "one.test"], [0, 0, second, "two.test"]]})
    with zqsync.Client("srv://svc.test", resolver=zone.resolver) as client:
        reaches(client, HOSTS[:2])
        assert sorted(client.stats()["endpoints"]) == sorted([f"tcp://{HOSTS[0]}:{first}",
                                                              f"tcp://{HOSTS[1]}:{second}"])


def test_zqsync_stats_shows_the_endpoints_a_name_stands_for(zone, workers):
    port, _ = workers(3)
    zone.set(A={"front.test": [HOSTS[0]], "back.test": list(HOSTS[1:])})
    seen: set[str] = set()
    with zqsync.Client(f"tcp://{HOSTS[0]}:{port}") as front:
        wait_for(lambda: seen.update(front.call("forward", f"tcp://back.test:{port}", zone.resolver)
                                     for _ in range(5)) or seen == set(HOSTS[1:]), what="forwarded calls at both")
    done = subprocess.run([sys.executable, "-m", "zqsync", "stats", f"tcp://front.test:{port}"], capture_output=True,
                          text=True, timeout=slack(60), env={**os.environ, "ZQSYNC_RESOLVER": zone.resolver})
    assert done.returncode == 0, done.stderr
    assert f"tcp://front.test:{port} resolves to tcp://{HOSTS[0]}:{port}" in done.stdout
    (in_tasks,) = [line for line in done.stdout.splitlines() if "in tasks" in line]
    listed = in_tasks.split(" to ", 1)[1].split(": ", 1)[0]
    assert sorted(listed.split(", ")) == [f"tcp://{host}:{port}" for host in HOSTS[1:]], done.stdout


def test_a_name_unknown_at_first_use_raises_and_one_gone_later_keeps_its_last_addresses(zone, workers, caplog):
    port, _ = workers(1)
    with zqsync.Client(f"tcp://workers.test:{port}", resolver=zone.resolver, resolve_interval=0.1) as client:
        with pytest.raises(zqsync.PoolError, match=f"tcp://workers.test:{port}: no address"):
            client.call("where")
        zone.set(A={"workers.test": [HOSTS[0]]})
        assert client.call("where") == HOSTS[0]
        zone.set()  # NXDOMAIN from now on
        asked = len(zone.questions())
        while len(zone.questions()) == asked:  # until the client has looked again
            assert client.call("where") == HOSTS[0]
        assert client.call("where") == HOSTS[0]
        assert client.stats()["endpoints"] == [f"tcp://{HOSTS[0]}:{port}"]
    assert "keeping the previous addresses" in caplog.text


def test_a_forked_child_follows_the_name_on_its_own(zone, workers):
    port, _ = workers(2)
    zone.set(A={"workers.test": [HOSTS[0]]})
    with zqsync.Client(f"tcp://workers.test:{port}", resolver=zone.resolver, resolve_interval=0.2) as client:
        assert answered(client, 5) == {HOSTS[0]}
        zone.set(A={"workers.test": list(HOSTS[:2])})

        def in_child() -> list:
            reaches(client, HOSTS[:2])
            return client.stats()["endpoints"]

        endpoints = run_in_fork(in_child)
        assert sorted(endpoints) == [f"tcp://{host}:{port}" for host in HOSTS[:2]]
        reaches(client, HOSTS[:2])


def test_a_name_with_only_aaaa_records_is_reached_over_ipv6_and_a_dual_stack_one_over_ipv4(zone, zq_worker):
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    env = {"ZQSYNC_TEST_WORKER": "::1", "ZQSYNC_TEST_LOG": os.devnull}
    port = int(zq_worker(APP, bind="tcp://[::1]:0", env=env).endpoint.rpartition(":")[2])
    zone.set(AAAA={"v6.test": ["::1"], "both.test": ["::1"]}, A={"both.test": [HOSTS[0]]})
    with zqsync.Client(f"tcp://v6.test:{port}", resolver=zone.resolver) as client:
        assert client.call("where") == "::1"
        assert client.stats()["endpoints"] == [f"tcp://[::1]:{port}"]
    with zqsync.Client(f"tcp://both.test:{port}", resolver=zone.resolver) as client:
        with pytest.raises(zqsync.CallTimeout):  # its IPv4 address: nobody listens there
            client.call_with_options("where", timeout=0.3)
        assert client.stats()["endpoints"] == [f"tcp://{HOSTS[0]}:{port}"]


def test_literal_addresses_are_never_looked_up(zone, workers):
    port, _ = workers(1)
    with zqsync.Client(f"tcp://{HOSTS[0]}:{port}", resolver=zone.resolver, resolve_interval=0.1) as client:
        for _ in range(20):
            client.call("where")
            time.sleep(0.01)
        assert client.stats()["endpoints"] == [f"tcp://{HOSTS[0]}:{port}"]
    assert zone.questions() == []


def test_a_removed_address_loses_the_confirm_channel_too(zone, workers, tmp_path):
    """Confirms travel on a multiplexed channel outside the pool (``waits.py``); once a worker leaves the
    name, that channel is closed like the pooled sockets, so the removed worker sees every connection of this
    client closed (before the fix the channel kept its connection to the removed worker open)."""
    port, started = workers(3, journal=True)
    zone.set(A={"workers.test": list(HOSTS)})
    removed = started[2]
    with zqsync.Client(f"tcp://workers.test:{port}", resolver=zone.resolver, resolve_interval=0.3) as client:
        for n in range(30):
            client.enqueue_with_options("note", args=(f"confirm-{n}",), confirm=True)
        reaches(client, HOSTS)
        wait_for(lambda: removed.stats()["connections_rpc"] >= 2, what="the confirm channel to reach the worker")
        zone.set(A={"workers.test": list(HOSTS[:2])})
        def dropped() -> bool:  # a request looks again once resolve_interval has passed, and drains
            client.enqueue_with_options("note", args=("later",), confirm=True)
            return len(client.stats()["endpoints"]) == 2

        wait_for(dropped, what="the client to drop the removed address")
        wait_for(lambda: _rpc_closed(removed.stats()), what="the removed worker's rpc connections to close")


def _rpc_closed(stats: dict) -> bool:
    """Every rpc connection closed but the one of the test's stats probe."""
    return stats["disconnections_rpc"] == stats["connections_rpc"] - 1
