"""Registry: the tasks a worker will run, by name, and the middleware around them. Nothing else ever runs."""

from __future__ import annotations

import random
from typing import Any, Callable, NamedTuple, Optional, overload

from ..beat import Periodic
from ..errors import ConfigurationError
from ..wire.envelope import MAX_TASK_NAME
from .handles import P, R, TaskHandle
from .ratelimit import parse_rate

#: Names under this prefix are the worker's built-in tasks.
RESERVED_PREFIX = "zqsync."
#: Exception types a task's ``retry_on`` may list.
ExceptionTypes = tuple[type[BaseException], ...]


class Task(NamedTuple):
    """A registered task.

    :ivar name: the name clients use.
    :ivar fn: the function; called with the request's ``*args, **kwargs``.
    :ivar time_limit: seconds the task may run before it is interrupted
        (``gevent.Timeout``), or ``None`` for no limit.
    :ivar retries: further attempts after a failure (0: none).
    :ivar backoff: seconds before the first retry; doubled for each later one.
    :ivar retry_on: exception types worth a retry; any other failure is final.
        Empty: every failure is retried.
    :ivar max_delay: the cap, in seconds, of the doubled backoff (``None``: no cap).
    :ivar jitter: the fraction (0..1) of each retry delay drawn at random:
        the delay is uniform in ``[delay * (1 - jitter), delay]``.
    :ivar store_result: keep the status and result of its plain jobs in the worker's memory
        (``client.job``/``client.result``); confirmed jobs keep theirs in the journal anyway.
    :ivar soft_time_limit: seconds after which `SoftTimeLimitExceeded` is
        raised into the task (``None``: none); below ``time_limit``, which still applies.
    :ivar rate_limit: jobs of this task started per second by one worker process (``ratelimit.py``),
        or ``None`` for no limit.
    """

    name: str
    fn: Callable[..., Any]
    time_limit: Optional[float] = None
    retries: int = 0
    backoff: float = 1.0
    retry_on: ExceptionTypes = ()
    max_delay: Optional[float] = None
    jitter: float = 0.0
    store_result: bool = False
    soft_time_limit: Optional[float] = None
    rate_limit: Optional[float] = None

    def backoff_for(self, attempts: int) -> float:
        """Seconds of backoff after attempt ``attempts`` (1 for the first), before jitter.

        ``backoff * 2 ** (attempts - 1)``, capped at ``max_delay``.
        """
        delay = self.backoff * 2.0 ** (attempts - 1)
        return delay if self.max_delay is None else min(delay, self.max_delay)

    def retry_delay(self, attempts: int, error: Optional[BaseException] = None) -> Optional[float]:
        """Seconds to wait before attempt ``attempts + 1``, or ``None`` when the job is done retrying.

        :param attempts: attempts made so far (>= 1).
        :param error: the exception the last attempt raised; with ``retry_on``
            set, a failure of another type is not retried.
        :returns: `backoff_for` ``(attempts)`` less up to ``jitter`` of it, or ``None``.
        """
        if attempts > self.retries or not self.retries_on(error):
            return None
        return self.backoff_for(attempts) * (1.0 - self.jitter * random.random())

    def retries_on(self, error: Optional[BaseException]) -> bool:
        """Whether a failure with ``error`` may be retried (``retry_on`` empty, or ``error`` one of its types)."""
        return not self.retry_on or isinstance(error, self.retry_on)


class TaskContext(NamedTuple):
    """What a `Middleware` hook learns about the task it runs around.

    :ivar task: the task name.
    :ivar job_id: the job's or call's id.
    :ivar kind: ``"job"`` (plain or confirmed) or ``"call"``.
    :ivar attempt: this attempt's number, 1 for the first.
    :ivar args: the positional arguments, as decoded.
    :ivar kwargs: the keyword arguments, as decoded.
    """

    task: str
    job_id: str
    kind: str
    attempt: int
    args: tuple
    kwargs: dict


class Middleware:
    """Hooks around every task a worker runs; subclass it and override the hooks you need.

    Register an instance with `Registry.add_middleware`. Hooks run in
    the task's own greenlet, in registration order (``after_task`` in reverse
    order), outside the task's time limit, and may block it. A hook that
    raises is logged and counted (``hook_errors``) and never changes the
    task's outcome. The worker's own ``zqsync.*`` tasks pass no hooks.
    """

    def before_task(self, context: TaskContext) -> None:
        """Just before the task's function is called."""

    def after_task(self, context: TaskContext, result: Any, error: Optional[BaseException]) -> None:
        """After every attempt: ``result`` when it succeeded (``error`` is ``None``), else ``error``."""

    def on_failure(self, context: TaskContext, error: BaseException) -> None:
        """After an attempt that raised ``error`` (its time limit included:
        `TimeLimitExceeded`); called before ``after_task``."""

    def on_retry(self, context: TaskContext, error: BaseException, delay: float) -> None:
        """A failed job will run again in ``delay`` seconds (never for calls)."""

    def on_dead_letter(self, context: TaskContext, error: BaseException) -> None:
        """A failed job will not run again: its retries are exhausted or ``retry_on`` excludes ``error``.

        A confirmed job is then ``dead`` in the journal. Jobs buried without
        running (a crash loop, an undecodable journal row) pass no hook."""


