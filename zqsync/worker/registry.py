"""Registry: the tasks a worker will run, by name. Nothing else ever runs."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, TypeVar, overload

from ..errors import ConfigurationError
from ..wire.envelope import MAX_TASK_NAME

F = TypeVar("F", bound=Callable[..., Any])
#: Names under this prefix are the worker's built-in tasks.
RESERVED_PREFIX = "zqsync."


class Task(NamedTuple):
    """A registered task.

    :ivar name: the name clients use.
    :ivar fn: the function; called with the request's ``*args, **kwargs``.
    :ivar time_limit: seconds the task may run before it is interrupted
        (``gevent.Timeout``), or ``None`` for no limit.
    :ivar retries: further attempts after a failure (0: none).
    :ivar backoff: seconds before the first retry; doubled for each later one.
    :ivar store_result: keep the status and result of its plain jobs in the worker's memory
        (``client.job``/``client.result``); confirmed jobs keep theirs in the journal anyway.
    """

    name: str
    fn: Callable[..., Any]
    time_limit: Optional[float] = None
    retries: int = 0
    backoff: float = 1.0
    store_result: bool = False

    def retry_delay(self, attempts: int) -> Optional[float]:
        """Seconds to wait before attempt ``attempts + 1``, or ``None`` when retries are exhausted.

        Exponential backoff: ``backoff * 2 ** (attempts - 1)``.
        """
        if attempts > self.retries:
            return None
        return self.backoff * 2 ** (attempts - 1)


class Registry:
    """A name-to-task map that a worker serves.

    Usage::

        registry = Registry()

        @registry.task
        def add(a, b):
            return a + b

        @registry.task(name="resize", time_limit=30.0)
        def resize(image_id, size="small"): ...

    Then ``zqsync worker mymodule:registry --bind tcp://127.0.0.1:5555``.
    """

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}

    @overload
    def task(self, fn: F) -> F: ...

    @overload
    def task(
        self, *, name: Optional[str] = None, time_limit: Optional[float] = None, retries: int = 0, backoff: float = 1.0,
        store_result: bool = False,
    ) -> Callable[[F], F]: ...

    def task(
        self,
        fn: Optional[F] = None,
        *,
        name: Optional[str] = None,
        time_limit: Optional[float] = None,
        retries: int = 0,
        backoff: float = 1.0,
        store_result: bool = False,
    ) -> Any:
        """Register ``fn`` as a task; usable bare (``@registry.task``) or with options.

        :param name: the task name (default: the function's ``__name__``).
        :param time_limit: seconds before the task is interrupted; ``None`` for none.
        :param retries: further attempts of a failed job (int >= 0). A
            confirmed job that exhausts them is kept as ``dead`` in the
            journal (the dead-letter table); calls are never retried.
        :param backoff: seconds before the first retry, doubled for each later one.
        :param store_result: keep the status and result of its plain (not confirmed) jobs in the
            worker's memory, bounded, for ``keep_done`` seconds (``client.job``, ``client.result``).
        :returns: ``fn`` itself, unchanged, so it stays callable locally.
        :raises ConfigurationError: the name is taken, reserved, or too long,
            ``time_limit`` is not a positive number, or retries/backoff are negative.
        """

        def register(function: F) -> F:
            self.add(function, name=name, time_limit=time_limit, retries=retries, backoff=backoff,
                     store_result=store_result)
            return function

        return register(fn) if fn is not None else register

    def add(
        self,
        fn: Callable[..., Any],
        *,
        name: Optional[str] = None,
        time_limit: Optional[float] = None,
        retries: int = 0,
        backoff: float = 1.0,
        store_result: bool = False,
    ) -> Task:
        """Register ``fn`` without decorator syntax; see :meth:`task`."""
        if not callable(fn):
            raise ConfigurationError(f"a task must be callable, got {fn!r}", setting="fn")
        task_name = name or getattr(fn, "__name__", "")
        if not isinstance(task_name, str) or not task_name or len(task_name) > MAX_TASK_NAME:
            raise ConfigurationError(
                f"task name must be 1..{MAX_TASK_NAME} characters, got {task_name!r}", setting="name"
            )
        if task_name.startswith(RESERVED_PREFIX):
            raise ConfigurationError(f"task names starting with {RESERVED_PREFIX!r} are reserved", setting="name")
        if task_name in self._tasks:
            raise ConfigurationError(f"task {task_name!r} is already registered", setting="name")
        if time_limit is not None and not (isinstance(time_limit, (int, float)) and time_limit > 0):
            raise ConfigurationError(
                f"time_limit must be a positive number of seconds, got {time_limit!r}", setting="time_limit"
            )
        if not isinstance(retries, int) or retries < 0:
            raise ConfigurationError(f"retries must be an integer >= 0, got {retries!r}", setting="retries")
        if not (isinstance(backoff, (int, float)) and backoff >= 0):
            raise ConfigurationError(f"backoff must be a number of seconds >= 0, got {backoff!r}", setting="backoff")
        task = Task(task_name, fn, None if time_limit is None else float(time_limit), retries, float(backoff),
                    bool(store_result))
        self._tasks[task_name] = task
        return task

    def get(self, name: str) -> Optional[Task]:
        """The task registered as ``name``, or ``None``."""
        return self._tasks.get(name)

    def names(self) -> list[str]:
        """Registered task names, sorted."""
        return sorted(self._tasks)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)
