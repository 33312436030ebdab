"""Fuzz inputs for the zqsync wire protocol, and a driver that throws them at a live worker.

Shared by ``tests/fuzz/test_worker_fuzz.py`` (about 20,000 messages),
``tests/fuzz/test_envelope_fuzz.py`` and ``tests/fuzz/fuzz_worker.py`` (the
long run). Every input is drawn from a caller's ``random.Random``, so a seed
reproduces a run exactly.

:func:`fuzz_message` returns ``(label, parts)``: a multipart message (usually
one part) made of valid requests, mutations of valid requests (bit flips,
truncation, splicing, field swaps, wrong types, extra or missing fields,
huge declared lengths, deep nesting, non-str keys) and raw garbage.
:class:`FuzzDriver` sends messages to a worker's jobs socket (PUSH) and rpc
socket (DEALERs, and a ROUTER that talks to the worker's ROUTER), drains the
replies without waiting for each one, and predicts, by decoding every part
locally with the same :mod:`zqsync.wire.envelope`, what the worker must count.
"""

from __future__ import annotations

import collections
import itertools
import random
import socket
import time
from typing import Any, Callable, Optional

import msgpack
import zmq

from zqsync.errors import ProtocolError
from zqsync.wire import envelope
from zqsync.wire.endpoints import parse_endpoint, split_endpoint

#: Tasks a valid fuzz request may name: cheap and side-effect free on ``zqsync.demo.tasks``, or unknown.
SAFE_TASKS = ("add", "echo", "fail", "no_such_task", "zqsync.ping")
REQUEST_FIELDS = ("v", "id", "kind", "task", "args", "kwargs")
INT_EDGES = (0, 1, -1, 127, 128, 255, 256, -32, -33, -128, -129, 2**15 - 1, -(2**15), 2**16 - 1, 2**16,
             2**31 - 1, -(2**31), 2**32 - 1, 2**32, -(2**31) - 1, 2**63 - 1, -(2**63), 2**64 - 1)
FLOATS = (0.0, -0.0, 1.5, float("inf"), float("-inf"), float("nan"), 1e308, 5e-324)
ALPHABET = "abcdefxyz_.-: 0189\x00\x7f\u00e9\u20ac\u4e2d\U0001f600"
#: Values of a wrong type (or a wrong value) for any envelope field.
WRONG = (None, True, False, 0, 1, -1, 2, 2**64 - 1, -(2**63), 1.0, float("nan"), "", "x" * 65, "x" * 201,
         "exec", b"", b"id", [], ["a"], {}, {"a": 1}, {1: 2}, msgpack.ExtType(1, b"x"))
#: msgpack headers that declare far more data than a frame holds (str, bin, array, map, ext).
HUGE_HEADERS = (b"\xd9\xff", b"\xda\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xc4\xff", b"\xc5\xff\xff",
                b"\xc6\xff\xff\xff\xff", b"\xdc\xff\xff", b"\xdd\xff\xff\xff\xff", b"\xde\xff\xff",
                b"\xdf\xff\xff\xff\xff", b"\xc7\xff\x01", b"\xc8\xff\xff\x01", b"\xc9\xff\xff\xff\xff\x01",
                b"\xdd\x7f\xff\xff\xff", b"\xdf\x7f\xff\xff\xff", b"\xc1", b"\xd4\xff\x00", b"\xc7\x0c\xff" + b"\xff" * 12)
INTERESTING = b"\x00\x01\x7f\x80\x8f\x90\x9f\xa0\xbf\xc0\xc1\xc2\xc3\xc4\xc6\xc9\xca\xcb\xcf\xd3\xd9\xdb\xdc\xdd\xde\xdf\xe0\xff"
#: Nesting depths around msgpack's 1024-level stack and Python's 1000-frame recursion limit.
DEPTHS = (100, 900, 990, 999, 1000, 1001, 1010, 1022, 1023, 1024, 1025, 2000, 100_000)


def random_text(rng: random.Random, size: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(size))


