"""Hosts as Linux network namespaces, for multi-host tests (needs root and iproute2's ``ip``).

A :class:`Lab` builds a small private network that exists only inside the
namespaces it creates: a "switch" namespace holding a bridge, and one
namespace per host, each plugged into the bridge by a veth pair (``eth0`` on
the host side). Nothing is configured in the namespace the tests run in, so
no test traffic can reach a real network. Every ``ip`` command names its
namespace explicitly (``ip -n NS ...``).

Namespace names carry the test process's pid and a random token, so runs in
parallel never collide, and a namespace left behind by a run that was
SIGKILLed can be recognised (its pid is gone) and removed by the next run.

Processes started through :meth:`Lab.popen` are stopped by pid (TERM, then
KILL) before the namespaces are deleted; any process still found inside a lab
namespace (``ip netns pids``) is KILLed by pid as a fallback.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from typing import Any, Optional, Sequence

from zqsync._common import pid_alive

#: Names of namespaces made by this module: zq-<pid>-<token>-<label>.
_NAME = re.compile(r"^zq-(?P<pid>\d+)-[0-9a-f]{6}-[a-z0-9]+$")


class NetnsError(RuntimeError):
    """An ``ip`` command failed."""


def ip(*args: str, check: bool = True, timeout: float = 20.0) -> subprocess.CompletedProcess:
    """Run ``ip ARGS`` and return the completed process.

    :raises NetnsError: the command failed and ``check`` is true (the message has its stderr).
    """
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def unavailable_reason() -> Optional[str]:
    """Why namespace tests cannot run here, or ``None`` if they can.

    Probes for real: creates a uniquely named namespace, a veth pair and a
    bridge inside it, and deletes it again.
    """
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (run the suite as root to include the multi-host test)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` command is not installed"
    probe = f"zq-{os.getpid()}-{secrets.token_hex(3)}-probe"
    try:
        created = ip("netns", "add", probe, check=False)
        if created.returncode != 0:
            return f"`ip netns add` does not work here: {created.stderr.strip()}"
        try:
            for kind, args in (("veth", ("pa", "type", "veth", "peer", "name", "pb")), ("bridge", ("pbr", "type", "bridge"))):
                made = ip("-n", probe, "link", "add", *args, check=False)
                if made.returncode != 0:
                    return f"cannot create a {kind} interface in a network namespace: {made.stderr.strip()}"
        finally:
            ip("netns", "del", probe, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`ip` could not be run: {exc}"
    return None


def remove_stale_namespaces() -> list[str]:
    """Delete lab namespaces whose creating process no longer exists (a run that was SIGKILLed).

    Only names this module makes (``zq-<pid>-<token>-<label>``) with a dead
    ``<pid>`` are touched. Processes still inside them are KILLed by pid first.

    :returns: the names removed.
    """
    removed = []
    for name in sorted(_listed()):
        match = _NAME.match(name)
        if not match or pid_alive(int(match["pid"])):
            continue
        _kill_inside(name)
        if ip("netns", "del", name, check=False).returncode == 0:
            removed.append(name)
    return removed


def _listed() -> set[str]:
    return {line.split(" ", 1)[0] for line in ip("netns", "list", check=False).stdout.splitlines()}


def _pids_inside(namespace: str) -> list[int]:
    listed = ip("netns", "pids", namespace, check=False)
    return [int(word) for word in listed.stdout.split() if word.isdigit()] if listed.returncode == 0 else []


def _kill_inside(namespace: str) -> None:
    for pid in _pids_inside(namespace):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Host:
    """One host of a :class:`Lab`: a namespace with ``eth0`` at ``address`` on the lab's /24."""

    def __init__(self, lab: "Lab", label: str, namespace: str, address: str, switch_port: str) -> None:
        self.lab, self.label, self.namespace, self.address = lab, label, namespace, address
        self.device = "eth0"
        self.switch_port = switch_port

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed so that it runs inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def cut(self) -> None:
        """Unplug the cable: take this host's ``eth0`` down (its address stays configured)."""
        ip("-n", self.namespace, "link", "set", self.device, "down")

    def restore(self) -> None:
        """Plug the cable back in: ``eth0`` up again."""
        ip("-n", self.namespace, "link", "set", self.device, "up")

    def __repr__(self) -> str:
        return f"<Host {self.label} {self.address} in netns {self.namespace}>"


