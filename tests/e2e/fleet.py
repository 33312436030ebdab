"""A fleet in network namespaces: worker hosts found by DNS, client hosts under load, faults, counts.

Shared by ``tests/e2e/test_fleet.py`` and ``benchmarks/bench_fleet.py``. Built on a
:class:`~tests.e2e.netns.Lab` (root only):

* **worker hosts** ``w1``.. at ``SUBNET.11``..: a real ``zqsync worker`` each, with a journal
  (``--state-dir``), running ``tests/integration/dns_tasks.py``: its ``note`` task appends the
  job's key to that worker's own record file, so every job is counted where it ran;
* **client hosts** ``c1``.. at ``SUBNET.1``..: each runs ``tests/dns_server.py`` on its own
  loopback (the name ``workers.test``, answered from one zone file the fleet rewrites) and one
  client process (``tests/e2e/fleet_client.py``) asking it (``ZQSYNC_RESOLVER``), re-resolving
  every :data:`RESOLVE_INTERVAL` seconds.

Faults are methods: :meth:`Fleet.cut` / :meth:`Fleet.heal` a worker's cable, :meth:`Fleet.delete`
a worker host for good (cable cut, process SIGKILLed, address out of DNS), :meth:`Fleet.add` a
worker (optionally on a deleted host's journal directory, the disk moved to a replacement host)
and :meth:`Fleet.publish` the name's addresses. :meth:`Fleet.mark` timestamps phases on the
monotonic clock the clients use too. :func:`tally` counts, at the workers, what the clients were
given ids for.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from tests.e2e.netns import Host, Lab
from tests.helpers import wait_for

ROOT = str(Path(__file__).resolve().parents[2])
PORT = 5555
NAME = "workers.test"
#: Seconds between two look-ups of the name by a client (``ZQSYNC_RESOLVE_INTERVAL``).
RESOLVE_INTERVAL = 1.0
APP = "tests.integration.dns_tasks:registry"


@dataclass
class Worker:
    label: str
    host: Host
    state: Path
    record: Path
    proc: Any = None

    @property
    def endpoint(self) -> str:
        return f"tcp://{self.host.address}:{PORT}"


@dataclass
class Fleet:
    """The hosts, processes and files of one fleet run in ``lab``, under ``tmp``.

    :param loopers: per client process, how many loopers of each kind (``p`` plain, ``c`` confirmed, ``k`` calls).
    :param rates: operations per second each looper of a kind offers.
    """

    lab: Lab
    tmp: Path
    gevent: bool = False
    loopers: dict = field(default_factory=lambda: {"p": 1, "c": 2, "k": 2})
    rates: dict = field(default_factory=lambda: {"p": 100.0, "c": 25.0, "k": 25.0})
    call_timeout: float = 2.0
    confirm_retry: float = 0.5
    workers: dict = field(default_factory=dict)
    clients: dict = field(default_factory=dict)
    marks: list = field(default_factory=list)
    deleted: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.zone = self.tmp / "zone.json"
        self.stop_path = self.tmp / "stop"
        self._numbers = iter(range(11, 60))

    # -- workers ---------------------------------------------------------------------------

    def add(self, label: str, *, state_of: Optional[str] = None) -> Worker:
        """Start worker host ``label`` (on ``state_of``'s journal directory if given) and wait until it listens.

        Not published in DNS: :meth:`publish` does that.
        """
        host = self.lab.add_host(label, next(self._numbers))
        state = self.tmp / f"state-{state_of or label}"
        worker = self.workers[label] = Worker(label, host, state, self.tmp / f"record-{label}.txt")
        ready = self.tmp / f"ready-{label}"
        argv = [sys.executable, "-m", "zqsync", "worker", APP, "--bind", worker.endpoint, "--state-dir", str(state),
                "--ready-file", str(ready), "--parent-pid", str(os.getpid()), "--graceful-timeout", "2",
                "--keepalive-idle", "5", "--keepalive-interval", "1"]
        env = {**os.environ, "ZQSYNC_TEST_WORKER": label, "ZQSYNC_TEST_LOG": str(worker.record)}
        worker.proc = self.lab.popen(host, argv, log_path=str(self.tmp / f"{label}.log"), cwd=ROOT, env=env)
        return worker

    def wait_listening(self, *labels: str) -> None:
        for label in labels:
            worker, ready = self.workers[label], self.tmp / f"ready-{label}"
            wait_for(lambda w=worker, r=ready: r.exists() or w.proc.poll() is not None, timeout=60,
                     what=f"worker {label}")
            assert worker.proc.poll() is None, self.tails()

    def publish(self, *labels: str) -> None:
        """Make ``workers.test`` resolve to these workers' addresses (the zone file, replaced atomically)."""
        records = {"ttl": 30, "A": {NAME: [self.workers[label].host.address for label in labels]}}
        temporary = self.zone.with_suffix(".tmp")
        temporary.write_text(json.dumps(records))
        os.replace(temporary, self.zone)
        self.mark(f"dns {' '.join(labels)}")

    def cut(self, label: str) -> None:
        self.workers[label].host.cut()
        self.mark(f"cut {label}")

    def heal(self, label: str) -> None:
        self.workers[label].host.restore()
        self.mark(f"heal {label}")

    def delete(self, label: str, *, keep: tuple = ()) -> None:
        """Host ``label`` gone for good: cable cut, worker SIGKILLed, the name publishing only ``keep``."""
        worker = self.workers.pop(label)
        worker.host.cut()
        os.kill(worker.proc.pid, signal.SIGKILL)  # `ip netns exec` execs: the Popen pid is the worker's
        worker.proc.wait(10)
        self.deleted[label] = worker
        self.mark(f"delete {label}")
        self.publish(*keep)

    # -- clients ---------------------------------------------------------------------------

    def start_clients(self, count: int) -> None:
        for number in range(1, count + 1):
            label = f"c{number}"
            host = self.lab.add_host(label, number)
            dns_log = self.tmp / f"dns-{label}.log"
            dns = self.lab.popen(host, [sys.executable, "-u", f"{ROOT}/tests/dns_server.py", str(self.zone)],
                                 log_path=str(dns_log), cwd=ROOT)
            port = wait_for(lambda p=dns, f=dns_log: p.poll() is None and f.exists() and f.read_text().split("\n")[0],
                            timeout=30, what=f"the nameserver on {label}")
            config = {"gevent": self.gevent, "name": label, "endpoint": f"tcp://{NAME}:{PORT}",
                      "loopers": self.loopers, "rates": self.rates, "call_timeout": self.call_timeout,
                      "confirm_retry": self.confirm_retry, "confirm_timeout": 30.0,
                      "events": str(self.tmp / f"events-{label}.jsonl"), "stop": str(self.stop_path)}
            (self.tmp / f"{label}.json").write_text(json.dumps(config))
            env = {**os.environ, "ZQSYNC_RESOLVER": f"127.0.0.1:{int(port)}",
                   "ZQSYNC_RESOLVE_INTERVAL": str(RESOLVE_INTERVAL), "ZQSYNC_HEARTBEAT": "1"}
            self.clients[label] = self.lab.popen(
                host, [sys.executable, f"{ROOT}/tests/e2e/fleet_client.py", str(self.tmp / f"{label}.json")],
                log_path=str(self.tmp / f"{label}.log"), cwd=ROOT, env=env)

    def stop_clients(self) -> dict:
        """Touch the stop file, wait for every client to close and exit 0; their final stats by label."""
        self.mark("stop")
        self.stop_path.touch()
        for label, proc in self.clients.items():
            assert proc.wait(60) == 0, f"client {label} failed:\n{self.tails()}"
        return {label: self.events(label)[-1]["stats"] for label in self.clients}

    # -- what happened -----------------------------------------------------------------------

    def mark(self, what: str) -> float:
        now = time.monotonic()
        self.marks.append((what, now))
        return now

    def events(self, label: str) -> list[dict]:
        path = self.tmp / f"events-{label}.jsonl"
        lines = path.read_text().split("\n")[:-1] if path.exists() else []  # the last piece is partial or empty
        return [json.loads(line) for line in lines]

    def ran(self) -> dict[str, Counter]:
        """Per worker (the deleted ones too): how many times each key (``p ID``, ``c ID``, ``k ID``) ran there."""
        result = {}
        for label, worker in {**self.workers, **self.deleted}.items():
            text = worker.record.read_text() if worker.record.exists() else ""
            result[label] = Counter(text.splitlines())
        return result

    def senders(self, label: str) -> set[tuple[str, str]]:
        """``(client, kind)`` of every job or call that ran on worker ``label`` (an id names both: ``c1-p0-17``)."""
        return {(key.split(" ")[1].split("-")[0], key[0]) for key in self.ran()[label]}

    def tails(self) -> str:
        logs = sorted(self.tmp.glob("*.log"))
        return "\n".join(f"--- {path.name} ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-20:])
                         for path in logs)


def left_the_name(events: list[dict], endpoint: str) -> float:
    """When a client first listed its endpoints without ``endpoint`` after listing it (its ``ep`` lines), or 0."""
    listed = False
    for event in events:
        if event["k"] == "ep":
            if endpoint in event["eps"]:
                listed = True
            elif listed:
                return event["t"]
    return 0.0


def tally(fleet: Fleet, deleted: str = "", in_flight: float = 1.0) -> dict[str, Any]:
    """Every id the clients were given, against what ran at the workers (kind by kind).

    :param deleted: the label of a worker :meth:`Fleet.delete` removed: plain jobs it may have lost are
        counted apart (``lost``).
    :param in_flight: seconds before the deletion in which a plain job may still have been in the
        deleted worker's receive queue or on the wire to it.
    :returns: per kind ``p``/``c``/``k``: ``accepted`` (ids), ``failed`` (operations that raised),
        ``ran`` (ids run at least once), ``missing`` (accepted, never ran), ``twice`` (ran more than
        once: id to the workers it ran on, one entry per run); ``lost``: the missing plain jobs each
        accepted by its client between ``in_flight`` seconds before the deletion and the moment that
        client stopped listing the deleted worker; and ``events`` per client.
    """
    events = {label: fleet.events(label) for label in fleet.clients}
    where: dict[str, list[str]] = {}
    for label, counts in fleet.ran().items():
        for key, times in counts.items():
            where.setdefault(key, []).extend([label] * times)
    result: dict[str, Any] = {"events": events}
    for kind in ("p", "c", "k"):
        done = [event for found in events.values() for event in found if event["k"] == kind]
        accepted = {event["id"] for event in done if event["ok"]}
        runs = {key.split(" ", 1)[1]: places for key, places in where.items() if key.startswith(f"{kind} ")}
        result[kind] = {"accepted": accepted, "failed": [event for event in done if not event["ok"]],
                        "ran": set(runs), "missing": accepted - set(runs),
                        "twice": {key: places for key, places in runs.items() if len(places) > 1}}
    result["lost"] = set()
    if deleted:
        start = dict(fleet.marks)[f"delete {deleted}"] - in_flight
        for found in events.values():
            end = left_the_name(found, fleet.deleted[deleted].endpoint)
            result["lost"] |= {event["id"] for event in found if event["k"] == "p" and event["ok"]
                               and event["id"] in result["p"]["missing"] and start <= event["s"] and event["e"] <= end}
    return result


def arithmetic(count: dict[str, Any]) -> str:
    """One line: accepted = ran + lost for plain jobs, what confirmed jobs and calls did, failures by kind."""
    plain, confirmed, calls = count["p"], count["c"], count["k"]
    failed = Counter(event["err"].split(":")[0] for kind in "pck" for event in count[kind]["failed"])
    return (f"plain accepted {len(plain['accepted'])} = ran {len(plain['accepted'] & plain['ran'])} "
            f"+ lost with the deleted host {len(count['lost'])} (other missing {len(plain['missing'] - count['lost'])}),"
            f" ran twice {len(plain['twice'])}; confirmed accepted {len(confirmed['accepted'])}, never ran "
            f"{len(confirmed['missing'])}, ran twice {len(confirmed['twice'])} (on {sorted(confirmed['twice'].values())});"
            f" calls answered {len(calls['accepted'])}, not run {len(calls['missing'])}, run twice "
            f"{len(calls['twice'])}; failed operations {dict(failed)}")