def random_key(rng: random.Random) -> Any:
    """A map key: mostly str, sometimes int, bytes, None, bool or float (msgpack allows any)."""
    roll = rng.randrange(8)
    if roll < 4:
        return random_text(rng, rng.randrange(6))
    return (rng.choice(INT_EDGES), rng.randbytes(3), None, rng.random() < 0.5)[roll - 4]


def random_value(rng: random.Random, depth: int = 0) -> Any:
    """A valid argument value: None, bool, int, float, str, bytes, and lists and maps of them (no ext types)."""
    roll = rng.randrange(10 if depth < 3 else 7)
    if roll == 0:
        return None
    if roll == 1:
        return rng.random() < 0.5
    if roll == 2:
        return rng.choice(INT_EDGES) if rng.random() < 0.5 else rng.randint(-(2**63), 2**64 - 1)
    if roll == 3:
        return rng.choice(FLOATS) if rng.random() < 0.3 else rng.uniform(-1e9, 1e9)
    if roll == 4:
        return random_text(rng, rng.choice((0, 1, 5, 31, 32, 40)))
    if roll in (5, 6):
        return rng.randbytes(rng.choice((0, 1, 7, 255, 256, 1000)))
    if roll in (7, 8):
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {random_key(rng): random_value(rng, depth + 1) for _ in range(rng.randrange(5))}


def valid_request_map(rng: random.Random) -> dict[Any, Any]:
    """A valid request map naming one of :data:`SAFE_TASKS`."""
    task = rng.choice(SAFE_TASKS)
    args = [rng.randrange(100), rng.randrange(100)] if task == "add" else [random_value(rng) for _ in range(rng.randrange(3))]
    message = {"v": 1, "id": rng.randbytes(8).hex() if rng.random() < 0.7 else random_text(rng, rng.randint(1, 64)),
               "kind": rng.choice(envelope.KINDS), "task": task, "args": args,
               "kwargs": {random_text(rng, rng.randint(1, 6)): random_value(rng) for _ in range(rng.randrange(3))}}
    for field in ("args", "kwargs"):  # both are optional
        if rng.random() < 0.1:
            del message[field]
    items = list(message.items())
    rng.shuffle(items)
    return dict(items)


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def pack_map(items: list[tuple[bytes, bytes]]) -> bytes:
    """A msgpack map of already packed keys and values (lets a value be raw bytes, or a key repeat)."""
    size = len(items)
    header = bytes([0x80 | size]) if size < 16 else b"\xde" + size.to_bytes(2, "big")
    return header + b"".join(key + value for key, value in items)


