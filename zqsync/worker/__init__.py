"""The worker runtime: a task registry, a server and a task runner.

Importing ``zqsync.worker.Registry`` is all a task module needs; the server
(``zqsync.worker.server``) imports gevent and is loaded by ``zqsync worker``.
"""

from .registry import Middleware, Registry, Task, TaskContext

__all__ = ["Middleware", "Registry", "Task", "TaskContext"]
