"""Task handles: what ``@registry.task`` returns.

A `TaskHandle` is still the function (calling it runs it here, in
this process) and also sends it: ``add.enqueue(1, 2)`` is
``client.enqueue("add", 1, 2)`` and ``add.call(1, 2)`` is
``client.call("add", 1, 2)``, on the process's default client
(``ZQSYNC_ENDPOINT``) or on the one given to `TaskHandle.using`. The
handle is generic in the function's parameters and return type
(``TaskHandle[P, R]``, after dramatiq's ``Actor[P, R]``), so a type checker
checks the arguments of ``enqueue`` and ``call`` and knows that
``add.call(1, 2)`` and ``add.enqueue(1, 2).result()`` return what ``add``
returns. A typo in a task name is then an ``AttributeError`` at import (or a
type error), not a job dropped at the worker.

The handle's task record (`Task`: name,
options) is `TaskHandle.task`; `Registry.get` returns the same record. String task
names keep working everywhere.
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Any, Generic, Iterable, Mapping, Optional, TypeVar

if sys.version_info >= (3, 10):
    from typing import ParamSpec
else:  # Python 3.9
    from typing_extensions import ParamSpec

if TYPE_CHECKING:
    from ..canvas import Signature
    from ..client.client import Client
    from ..client.jobs import Job
    from .registry import Task

P = ParamSpec("P")
R = TypeVar("R")


class TaskHandle(Generic[P, R]):
    """A registered task: callable as its function, and sent with `enqueue` or `call`.

    :param task: the registered task record.
    :param client: the client to send through; ``None`` for the process's default client
        (`zqsync.client.client.default_client`, built from ``ZQSYNC_ENDPOINT`` at first use).
    """

    def __init__(self, task: "Task", client: Optional["Client"] = None) -> None:
        self.task = task
        self._client = client
        functools.update_wrapper(self, task.fn)

    @property
    def name(self) -> str:
        """The task name the worker knows it by."""
        return self.task.name

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function here, in this process, like the undecorated function."""
        return self.task.fn(*args, **kwargs)  # type: ignore[no-any-return]

    def using(self, client: "Client") -> "TaskHandle[P, R]":
        """This task, sent through ``client`` instead of the default client."""
        return TaskHandle(self.task, client)

    def _sender(self) -> "Client":
        if self._client is not None:
            return self._client
        from ..client.client import default_client

        return default_client()

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> "Job[R]":
        """`Client.enqueue` of this task: at most once; returns its
        `Job` (a ``str`` id with ``result()``, ``status()``, ``cancel()``)."""
        return self._sender().enqueue(self.name, *args, **kwargs)

    def enqueue_with_options(self, *, args: Iterable[Any] = (), kwargs: Optional[Mapping[str, Any]] = None,
                             **options: Any) -> "Job[R]":
        """`Client.enqueue_with_options` of this task
        (``confirm=``, ``delay=``, ``job_id=``, ...). ``args`` and ``kwargs`` are not type-checked here."""
        return self._sender().enqueue_with_options(self.name, args=args, kwargs=kwargs, **options)

    def s(self, *args: Any, **kwargs: Any) -> "Signature":
        """A `Signature` of this task with these arguments, for ``zqsync.chain``,
        ``zqsync.group`` and ``zqsync.chord`` (sent through this handle's client unless told otherwise)."""
        from ..canvas import Signature

        return Signature(self.name, args, dict(kwargs), self._client)

    def call(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """`Client.call` of this task: blocks for its result.

        :raises RemoteError: the task raised. :raises CallTimeout: no reply in time.
        """
        return self._sender().call(self.name, *args, **kwargs)  # type: ignore[no-any-return]

    def call_with_options(self, *, args: Iterable[Any] = (), kwargs: Optional[Mapping[str, Any]] = None,
                          timeout: Optional[float] = None) -> R:
        """`Client.call_with_options` of this task."""
        return self._sender().call_with_options(  # type: ignore[no-any-return]
            self.name, args=args, kwargs=kwargs, timeout=timeout)

    def __reduce__(self) -> str:
        # Pickled by reference, as the function was: its module's attribute of that name is this handle.
        return str(getattr(self.task.fn, "__qualname__", self.name))

    def __repr__(self) -> str:
        return f"<zqsync task {self.name!r}>"
