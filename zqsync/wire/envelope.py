"""The wire envelope: one msgpack map per ZeroMQ frame.

Request (client to worker; a DEALER frame, job or call, that a ROUTER
receives as ``[identity, body]``)::

    {"v": 1, "id": str, "kind": "job" | "call" | "confirm", "task": str, "args": list, "kwargs": map,
     "opts": {"due": float, "store": bool, "expires": float, "canvas": map}, "deadline": float, "sent": float}

``opts`` is optional and sent only when set: ``due`` (epoch seconds, UTC) is
when a confirmed job may run at the earliest (a delayed job); ``store`` asks
the worker to keep a plain job's status and result for ``zqsync.job``;
``expires`` (epoch seconds) is when a confirmed job that has not started is
no longer run (it is journaled with it; a plain job's expiry is its ``deadline``); ``canvas`` (a map)
names the confirmed job's successors in a chain or chord (``zqsync/worker/canvas.py``).

``deadline`` and ``sent`` are optional and go together (a request without
them never expires, as before): ``deadline`` is the budget in seconds the
sender still had when it encoded the request (a call's timeout, a plain
job's ``deadline=``), ``sent`` the sender's wall-clock time then (Unix
seconds). The worker stamps the budget on receipt with its own monotonic
clock, so clocks that disagree across hosts do not matter while the request
travels and queues in the worker's process. But a request that waited in
a stopped worker's kernel buffers is "received" only when the worker runs
again, so the worker also checks ``sent + deadline`` against its own wall
clock, allowing `CLOCK_SKEW` seconds of disagreement between hosts
(``Request.expires``). A worker does not start a request past its deadline.

``confirm`` is a job sent over the rpc socket: the reply acknowledges that it
is durable in the worker's journal.

Reply (worker to client, on the rpc socket only; an error reply has an empty
``id`` when the worker could not decode the request's own id)::

    {"v": 1, "id": str, "ok": true, "result": any}
    {"v": 1, "id": str, "ok": false, "error": {"type": str, "message": str, "traceback": str}}

``id`` is the job id or request id, echoed in every reply so that a client
can recognise and drop a stray reply (docs/design.md, pool rule 3). Decoding validates every
field it uses and raises `ProtocolError` and nothing
else. Task arguments and results must be msgpack-serialisable: ``None``,
bool, int, float, str, bytes, lists/tuples and maps of those.

One set of limits holds on both sides: `encode_request` (the client,
before anything is sent) and `decode_request` (the worker) run the same
checks, so a request the worker would refuse raises ``ProtocolError`` in the
caller instead of being counted as enqueued and dropped at the worker:

* a frame of at most `MAX_MESSAGE_SIZE` bytes (16 MiB; the worker's
  ``ZMQ_MAXMSGSIZE`` resets a connection that carries a larger one);
* ``id`` a non-empty str of at most `MAX_ID` characters, ``task`` one of
  at most `MAX_TASK_NAME`;
* ``kwargs`` keys are str; map keys anywhere are scalars (str, bytes, int,
  float, bool, None; a tuple key would decode as an unhashable list);
* nesting at most `MAX_DEPTH` levels and at most `MAX_ITEMS`
  elements per list or map.
"""

from __future__ import annotations

import _thread
import functools
import math
import struct
import sys
import time
from typing import Any, NamedTuple, Optional

import msgpack

from ..errors import ProtocolError
from .limits import MAX_DEPTH as MAX_DEPTH  # the limits are part of the envelope's contract
from .limits import MAX_ITEMS, SCALAR_TYPES, check_kwargs, check_nesting
from .limits import short as _short

VERSION = 1
KINDS = ("job", "call", "confirm")
#: Upper bound of one frame, bytes (the worker also sets ZMQ_MAXMSGSIZE to this).
MAX_MESSAGE_SIZE = 16 * 1024 * 1024
#: Largest encoded result a worker sends back or keeps, bytes: a status reply (``job()``, ``result()``)
#: carries it with room to spare under a client's MAX_MESSAGE_SIZE.
MAX_RESULT_SIZE = MAX_MESSAGE_SIZE - 64 * 1024
MAX_TASK_NAME = 200
MAX_ID = 64
#: Seconds the wall clocks of a client's and a worker's hosts may disagree before a request
#: that carries a deadline is refused early (or run late) because of it.
CLOCK_SKEW = 1.0
_scalars_only = SCALAR_TYPES.issuperset