class Registry:
    """A name-to-task map that a worker serves, with the middleware around its tasks.

    Usage::

        registry = Registry()

        @registry.task
        def add(a, b):
            return a + b

        @registry.task(name="resize", time_limit=30.0, retries=3, retry_on=(IOError,), max_delay=60.0)
        def resize(image_id, size="small"): ...

    Then ``zqsync worker mymodule:registry --bind tcp://127.0.0.1:5555``.

    :param middleware: `Middleware` instances, as if passed to `add_middleware` in order.
    """

    def __init__(self, middleware: tuple[Middleware, ...] = ()) -> None:
        self._tasks: dict[str, Task] = {}
        #: ``{task name: schedule}`` of the tasks ``zqsync beat`` enqueues (`periodic`).
        self.periodic_jobs: dict[str, Periodic] = {}
        self.middleware: list[Middleware] = []
        for each in middleware:
            self.add_middleware(each)

    def add_middleware(self, middleware: Middleware) -> None:
        """Run ``middleware``'s hooks around every task, after those added before it.

        :raises ConfigurationError: ``middleware`` is not a `Middleware`.
        """
        if not isinstance(middleware, Middleware):
            raise ConfigurationError(
                f"middleware must be a zqsync.worker.Middleware, got {type(middleware).__name__}", setting="middleware"
            )
        self.middleware.append(middleware)

    @overload
    def task(self, fn: Callable[P, R]) -> TaskHandle[P, R]: ...

    @overload
    def task(
        self,
        *,
        name: Optional[str] = None,
        time_limit: Optional[float] = None,
        retries: int = 0,
        backoff: float = 1.0,
        retry_on: ExceptionTypes = (),
        max_delay: Optional[float] = None,
        jitter: float = 0.0,
        store_result: bool = False,
        soft_time_limit: Optional[float] = None,
        rate_limit: Optional[str] = None,
    ) -> Callable[[Callable[P, R]], TaskHandle[P, R]]: ...

    def task(
        self,
        fn: Optional[Callable[..., Any]] = None,
        *,
        name: Optional[str] = None,
        time_limit: Optional[float] = None,
        retries: int = 0,
        backoff: float = 1.0,
        retry_on: ExceptionTypes = (),
        max_delay: Optional[float] = None,
        jitter: float = 0.0,
        store_result: bool = False,
        soft_time_limit: Optional[float] = None,
        rate_limit: Optional[str] = None,
    ) -> Any:
        """Register ``fn`` as a task; usable bare (``@registry.task``) or with options.

        :param name: the task name (default: the function's ``__name__``).
        :param time_limit: seconds before the task is interrupted; ``None`` for none.
        :param retries: further attempts of a failed job (int >= 0). A
            confirmed job that exhausts them is kept as ``dead`` in the
            journal (the dead-letter table); calls are never retried.
        :param backoff: seconds before the first retry, doubled for each later one.
        :param retry_on: exception types worth a retry (a tuple of classes);
            a failure of any other type is final at once. Default: all.
        :param max_delay: seconds; the doubled backoff never exceeds it (``None``: no cap).
        :param jitter: fraction 0..1 of each retry delay drawn at random, so
            that jobs failing together do not retry together.
        :param store_result: keep the status and result of its plain (not confirmed) jobs in the
            worker's memory, bounded, for ``keep_done`` seconds (``client.job``, ``client.result``).
        :param soft_time_limit: seconds after which `SoftTimeLimitExceeded` is raised
            into the task, also where it does not yield (the watchdog); the task may catch it and clean up
            until ``time_limit``, which still applies. ``None``: none.
        :param rate_limit: ``"N/s"``, ``"N/m"`` or ``"N/h"``: at most ``N`` jobs of this task start per
            second, minute or hour in each worker process; the others wait for their turn without holding
            a task slot (``zqsync/worker/ratelimit.py``). Calls are not limited. ``None``: no limit.
        :returns: a `TaskHandle`: still callable as ``fn`` (it runs
            here), with ``enqueue``, ``call``, their ``_with_options`` forms and ``using(client)``.
        :raises ConfigurationError: the name is taken, reserved, or too long,
            ``time_limit`` is not a positive number, retries/backoff/max_delay
            are negative, ``jitter`` is outside 0..1, ``retry_on`` holds a
            non-exception, ``soft_time_limit`` is not a positive number below ``time_limit``, or
            ``rate_limit`` is not ``N/s``, ``N/m`` or ``N/h``.
        """

        def register(function: Callable[..., Any]) -> TaskHandle[Any, Any]:
            return TaskHandle(self.add(function, name=name, time_limit=time_limit, retries=retries, backoff=backoff,
                                       retry_on=retry_on, max_delay=max_delay, jitter=jitter,
                                       store_result=store_result, soft_time_limit=soft_time_limit,
                                       rate_limit=rate_limit))

        return register(fn) if fn is not None else register

    def add(self, fn: Callable[..., Any], *, name: Optional[str] = None, **options: Any) -> Task:
        """Register ``fn`` without decorator syntax; see `task` for the options."""
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
        task = Task(task_name, fn, **_checked_options(**options))
        self._tasks[task_name] = task
        return task

    def periodic(
        self,
        *,
        every: Optional[float] = None,
        cron: Optional[str] = None,
        catch_up: str = "skip",
        args: tuple = (),
        kwargs: Optional[dict] = None,
        name: Optional[str] = None,
        **options: Any,
    ) -> Callable[[Callable[P, R]], TaskHandle[P, R]]:
        """Register a task that ``zqsync beat MODULE:registry ENDPOINT...`` enqueues on a schedule.

        Usage: ``@registry.periodic(cron="*/5 * * * *")`` or ``@registry.periodic(every=30.0)``.
        Each tick is a confirmed job with an id derived from the task name and
        the tick (``zqsync/beat.py``), so it needs workers with ``--state-dir``.

        :param every: seconds between ticks (float >= 0.001), aligned on the epoch.
        :param cron: a five-field cron expression, in UTC (needs ``cronsim``: the ``beat`` extra).
        :param catch_up: ``"skip"`` (default): ticks that passed while no beat
            ran are never run; ``"latest"``: the most recent of them runs once.
        :param args: the job's positional arguments (msgpack-encodable).
        :param kwargs: the job's keyword arguments.
        :param name: the task name; ``options`` are `task`'s.
        :raises ConfigurationError: as `task`, or the schedule is invalid
            (neither or both of ``every`` and ``cron``, a bad expression, an unknown ``catch_up``).
        """

        def register(function: Callable[P, R]) -> TaskHandle[P, R]:
            label = str(name or getattr(function, "__name__", ""))
            schedule = Periodic.build(label, every=every, cron=cron, catch_up=catch_up, args=args, kwargs=kwargs)
            task = self.add(function, name=name, **options)
            self.periodic_jobs[task.name] = schedule._replace(task=task.name)
            return TaskHandle(task)

        return register

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