def nested(rng: random.Random, depth: int) -> bytes:
    """``depth`` levels of one-item arrays, one-item maps, or both alternating, around a nil."""
    unit = rng.choice((b"\x91", b"\x81\xa1k", b"\xdd\x00\x00\x00\x01", b"\x91\x81\xa1k"))
    levels = unit.count(b"\x91") + unit.count(b"\x81") + unit.count(b"\xdd")
    return unit * max(1, depth // levels) + b"\xc0"


# -- mutations -------------------------------------------------------------


def _bitflip(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    return bytes(buf)


def _byteset(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        buf[rng.randrange(len(buf))] = rng.choice(INTERESTING)
    return bytes(buf)


def _insert(rng: random.Random, data: bytes, chunk: bytes, replace: int = 0) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + chunk + data[at + replace:]


BYTE_MUTATIONS: dict[str, Callable[[random.Random, bytes, bytes], bytes]] = {
    "bitflip": lambda rng, data, other: _bitflip(rng, data),
    "byteset": lambda rng, data, other: _byteset(rng, data),
    "truncate": lambda rng, data, other: data[: rng.randrange(len(data))],
    "extend": lambda rng, data, other: data + rng.randbytes(rng.randint(1, 16)),
    "insert": lambda rng, data, other: _insert(rng, data, rng.randbytes(rng.randint(1, 8))),
    "delete": lambda rng, data, other: _insert(rng, data, b"", rng.randint(1, 8)),
    "splice": lambda rng, data, other: data[: rng.randrange(len(data) + 1)] + other[rng.randrange(len(other) + 1):],
    "huge-length": lambda rng, data, other: _insert(rng, data, rng.choice(HUGE_HEADERS), rng.randrange(3)),
}


def _field_swap(rng: random.Random, message: dict) -> Any:
    first, second = rng.sample(list(message), 2)
    message[first], message[second] = message[second], message[first]
    return message


def _field_drop(rng: random.Random, message: dict) -> Any:
    message.pop(rng.choice(REQUEST_FIELDS), None)
    return message


def _wrong_type(rng: random.Random, message: dict) -> Any:
    message[rng.choice(REQUEST_FIELDS)] = rng.choice(WRONG) if rng.random() < 0.7 else random_value(rng)
    return message


def _nonstr_keys(rng: random.Random, message: dict) -> Any:
    if rng.random() < 0.5:
        message["kwargs"] = {random_key(rng): random_value(rng) for _ in range(rng.randint(1, 3))}
        return message
    key = rng.choice(list(message))
    message[rng.choice((key.encode(), 1, None, True, 1.5))] = message.pop(key)
    return message


MAP_MUTATIONS: dict[str, Callable[[random.Random, dict], Any]] = {
    "field-swap": _field_swap,
    "field-drop": _field_drop,
    "field-extra": lambda rng, message: {**message, random_key(rng): random_value(rng)},
    "wrong-type": _wrong_type,
    "version": lambda rng, message: {**message, "v": rng.choice((0, 2, -1, 255, 2**64 - 1, "1", b"\x01", None, [1]))},
    "nonstr-keys": _nonstr_keys,
    "top-non-map": lambda rng, message: rng.choice((list(message.values()), random_value(rng), [message])),
}


def _deep(rng: random.Random) -> bytes:
    depth = rng.choice(DEPTHS)
    if rng.random() < 0.2:
        return nested(rng, depth)  # the whole frame
    message = valid_request_map(rng)
    field = rng.choice(REQUEST_FIELDS)
    message.pop(field, None)
    return pack_map([(pack(k), pack(v)) for k, v in message.items()] + [(pack(field), nested(rng, depth))])


def _duplicate_key(rng: random.Random) -> bytes:
    items = [(pack(k), pack(v)) for k, v in valid_request_map(rng).items()]
    field = rng.choice(REQUEST_FIELDS)
    return pack_map(items + [(pack(field), pack(rng.choice(WRONG)))])


def _soup(rng: random.Random) -> bytes:
    """A run of msgpack tokens: headers, small payloads and huge declared lengths."""
    tokens = [bytes([rng.choice(INTERESTING)]) if rng.random() < 0.6 else rng.choice(HUGE_HEADERS)
              for _ in range(rng.randint(1, 40))]
    return b"".join(token + (rng.randbytes(rng.randrange(4)) if rng.random() < 0.3 else b"") for token in tokens)


RAW: dict[str, Callable[[random.Random], bytes]] = {
    "valid": lambda rng: pack(valid_request_map(rng)),
    "deep": _deep,
    "dup-key": _duplicate_key,
    "random": lambda rng: rng.randbytes(rng.randrange(300)),
    "soup": _soup,
    "empty": lambda rng: b"",
}
WEIGHTS = {"valid": 8, "bitflip": 12, "byteset": 6, "truncate": 8, "extend": 4, "insert": 4, "delete": 4, "splice": 8,
           "huge-length": 6, "field-swap": 6, "field-drop": 5, "field-extra": 5, "wrong-type": 8, "version": 3,
           "nonstr-keys": 4, "top-non-map": 3, "deep": 4, "dup-key": 2, "random": 6, "soup": 5, "empty": 1}
_LABELS = list(WEIGHTS)
_CUMULATIVE = list(itertools.accumulate(WEIGHTS.values()))


def fuzz_frame(rng: random.Random, label: Optional[str] = None) -> tuple[str, bytes]:
    """One frame: ``(label, bytes)``; ``label`` picks the kind of input, at random (weighted) by default."""
    label = label or rng.choices(_LABELS, cum_weights=_CUMULATIVE)[0]
    if label in RAW:
        return label, RAW[label](rng)
    if label in MAP_MUTATIONS:
        return label, pack(MAP_MUTATIONS[label](rng, valid_request_map(rng)))
    data = pack(valid_request_map(rng))
    return label, BYTE_MUTATIONS[label](rng, data, pack(valid_request_map(rng)))


def fuzz_message(rng: random.Random) -> tuple[str, list[bytes]]:
    """A message: one frame, or (8 %) 2 to 5 frames, some empty; labelled ``multipart`` then."""
    if rng.random() >= 0.08:
        label, frame = fuzz_frame(rng)
        return label, [frame]
    return "multipart", [b"" if rng.random() < 0.2 else fuzz_frame(rng)[1] for _ in range(rng.randint(2, 5))]


def frame_of_size(size: int, kind: str = "job", task: str = "echo") -> bytes:
    """A well-formed request of exactly ``size`` bytes (>= 70 000): one bytes argument pads it.

    Packed directly, not with ``encode_request``, which refuses frames over
    the limit before sending: the fuzzer sends them to see the worker refuse them too.
    """

    def pack(padding: int) -> bytes:
        return envelope._pack({"v": envelope.VERSION, "id": "big", "kind": kind, "task": task,
                               "args": [b"\0" * padding], "kwargs": {}})

    return pack(size - (len(pack(65536)) - 65536))


# -- raw TCP, below ZeroMQ -----------------------------------------------------

ZMTP_GREETING = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" + b"\0" * 31


def zmtp_ready(socket_type: bytes) -> bytes:
    body = b"\x05READY" + b"\x0bSocket-Type" + len(socket_type).to_bytes(4, "big") + socket_type
    return b"\x04" + bytes([len(body)]) + body


def raw_tcp_payload(rng: random.Random, socket_type: bytes) -> bytes:
    """Bytes for a raw TCP connection to a ZeroMQ port: garbage, bad greetings, or a huge declared frame length."""
    roll = rng.randrange(5)
    if roll == 0:
        return rng.randbytes(rng.randint(1, 512))
    if roll == 1:
        return ZMTP_GREETING + rng.randbytes(rng.randint(1, 256))
    if roll == 2:
        return _bitflip(rng, ZMTP_GREETING + zmtp_ready(socket_type))
    size = rng.choice((2**63 - 1, 2**64 - 1, envelope.MAX_MESSAGE_SIZE + 1, 2**32))
    return ZMTP_GREETING + zmtp_ready(socket_type) + b"\x02" + size.to_bytes(8, "big") + rng.randbytes(64)


def raw_tcp_garbage(rng: random.Random, endpoint: str, connections: int) -> None:
    """Open ``connections`` raw TCP connections to the worker's jobs and rpc ports and write garbage."""
    host, port = parse_endpoint(endpoint)
    host = host[len("tcp://"):]
    for _ in range(connections):
        rpc = rng.random() < 0.5
        try:
            with socket.create_connection((host, port + rpc), timeout=2.0) as conn:
                conn.sendall(raw_tcp_payload(rng, b"DEALER" if rpc else b"PUSH"))
        except OSError:
            pass  # the worker may reset the connection mid-write; that is its right


# -- the driver ------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (VmRSS in /proc/PID/status), bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def classify(frame: bytes) -> str:
    """``"ok"``, ``"malformed"`` (ProtocolError) or ``"bug"`` (any other exception) for ``decode_request``."""
    try:
        envelope.decode_request(frame)
    except ProtocolError:
        return "malformed"
    except Exception:
        return "bug"
    return "ok"


class Stalled(AssertionError):
    """The worker stopped taking messages."""


class FuzzDriver:
    """Sends fuzz messages to one worker and predicts its ``malformed`` and ``jobs_received`` counters.

    :param endpoint: the worker's base endpoint.
    :param rng: the source of every input.
    :param stall_timeout: seconds a send may wait for the worker before :class:`Stalled`.
    :param withhold_bugs: do not send frames that make the local decoder raise something other
        than ProtocolError (they are still counted in ``decoder_bugs``).
    """

    ROUTER_ALIAS = b"worker"

    def __init__(self, endpoint: str, rng: random.Random, *, stall_timeout: float = 10.0, withhold_bugs: bool = False) -> None:
        self.rng, self.stall_timeout, self.withhold_bugs = rng, stall_timeout, withhold_bugs
        self.endpoint = endpoint
        jobs, rpc = split_endpoint(endpoint)
        self.context = zmq.Context()
        self.push = self._socket(zmq.DEALER, jobs, sndtimeo=int(stall_timeout * 1000))
        # DEALERs: auto identity, and explicit random identities (1 to 255 bytes, never starting with a zero byte).
        self.dealers = [self._socket(zmq.DEALER, rpc)] + [
            self._socket(zmq.DEALER, rpc, identity=bytes([rng.randint(1, 255)]) + rng.randbytes(size))
            for size in (0, 16, 254)]
        self.router = self._socket(zmq.ROUTER, rpc, router=True)
        self.poller = zmq.Poller()
        for sock in (*self.dealers, self.router):
            self.poller.register(sock, zmq.POLLIN)
        self.counts: collections.Counter[str] = collections.Counter()  # messages, frames, expected_*, replies
        self.labels: collections.Counter[str] = collections.Counter()
        self.decoder_bugs: list[tuple[str, bytes]] = []  # (exception, frame)
        self.bad_replies: list[tuple[str, list[bytes]]] = []
        self.sent: collections.deque[tuple[str, list[bytes]]] = collections.deque(maxlen=5000)
        self._greet_router()

    def _socket(self, kind: int, address: str, *, identity: bytes = b"", sndtimeo: int = -1, router: bool = False) -> zmq.Socket:
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 0)  # never refuse a reply: the worker drops replies it cannot queue
        sock.setsockopt(zmq.SNDTIMEO, sndtimeo)
        if identity:
            sock.setsockopt(zmq.IDENTITY, identity)
        if router:
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            sock.setsockopt(zmq.CONNECT_ROUTING_ID, self.ROUTER_ALIAS)
        sock.connect(address)
        return sock

    def _greet_router(self) -> None:
        """Wait until the ROUTER-to-ROUTER connection is up (a ping is answered)."""
        deadline = time.monotonic() + self.stall_timeout
        while True:
            try:
                self.router.send_multipart([self.ROUTER_ALIAS, envelope.encode_request("call", "hello", "zqsync.ping")])
                break
            except zmq.ZMQError as exc:  # EHOSTUNREACH until connected
                if time.monotonic() > deadline:
                    raise Stalled(f"cannot reach the worker's ROUTER: {exc}") from exc
                time.sleep(0.01)
        if not self.router.poll(int(self.stall_timeout * 1000)):
            raise Stalled("the worker did not answer a ping over ROUTER")
        self.router.recv_multipart()

    # -- sending ----------------------------------------------------------------

    def run(self, messages: int, *, on_message: Optional[Callable[[int], None]] = None) -> None:
        """Send ``messages`` fuzz messages, 45 % to jobs, 45 % to DEALERs, 10 % through the ROUTER."""
        for index in range(messages):
            label, parts = fuzz_message(self.rng)
            roll = self.rng.random()
            self.send(label, "jobs" if roll < 0.45 else "dealer" if roll < 0.9 else "router", parts)
            if index % 64 == 0:
                self.drain()
            if on_message is not None:
                on_message(index)

    def send(self, label: str, target: str, parts: list[bytes]) -> None:
        """Account for ``parts`` (what the worker must count) and send them to ``target``."""
        verdicts = [classify(part) for part in parts]
        if "bug" in verdicts:
            for part, verdict in zip(parts, verdicts):
                if verdict == "bug":
                    self.decoder_bugs.append((self._exception(part), part))
            if self.withhold_bugs:
                self.counts["withheld"] += 1
                return
        self.labels[label] += 1
        self.counts["messages"] += 1
        self.counts["frames"] += len(parts)
        self.sent.append((target, parts))
        if target == "jobs":  # one job per message (ROUTER): a multi-frame message is one malformed job
            if len(parts) == 1:
                self.counts["expected_malformed"] += verdicts.count("malformed")
                self.counts["expected_jobs"] += verdicts.count("ok")
            else:
                self.counts["expected_malformed"] += 1
            try:
                self.push.send_multipart(parts)
            except zmq.Again:
                raise Stalled(f"the jobs socket took nothing for {self.stall_timeout} s") from None
            return
        self.counts["expected_replies"] += 1
        self.counts["expected_malformed"] += 1 if len(parts) != 1 else verdicts[0] == "malformed"
        sock = self.router if target == "router" else self.rng.choice(self.dealers)
        self._send_draining(sock, [self.ROUTER_ALIAS, *parts] if target == "router" else parts)

    @staticmethod
    def _exception(frame: bytes) -> str:
        try:
            envelope.decode_request(frame)
        except Exception as exc:
            return f"{type(exc).__name__}: {str(exc)[:120]}"
        return "none"

    def _send_draining(self, sock: zmq.Socket, parts: list[bytes]) -> None:
        deadline = time.monotonic() + self.stall_timeout
        while True:
            try:
                sock.send_multipart(parts, flags=zmq.NOBLOCK)
                return
            except zmq.Again:
                if time.monotonic() > deadline:
                    raise Stalled(f"the rpc socket took nothing for {self.stall_timeout} s") from None
                sock.poll(50, zmq.POLLOUT)
                self.drain()

    # -- replies ----------------------------------------------------------------

    def drain(self, timeout_ms: int = 0) -> int:
        """Receive every reply already here (waiting up to ``timeout_ms`` for the first); returns how many."""
        received = 0
        for sock, _ in self.poller.poll(timeout_ms):
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                received += 1
                self._check_reply(sock, frames)
        self.counts["replies"] += received
        return received

    def _check_reply(self, sock: zmq.Socket, frames: list[bytes]) -> None:
        routing = [self.ROUTER_ALIAS] if sock is self.router else []
        try:
            if frames[:-1] != routing:
                raise ProtocolError(f"unexpected envelope {frames[:-1]!r:.80}")
            envelope.decode_reply(frames[-1])
        except Exception as exc:  # every reply of the worker must be a valid reply
            self.bad_replies.append((f"{type(exc).__name__}: {str(exc)[:120]}", frames))

    def settle(self, timeout: float) -> bool:
        """Drain until every expected reply arrived or ``timeout`` seconds passed without a new one."""
        idle_since = time.monotonic()
        while self.counts["replies"] < self.counts["expected_replies"]:
            if self.drain(100):
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > timeout:
                return False
        return True

    def close(self) -> None:
        for sock in (self.push, *self.dealers, self.router):
            sock.close(linger=0)
        self.context.term()


def send_oversized(endpoint: str, target: str, frame: bytes, *, timeout: float = 20.0) -> str:
    """Send one big frame on a throwaway PUSH (``"jobs"``) or DEALER (``"rpc"``) socket.

    :returns: ``"disconnected"`` if the worker dropped the connection (a frame over ZMQ_MAXMSGSIZE),
        ``"replied"`` if the rpc frame was answered, ``"sent"`` if a job was accepted and nothing else happened.
    """
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)  # jobs and rpc alike (the jobs socket is a ROUTER)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        sock.connect(split_endpoint(endpoint)[target == "rpc"])
        sock.send(frame, copy=False)
        poller = zmq.Poller()
        poller.register(monitor, zmq.POLLIN)
        if target == "rpc":
            poller.register(sock, zmq.POLLIN)
        events = dict(poller.poll(int(timeout * 1000 if target == "rpc" or len(frame) > envelope.MAX_MESSAGE_SIZE else 1000)))
        if monitor in events:
            return "disconnected"
        if sock in events:
            envelope.decode_reply(sock.recv())
            return "replied"
        return "sent"
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=int(timeout * 1000))  # a job still on its way is delivered, a refused one is gone
        context.term()
