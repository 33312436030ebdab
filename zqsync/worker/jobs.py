"""The records a job travels in through the scheduler (``scheduler.py``, ``pacing.py``, ``replay.py``)."""

from __future__ import annotations

from typing import Callable, NamedTuple

from ..wire import envelope
from .registry import Task


class Job(NamedTuple):
    """A job on its way through the scheduler."""

    task: Task
    request: envelope.Request
    attempts: int = 0
    durable: bool = False
    admitted: bool = False  # holds a backlog place until it starts
    alone: bool = False  # was running when its process died: runs with no other task beside it
    counted: bool = False  # its next attempt is already counted in the journal (by the insert)
    waited: bool = False  # had its rate limit's turn: starts without taking another


class Confirm(NamedTuple):
    """A confirmed job on its way to the journal, and how to answer its client (in the hub)."""

    task: Task
    request: envelope.Request
    due: float  # epoch seconds, or 0.0: run now
    answer: Callable[[bytes], None]
    counted: bool  # its insert counts the first attempt (NewJob.retry_at)


__all__ = ["Confirm", "Job"]