class Lab:
    """A private network of namespaces joined by a bridge; use as a context manager or call :meth:`close`.

    :param subnet: the first three octets of the lab's /24 (a private range:
        it exists only inside the lab's namespaces).

    :meth:`add_host` makes a host; :meth:`popen` starts a process inside one;
    :meth:`close` stops every process by pid and deletes every namespace,
    whatever state the test left them in.
    """

    def __init__(self, subnet: str = "10.254.7") -> None:
        self.subnet = subnet
        self.prefix = f"zq-{os.getpid()}-{secrets.token_hex(3)}"
        self.namespaces: list[str] = []
        self.hosts: dict[str, Host] = {}
        self.processes: list[subprocess.Popen] = []
        self._logs: list[Any] = []
        self.closed = False
        self.switch = self._namespace("sw")
        try:
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
        except BaseException:
            self.close()
            raise

    def _namespace(self, label: str) -> str:
        name = f"{self.prefix}-{label}"
        ip("netns", "add", name)
        self.namespaces.append(name)
        ip("-n", name, "link", "set", "lo", "up")
        return name

    def add_host(self, label: str, host_number: int) -> Host:
        """A new host ``label`` (lower-case letters and digits) at ``SUBNET.host_number``, plugged into the bridge."""
        if not re.fullmatch(r"[a-z0-9]{1,8}", label) or label in self.hosts or label == "sw":
            raise ValueError(f"bad or duplicate host label {label!r}")
        namespace = self._namespace(label)
        port = f"p-{label}"
        # Made inside the switch namespace, the host end moved straight into the host's: no interface ever
        # appears in the namespace the tests run in.
        ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        ip("-n", self.switch, "link", "set", port, "master", "br0")
        ip("-n", self.switch, "link", "set", port, "up")
        address = f"{self.subnet}.{host_number}"
        ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        ip("-n", namespace, "link", "set", "eth0", "up")
        host = self.hosts[label] = Host(self, label, namespace, address, port)
        return host

    def popen(self, host: Host, argv: Sequence[str], *, log_path: str, **kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` inside ``host``'s namespace, output to ``log_path``; stopped by :meth:`close`.

        ``ip netns exec`` execs the command, so the returned pid is the command's own.
        """
        log = open(log_path, "ab")
        self._logs.append(log)
        proc = subprocess.Popen(host.command(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, **kwargs)
        self.processes.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, *, timeout: float = 10.0) -> Optional[int]:
        """Stop one process by pid: TERM, then KILL (its process group too) after ``timeout`` seconds."""
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGTERM)
                proc.wait(timeout)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # started with start_new_session: group id == pid
                except ProcessLookupError:
                    pass
        try:
            proc.wait(10.0)
        except subprocess.TimeoutExpired:
            pass
        return proc.returncode

    def close(self) -> None:
        """Stop every process (by pid), then delete every namespace. Idempotent.

        :raises NetnsError: a namespace still exists after 10 s of retries.
        """
        if self.closed:
            return
        self.closed = True
        for proc in reversed(self.processes):
            self.stop(proc)
        for log in self._logs:
            log.close()
        for namespace in reversed(self.namespaces):
            _kill_inside(namespace)  # fallback: anything still inside, by pid
        deadline = time.monotonic() + 10.0
        while True:
            leftovers = [name for name in reversed(self.namespaces) if name in _listed()]
            for namespace in leftovers:
                ip("netns", "del", namespace, check=False)
            if not leftovers:
                return
            if time.monotonic() > deadline:
                raise NetnsError(f"could not delete network namespaces {leftovers}")
            time.sleep(0.1)

    def __enter__(self) -> "Lab":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