class Request(NamedTuple):
    """A decoded request. ``args`` is a list, ``kwargs`` a dict with str keys."""

    id: str
    kind: str
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any] = {}
    #: seconds of budget the sender had when it encoded the request; ``None``: no deadline.
    deadline: Optional[float] = None
    #: the sender's wall-clock time (Unix seconds) when it encoded the request, with ``deadline``.
    sent: Optional[float] = None
    #: never on the wire: the decoding side's ``time.monotonic()`` after which the request must not
    #: start, stamped by `decode_request` (``None``: no deadline).
    expires: Optional[float] = None


#: Request options and their types (``opts`` on the wire).
OPTIONS: dict[str, tuple[type, ...]] = {"due": (int, float), "store": (bool,), "expires": (int, float), "canvas": (dict,)}


class Reply(NamedTuple):
    """A decoded reply: ``ok`` with ``result``, or not ``ok`` with ``error`` fields."""

    id: str
    ok: bool
    result: Any
    error: dict[str, str] | None


def _native_local() -> Any:
    """A per-native-thread slot (``threading.local`` is per greenlet under monkey-patching)."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey.get_original("_thread", "_local")() if monkey is not None else _thread._local()


_packers = _native_local()


def _packer() -> msgpack.Packer:
    """This thread's reused ``Packer``: packing never yields, so greenlets of one thread share it.
    A failed ``pack`` resets its buffer (``autoreset``)."""
    packer = getattr(_packers, "packer", None)
    if packer is None:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
    return packer


def _pack(message: dict[str, Any]) -> bytes:
    try:
        return _packer().pack(message)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(f"cannot encode message for task arguments or result: {exc}") from exc


def _unpack(data: bytes, max_size: int) -> dict[str, Any]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"frame must be bytes, got {type(data).__name__}")
    if len(data) > max_size:
        raise ProtocolError(f"frame of {len(data)} bytes exceeds the {max_size}-byte limit")
    try:
        message = msgpack.unpackb(
            data, raw=False, strict_map_key=False, max_str_len=max_size, max_bin_len=max_size,
            max_array_len=MAX_ITEMS, max_map_len=MAX_ITEMS, max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise ProtocolError(f"frame is not valid msgpack: {type(exc).__name__}: {exc}") from exc
    if not isinstance(message, dict):
        raise ProtocolError(f"frame must hold a map, got {type(message).__name__}")
    version = message.get("v")
    if type(version) is not int or version != VERSION:  # True == 1 and 1.0 == 1 in Python: check the type
        raise ProtocolError(f"unsupported protocol version {_short(version)} (this side speaks {VERSION})")
    return message


def _check_str(message: dict[str, Any], field: str, limit: int) -> str:
    return _check_text(field, message.get(field), limit)


def _check_text(field: str, value: Any, limit: int) -> str:
    if not isinstance(value, str) or not value or len(value) > limit:
        raise ProtocolError(f"field {field!r} must be a non-empty str of at most {limit} characters, got {_short(value)}")
    return value


def encode_request(
    kind: str, request_id: str, task: str, args: Any = (), kwargs: Any = None, *, max_size: int = MAX_MESSAGE_SIZE,
    options: Any = None,
    deadline: Optional[float] = None,
) -> bytes:
    """Encode a request frame.

    :param kind: ``"job"`` (fire and forget), ``"call"`` (a reply is expected)
        or ``"confirm"`` (a job acknowledged once journaled).
    :param request_id: job id or request id, a non-empty str of at most 64 characters.
    :param task: registered task name, at most 200 characters.
    :param args: positional arguments (tuple or list).
    :param kwargs: keyword arguments (dict with str keys) or ``None``.
    :param max_size: the largest frame, bytes, a worker accepts.
    :param options: request options (``{"due": epoch seconds, "store": bool}``), or ``None``.
    :param deadline: seconds from now after which the worker must not start the request
        (stamped with the current wall-clock time as ``sent``); ``None``: no deadline.
    :raises ProtocolError: the request breaks a limit of the module docstring
        (the message names the limit and the value), or an argument cannot be
        serialised. Nothing is sent then.
    """
    # Exact str within bounds (every client-made id, any sane task name) passes without a call; the rest is
    # checked, and refused with its message, by _check_text.
    if type(request_id) is not str or not 0 < len(request_id) <= MAX_ID:
        _check_text("id", request_id, MAX_ID)
    if type(task) is not str or not 0 < len(task) <= MAX_TASK_NAME:
        _check_text("task", task, MAX_TASK_NAME)
    args, kwargs = list(args), kwargs or {}
    _check_arguments(args, kwargs)
    options = _check_options(options) if options else None
    deadline = None if deadline is None else _check_seconds("deadline", deadline)
    head = _heads.get((kind, task)) or _head(kind, task)
    packer = _packer()
    try:
        parts = [b"", _V_ID, packer.pack(request_id), head, packer.pack(args), _KWARGS,
                 packer.pack(kwargs) if kwargs else _EMPTY_MAP]
        if options:
            parts += (_OPTS, packer.pack(options))
        if deadline is not None:
            parts += (_DEADLINE, _double(deadline), _SENT, _double(time.time()))
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(f"cannot encode message for task arguments or result: {exc}") from exc
    parts[0] = _MAP_HEADERS[len(parts)]
    frame = b"".join(parts)
    if len(frame) > max_size:
        raise ProtocolError(
            f"the request for task {task!r} encodes to {len(frame)} bytes, over the limit of {max_size} bytes "
            f"(MAX_MESSAGE_SIZE) that a worker accepts: not sent"
        )
    return frame


# encode_request writes the request map from pieces, in the order of a dict with the same fields (v, id, kind,
# task, args, kwargs, opts, deadline, sent): the same bytes as packing that dict (tests/unit/test_protocol.py),
# with a pack call per variable value instead of a dict built and packed whole (about a third of the encoding's
# instructions, measured with callgrind). The constant keys and each (kind, task)'s are packed once.
_V_ID = b"\xa1v\x01\xa2id"  # "v": 1, "id":
_KWARGS, _OPTS, _DEADLINE, _SENT = b"\xa6kwargs", b"\xa4opts", b"\xa8deadline", b"\xa4sent"
_EMPTY_MAP = b"\x80"
#: len(parts) -> the fixmap header: 7 parts hold 6 entries (v, id, kind, task, args, kwargs), each option 1 more.
_MAP_HEADERS = {7 + 2 * extra: bytes([0x86 + extra]) for extra in range(4)}
_double = functools.partial(struct.Struct(">Bd").pack, 0xCB)  # a float, as msgpack packs it (float 64)
#: (kind, task) -> the bytes of ``"kind": kind, "task": task, "args":``; cleared past `_HEADS_KEPT` entries.
_heads: dict[tuple[str, str], bytes] = {}
_HEADS_KEPT = 4096


def _head(kind: str, task: str) -> bytes:
    if len(_heads) >= _HEADS_KEPT:
        _heads.clear()  # task names made up per request: keep memory bounded
    packer = _packer()
    head = _heads[kind, task] = b"\xa4kind" + packer.pack(kind) + b"\xa4task" + packer.pack(task) + b"\xa4args"
    return head


def decode_request(data: bytes, *, max_size: int = MAX_MESSAGE_SIZE) -> Request:
    """Decode and validate a request frame, and stamp its deadline (``expires``) on receipt.

    Call it when the request is read: the budget counts from then.

    :raises ProtocolError: the frame is malformed; the message names the fault.
    """
    message = _unpack(data, max_size)
    request_id: Any = message.get("id")
    task: Any = message.get("task")
    kind, args, kwargs = message.get("kind"), message.get("args", []), message.get("kwargs", {})
    # The common request passes in one expression: exact types (msgpack decodes to exact str, list and dict),
    # and arguments that are scalars only; anything else goes through every check, which names the fault.
    if not (type(request_id) is str and 0 < len(request_id) <= MAX_ID and kind in KINDS
            and type(task) is str and 0 < len(task) <= MAX_TASK_NAME and type(args) is list
            and type(kwargs) is dict and not kwargs and _scalars_only(map(type, args))):
        _check_text("id", request_id, MAX_ID)
        if kind not in KINDS:
            raise ProtocolError(f"field 'kind' must be one of {KINDS}, got {_short(kind)}")
        _check_text("task", task, MAX_TASK_NAME)
        if not isinstance(args, list):
            raise ProtocolError(f"field 'args' must be a list, got {type(args).__name__}")
        _check_arguments(args, kwargs)
    deadline, sent = message.get("deadline"), message.get("sent")
    expires = None
    if deadline is not None or sent is not None:
        deadline, sent = _check_seconds("deadline", deadline), _check_seconds("sent", sent)
        expires = _expires_at(deadline, sent, time.monotonic())
    options = _check_options(message["opts"]) if "opts" in message else {}
    return Request(request_id, kind, task, args, kwargs, options, deadline, sent, expires)


def _check_options(options: Any) -> dict[str, Any]:
    if not isinstance(options, dict):
        raise ProtocolError(f"field 'opts' must be a map, got {type(options).__name__}")
    for key, value in options.items():
        kinds = OPTIONS.get(key)
        if kinds is None or not isinstance(value, kinds) or (kinds != (bool,) and isinstance(value, bool)):
            raise ProtocolError(f"option {_short(key)} is unknown or has a bad value {_short(value)} "
                                f"(known: due and expires: epoch seconds, store: bool, canvas: map)")
    return dict(options)


def _check_seconds(field: str, value: Any) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise ProtocolError(f"field {field!r} must be a finite number of seconds >= 0, got {_short(value)}")
    return float(value)


def _expires_at(deadline: float, sent: float, received: float) -> float:
    """The decoding side's monotonic time after which a request must not start.

    :param deadline: the request's budget, seconds; ``sent``: the sender's wall-clock time (Unix seconds).
    :param received: the worker's ``time.monotonic()`` when it read the request.
    :returns: the earlier of ``received + deadline`` (immune to clock differences between
        hosts) and the wall-clock bound ``sent + deadline + CLOCK_SKEW`` moved onto the
        monotonic clock (catches a request that waited in a stopped worker's buffers).
    """
    by_wall = sent + deadline + CLOCK_SKEW - time.time()
    return received + min(deadline, by_wall)


def _check_arguments(args: list[Any], kwargs: Any) -> None:
    if len(args) > MAX_ITEMS or not _scalars_only(map(type, args)):  # scalars only: nothing to walk (limits.py)
        check_nesting(args)
    if kwargs or type(kwargs) is not dict:  # an empty dict: nothing to check
        check_kwargs(kwargs)
        check_nesting(kwargs)


def encode_result(request_id: str, result: Any, *, max_size: int = MAX_RESULT_SIZE) -> bytes:
    """Encode a success reply.

    :param max_size: bytes the frame may take (default `MAX_RESULT_SIZE`).
    :raises ProtocolError: msgpack cannot encode ``result`` (the message names the type or the
        limit it is past), or the frame is over ``max_size`` bytes.
    """
    try:
        frame = _packer().pack({"v": VERSION, "id": request_id, "ok": True, "result": result})
    except OverflowError as exc:
        raise ProtocolError(f"an int outside msgpack's 64-bit range (-2**63 to 2**64 - 1) cannot be encoded "
                            f"({exc})") from exc
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"msgpack cannot encode it: {exc}") from exc
    if len(frame) > max_size:
        raise ProtocolError(f"it encodes to {len(frame):,} bytes, over the {max_size:,}-byte limit for a result "
                            "(MAX_RESULT_SIZE)")
    return frame


def encode_error(request_id: str, type_name: str, message: str, traceback: str = "") -> bytes:
    """Encode an error reply naming the remote exception type, its message and traceback."""
    return _pack(
        {
            "v": VERSION,
            "id": request_id,
            "ok": False,
            "error": {"type": type_name, "message": message, "traceback": traceback},
        }
    )


def decode_reply(data: bytes, *, max_size: int = MAX_MESSAGE_SIZE) -> Reply:
    """Decode and validate a reply frame.

    :raises ProtocolError: the frame is malformed; the message names the fault.
    """
    message = _unpack(data, max_size)
    ok = message.get("ok")
    if not (ok is False and message.get("id") == ""):  # "": the worker could not read our request's id
        _check_str(message, "id", MAX_ID)
    if ok is True:
        result = message.get("result")
        check_nesting(result)
        return Reply(message["id"], True, result, None)
    error = message.get("error")
    if ok is not False or not isinstance(error, dict):
        raise ProtocolError("reply must carry ok=true with a result, or ok=false with an error map")
    fields = {name: error.get(name, "") for name in ("type", "message", "traceback")}
    if not all(isinstance(value, str) for value in fields.values()):
        raise ProtocolError("error fields type, message and traceback must be str")
    return Reply(message["id"], False, None, fields)
