"""The shape limits of task arguments and results, checked where containers nest and nowhere else.

Both sides run `check_nesting`: the client on what it is about to encode
(``envelope.encode_request``), the worker and the client on what msgpack
decoded (``decode_request``, ``decode_reply``). The limits:

* at most `MAX_ITEMS` elements per list or map (the decoding side's
  ``Unpacker`` enforces the same bound in C with ``max_array_len`` and
  ``max_map_len``);
* map keys are scalars (`KEY_TYPES`; msgpack would encode a tuple key as
  an array, which the other side cannot decode into a hashable key);
* at most `MAX_DEPTH` levels: ``args``, ``kwargs`` and a result are at
  level 1, and a value inside a list or map at level ``n`` is at level ``n + 1``,
  so a container at level ``MAX_DEPTH`` must be empty;
* no msgpack extension types (``ExtType``, ``Timestamp``): msgpack packs them,
  and the decoding side refuses every extension (``max_ext_len=0``).

Speed: the walk visits containers only. The types of a container's children
(and of a map's keys) are tested at C speed
(``frozenset.issuperset(map(type, children))``); only a container that holds
something else than exact scalars has its children looped over in Python, to
find the containers among them. Flat arguments (scalars, and lists or maps of
scalars) cost a few C-level passes and no Python loop.
"""

from __future__ import annotations

import reprlib
from typing import Any, Iterable

import msgpack

from ..errors import ProtocolError

#: Most elements of one msgpack array or map, and deepest nesting of arguments and results.
MAX_ITEMS = 1_000_000
MAX_DEPTH = 100
#: Types a map key may have: msgpack decodes them to hashable values (subclasses allowed).
KEY_TYPES = (str, bytes, int, float, bool, type(None))
#: Types of values with nothing inside them to check (exact types: a subclass is tested with ``isinstance``).
SCALAR_TYPES = frozenset(KEY_TYPES)
#: Types the walk descends into (msgpack packs their subclasses as arrays and maps too).
CONTAINER_TYPES = (list, tuple, dict)
#: msgpack's extension types, which it packs natively (``ExtType`` is a tuple subclass).
EXTENSION_TYPES = (msgpack.ExtType, msgpack.Timestamp)
_STR = frozenset({str})


def check_kwargs(kwargs: Any) -> None:
    """Refuse a ``kwargs`` that is not a map with str keys (a str subclass is a str)."""
    if not isinstance(kwargs, dict):
        raise ProtocolError(f"field 'kwargs' must be a map with str keys, got {type(kwargs).__name__}")
    if not _STR.issuperset(map(type, kwargs)):
        bad = [key for key in kwargs if not isinstance(key, str)]
        if bad:
            raise ProtocolError(f"field 'kwargs' must be a map with str keys, got key {short(bad[0])}")


def check_nesting(value: Any) -> None:
    """Refuse a ``value`` (at level 1) that breaks a limit of the module docstring.

    Recursive only where containers nest, and never deeper than `MAX_DEPTH`
    calls. Values of other types are left to msgpack, which packs what it can and
    raises ``TypeError`` on the rest, except msgpack's extension types
    (``ExtType``, ``Timestamp``), refused here: the decoding side refuses every
    extension (``max_ext_len=0``).

    :raises ProtocolError: naming the limit (``MAX_ITEMS``, ``MAX_DEPTH``), the bad map key or extension.
    """
    if type(value) in SCALAR_TYPES:
        return
    if isinstance(value, EXTENSION_TYPES):
        _refuse_extension(value)
    if isinstance(value, CONTAINER_TYPES):
        _check_container(value, 1)


def _check_container(item: Any, depth: int) -> None:
    if len(item) > MAX_ITEMS:
        raise ProtocolError(f"a list or map of {len(item)} elements is over the limit of {MAX_ITEMS} (MAX_ITEMS)")
    children: Iterable[Any] = item
    if isinstance(item, dict):
        if not SCALAR_TYPES.issuperset(map(type, item)):
            _check_keys(item)
        children = item.values()
    if not item or (depth < MAX_DEPTH and SCALAR_TYPES.issuperset(map(type, children))):
        return  # the common case: nothing inside but scalars, tested in C
    if depth >= MAX_DEPTH:
        raise ProtocolError(f"value nests deeper than {MAX_DEPTH} levels (MAX_DEPTH)")
    for child in children:
        if type(child) in SCALAR_TYPES:
            continue
        if isinstance(child, EXTENSION_TYPES):  # before the containers: an ExtType is a tuple
            _refuse_extension(child)
        if isinstance(child, CONTAINER_TYPES):
            _check_container(child, depth + 1)


def _refuse_extension(value: Any) -> None:
    raise ProtocolError(f"{type(value).__name__} {short(value)} is a msgpack extension: the other side refuses "
                        "every extension type")


def _check_keys(item: dict[Any, Any]) -> None:
    for key in item:
        if not isinstance(key, KEY_TYPES):
            raise ProtocolError(f"map key {short(key)} is a {type(key).__name__}: keys must be str, bytes, int, "
                                "float, bool or None")


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 2, 60, 60


def short(value: Any) -> str:
    """A bounded repr for error messages: never deep, never long, whatever a peer sent."""
    return _REPR.repr(value)
