"""Task durations: a bounded sample per task for percentiles, and listeners (the Prometheus histogram)."""

from __future__ import annotations

import collections
from typing import Callable, Iterable, Mapping

#: Most recent durations kept per task for percentiles.
SAMPLE_SIZE = 2048

Listener = Callable[[str, float], None]


class Durations:
    """Records how long each task run took, in seconds."""

    def __init__(self) -> None:
        self._samples: dict[str, collections.deque[float]] = {}
        self.listeners: list[Listener] = []

    def record(self, task: str, seconds: float) -> None:
        """Note one run of ``task`` that took ``seconds``."""
        sample = self._samples.get(task)
        if sample is None:
            sample = self._samples[task] = collections.deque(maxlen=SAMPLE_SIZE)
        sample.append(seconds)
        for listener in self.listeners:
            listener(task, seconds)

    def percentiles(self, quantiles: tuple[float, ...] = (0.5, 0.9, 0.99)) -> dict[str, dict[str, float]]:
        """Per task (and ``"*"`` for all): ``{"count", "p50", "p90", "p99"}`` over the recent sample, seconds."""
        return percentiles_of(self._samples, quantiles)

    def samples(self) -> dict[str, list[float]]:
        """The recent sample per task, seconds (a prefork child sends them to the child that merges stats)."""
        return {task: list(sample) for task, sample in self._samples.items()}


def percentiles_of(samples: Mapping[str, Iterable[float]],
                   quantiles: tuple[float, ...] = (0.5, 0.9, 0.99)) -> dict[str, dict[str, float]]:
    """Per task (and ``"*"`` for all): ``{"count", "p50", ...}`` over ``samples`` (seconds per task)."""
    result = {}
    everything: list[float] = []
    for task, sample in samples.items():
        ordered = sorted(sample)
        if ordered:
            result[task] = _summary(ordered, quantiles)
            everything.extend(ordered)
    if everything:
        result["*"] = _summary(sorted(everything), quantiles)
    return result


def _summary(ordered: list[float], quantiles: tuple[float, ...]) -> dict[str, float]:
    summary: dict[str, float] = {"count": len(ordered)}
    for quantile in quantiles:
        index = min(len(ordered) - 1, int(quantile * len(ordered)))
        summary[f"p{round(quantile * 100):d}"] = ordered[index]
    return summary
