"""Task handles for asyncio code: ``AsyncTask(add)`` sends the registered task ``add`` through an AsyncClient.

``await AsyncTask(add).acall(1, 2)`` is ``await client.call("add", 1, 2)`` and
``await AsyncTask(add).aenqueue(1, 2)`` is ``await client.enqueue("add", 1, 2)``, on the
process's default async client (``ZQSYNC_ENDPOINT``) or on the one given
(``AsyncTask(add, client)``, or ``client.task(add)``). Like
`TaskHandle` it is generic in the function's parameters and
result, so a type checker checks the arguments and knows what ``acall`` returns.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any, Generic, Iterable, Mapping, Optional, TypeVar

if sys.version_info >= (3, 10):
    from typing import ParamSpec
else:  # Python 3.9
    from typing_extensions import ParamSpec

from ..settings import default_endpoint
from .client import AsyncClient, AsyncJob

if TYPE_CHECKING:
    from ..worker.handles import TaskHandle

P = ParamSpec("P")
R = TypeVar("R")


class AsyncTask(Generic[P, R]):
    """A registered task sent from asyncio code.

    :param handle: what ``@registry.task`` returned (a `TaskHandle`).
    :param client: the `AsyncClient` to send through; ``None``: `default_client`.
    """

    def __init__(self, handle: "TaskHandle[P, R]", client: Optional[AsyncClient] = None) -> None:
        self.name = handle.name
        self._client = client

    def _sender(self) -> AsyncClient:
        return self._client if self._client is not None else default_client()

    async def acall(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """`AsyncClient.call` of this task. :raises RemoteError: it raised. :raises CallTimeout: no reply."""
        return await self._sender().call(self.name, *args, **kwargs)  # type: ignore[no-any-return]

    async def acall_with_options(self, *, args: Iterable[Any] = (), kwargs: Optional[Mapping[str, Any]] = None,
                                 timeout: Optional[float] = None) -> R:
        """`AsyncClient.call_with_options` of this task."""
        return await self._sender().call_with_options(  # type: ignore[no-any-return]
            self.name, args=args, kwargs=kwargs, timeout=timeout)

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> AsyncJob:
        """`AsyncClient.enqueue` of this task: at most once; returns its `AsyncJob`."""
        return await self._sender().enqueue(self.name, *args, **kwargs)

    async def aenqueue_with_options(self, *, args: Iterable[Any] = (), kwargs: Optional[Mapping[str, Any]] = None,
                                    **options: Any) -> AsyncJob:
        """`AsyncClient.enqueue_with_options` of this task (``confirm=``, ``delay=``, ...)."""
        return await self._sender().enqueue_with_options(self.name, args=args, kwargs=kwargs, **options)

    def __repr__(self) -> str:
        return f"<zqsync async task {self.name!r}>"


_default_lock = threading.Lock()
_default: Optional[AsyncClient] = None


def default_client() -> AsyncClient:
    """The process-wide `AsyncClient` for ``ZQSYNC_ENDPOINT``, built at first use.

    :raises ConfigurationError: ``ZQSYNC_ENDPOINT`` is unset or malformed.
    """
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = AsyncClient(default_endpoint())
    return _default
