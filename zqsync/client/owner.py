"""Who owns a pooled socket: ``(pid, gevent hub)`` under gevent, ``(pid, thread)`` otherwise.

Under ``gevent.monkey.patch_all()`` ``threading.get_ident()`` is per
greenlet, so keying by it would hand every greenlet its own socket. A hub is
per native thread and every greenlet on it shares one event loop, so greenlets
share the hub's sockets, one at a time per socket (see ``pool.py``).

gevent is never imported here: a process that has not imported it cannot be
running a hub, so plain scripts stay free of it.
"""

from __future__ import annotations

import _thread
import itertools
import os
import sys
import weakref
from typing import Any, Callable, NamedTuple, Optional


class Owner(NamedTuple):
    """A lease owner.

    :ivar key: hashable ``(pid, kind, serial)``; ``kind`` is ``"hub"`` or ``"thread"``.
    :ivar green: whether sockets for this owner must be ``zmq.green`` sockets.
    :ivar alive: a callable telling whether the owner still exists.
    """

    key: tuple[int, str, int]
    green: bool
    alive: Callable[[], bool]


class _ThreadToken:
    """Lives in a native thread-local slot; it is freed when its thread ends."""

    __slots__ = ("__weakref__",)


def _native_local() -> Any:
    # monkey.patch_all() replaces _thread._local with a greenlet-local; the
    # token must be per native thread, so fetch the original class.
    gevent_monkey = sys.modules.get("gevent.monkey")
    if gevent_monkey is not None:
        return gevent_monkey.get_original("_thread", "_local")()
    return _thread._local()


_thread_slot = _native_local()


_hub_owners: "weakref.WeakKeyDictionary[Any, Owner]" = weakref.WeakKeyDictionary()


def _alive_while(ref: "weakref.ReferenceType[Any]", *, hub: bool) -> Callable[[], bool]:
    def alive() -> bool:
        target = ref()
        if target is None:
            return False
        # Hub.destroy() sets loop to None even while references linger.
        return not hub or getattr(target, "loop", None) is not None

    return alive


_get_hub_if_exists: Any = None
# Owner keys are serial numbers, never id(): a finished thread's token (or a
# destroyed hub) frees its address, and a new owner allocated there must not
# inherit the dead one's sockets.
_serials = itertools.count(1)


def current_hub() -> Any:
    """The gevent hub of the calling native thread, or ``None``.

    Under monkey-patching every thread is a gevent thread, so the hub is
    created if it does not exist yet: otherwise a call made before anything
    else touched gevent would key by thread and get a plain, hub-blocking
    socket. Without monkey-patching a hub is never created here.
    """
    global _get_hub_if_exists
    if "gevent" not in sys.modules:
        return None
    if _get_hub_if_exists is None:
        from gevent._hub_local import get_hub_if_exists

        _get_hub_if_exists = get_hub_if_exists
    hub = _get_hub_if_exists()
    if hub is None:
        monkey = sys.modules.get("gevent.monkey")
        if monkey is not None and monkey.saved:
            from gevent import get_hub

            hub = get_hub()
    return hub


def current_owner(pid: Optional[int] = None) -> Owner:
    """The owner for the calling code. Cheap (cached); called on every lease.

    :param pid: ``os.getpid()`` if the caller has it already.
    """
    pid = os.getpid() if pid is None else pid
    hub = current_hub()
    if hub is not None:
        cached = getattr(_thread_slot, "hub_owner", None)  # (hub, its owner): a hub runs in one thread only
        if cached is not None and cached[0] is hub and cached[1].key[0] == pid:
            return cached[1]  # type: ignore[no-any-return]
        owner = _hub_owners.get(hub)
        if owner is None or owner.key[0] != pid:
            owner = Owner((pid, "hub", next(_serials)), True, _alive_while(weakref.ref(hub), hub=True))
            _hub_owners[hub] = owner
        _thread_slot.hub_owner = (hub, owner)
        return owner
    owner = getattr(_thread_slot, "owner", None)
    if owner is None or owner.key[0] != pid:
        token = _ThreadToken()
        _thread_slot.token = token
        owner = Owner((pid, "thread", next(_serials)), False, _alive_while(weakref.ref(token), hub=False))
        _thread_slot.owner = owner
    return owner