def _seconds_or_none(value: Any, setting: str, *, positive: bool) -> Optional[float]:
    return None if value is None else _seconds(value, setting, positive=positive)


def _seconds(value: Any, setting: str, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (positive and value == 0):
        kind = "a positive number" if positive else "a number >= 0"
        raise ConfigurationError(f"{setting} must be {kind} of seconds, got {value!r}", setting=setting)
    return float(value)


def _checked_options(
    *,
    time_limit: Optional[float] = None,
    retries: int = 0,
    backoff: float = 1.0,
    retry_on: ExceptionTypes = (),
    max_delay: Optional[float] = None,
    jitter: float = 0.0,
    store_result: bool = False,
    soft_time_limit: Optional[float] = None,
    rate_limit: Optional[str] = None,
) -> dict[str, Any]:
    """A task's options, checked and normalised. :raises ConfigurationError: one is invalid."""
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigurationError(f"retries must be an integer >= 0, got {retries!r}", setting="retries")
    retry_on = tuple(retry_on) if isinstance(retry_on, (tuple, list)) else (retry_on,)
    if not all(isinstance(kind, type) and issubclass(kind, BaseException) for kind in retry_on):
        raise ConfigurationError(f"retry_on must be exception classes, got {retry_on!r}", setting="retry_on")
    if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not 0 <= jitter <= 1:
        raise ConfigurationError(f"jitter must be a fraction from 0 to 1, got {jitter!r}", setting="jitter")
    hard = _seconds_or_none(time_limit, "time_limit", positive=True)
    soft = _seconds_or_none(soft_time_limit, "soft_time_limit", positive=True)
    if soft is not None and hard is not None and soft >= hard:
        raise ConfigurationError(f"soft_time_limit must be below time_limit ({hard} s), got {soft!r}",
                                 setting="soft_time_limit")
    return {
        "time_limit": hard,
        "soft_time_limit": soft,
        "rate_limit": parse_rate(rate_limit),
        "retries": retries,
        "backoff": _seconds(backoff, "backoff", positive=False),
        "retry_on": retry_on,
        "max_delay": _seconds_or_none(max_delay, "max_delay", positive=False),
        "jitter": float(jitter),
        "store_result": bool(store_result),
    }
