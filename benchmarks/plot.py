"""The suite's chart: latency distributions and zqsync's advantage over each peer.

Needs matplotlib (``pip install -e '.[bench]'``). Three panels, one PNG:

1. per-call round trip (microseconds, log scale): box plots of zqsync's pool,
   a raw persistent DEALER and a DEALER per request, plain and under gevent,
   and zqsync against zerorpc;
2. fork cycles and enqueues to a stalled worker (microseconds, log scale);
3. the advantage of every comparison (log scale: 1 is parity, right of it
   zqsync is ahead), each bar with its target as a black tick.

Boxes span the 25th to 75th percentile with the median inside; whiskers
reach the 1st and 99th percentiles (from each row's ``quantiles``).
"""

from __future__ import annotations

import importlib.util
from typing import Any, Optional, Sequence

from benchmarks.harness import Row
from benchmarks.report import Comparison, find

INSTALL_HINT = "pip install -e '.[bench]' (or pip install matplotlib)"
#: Panel 1 and 2 boxes: (scenario, mode prefix, measure prefix, label).
CALL_BOXES = (
    ("pool", "plain", "pool: call round trip", "plain\nzqsync pool"),
    ("pool", "plain", "raw: call round trip", "plain\nraw DEALER"),
    ("pool", "plain", "per-request: call round trip", "plain\nDEALER/request"),
    ("pool", "gevent", "pool: call round trip", "gevent\nzqsync pool"),
    ("pool", "gevent", "raw: call round trip", "gevent\nraw DEALER"),
    ("pool", "gevent", "per-request: call round trip", "gevent\nDEALER/request"),
    ("zerorpc", "gevent", "zqsync: call round trip", "gevent\nzqsync"),
    ("zerorpc", "gevent", "zerorpc: call round trip", "gevent\nzerorpc"),
)
OTHER_BOXES = (
    ("fork", "fork", "bare: fork cycle", "fork\nbare"),
    ("fork", "fork", "zqsync: fork cycle", "fork\nzqsync"),
    ("fork", "fork", "raw: fork cycle", "fork\nraw DEALER"),
    ("congestion", "stalled", "a. DROP, early drop: enqueue latency", "stalled\nDROP early"),
    ("congestion", "stalled", "b. DROP, no early drop: enqueue latency", "stalled\nDROP no early"),
    ("congestion", "stalled", "ms: enqueue latency", "stalled\nBLOCK 5 ms"),
)
ZQSYNC_COLOUR, PEER_COLOUR = "#2a7ab0", "#c8c8c8"


def matplotlib_missing() -> Optional[str]:
    """Why a chart cannot be drawn (with how to install matplotlib), or ``None``."""
    if importlib.util.find_spec("matplotlib") is None:
        return f"matplotlib is not installed: {INSTALL_HINT}"
    return None


def _box_stats(row: Row, label: str) -> dict[str, Any]:
    q = row.quantiles or []
    return {"label": label, "whislo": q[1], "q1": q[25], "med": q[50], "q3": q[75], "whishi": q[99], "fliers": []}


def _boxes(axis: Any, outcomes: dict[str, dict[str, Any]], boxes: Sequence[tuple[str, str, str, str]],
           title: str) -> None:
    stats, colours = [], []
    for scenario, mode, measure, label in boxes:
        rows = outcomes.get(scenario, {}).get("rows", [])
        row = find(rows, (mode, measure))
        if row is not None and row.quantiles:
            stats.append(_box_stats(row, label))
            colours.append(ZQSYNC_COLOUR if "zqsync" in label or "DROP early" in label else PEER_COLOUR)
    axis.set_title(title, fontsize=10)
    if not stats:
        axis.text(0.5, 0.5, "not measured in this run", ha="center", va="center", transform=axis.transAxes)
        return
    drawn = axis.bxp(stats, showfliers=False, patch_artist=True, medianprops={"color": "black"})
    for patch, colour in zip(drawn["boxes"], colours):
        patch.set_facecolor(colour)
    axis.set_yscale("log")
    axis.set_ylabel("microseconds (log)")
    axis.tick_params(axis="x", labelsize=7, labelrotation=35)
    for label in axis.get_xticklabels():
        label.set_horizontalalignment("right")
    axis.grid(axis="y", which="both", alpha=0.3)


def _advantages(axis: Any, comparisons: Sequence[Comparison]) -> None:
    shown = [item for item in comparisons if item.advantage is not None]
    advantages = [item.advantage or 0.0 for item in shown]
    axis.set_title("zqsync advantage over each peer, measured side by side (log; 1 = parity; | = target)",
                   fontsize=10)
    if not shown:
        axis.text(0.5, 0.5, "no comparison measured", ha="center", va="center", transform=axis.transAxes)
        return
    labels = [f"{item.topic}: {item.label}\nvs {item.peer}" for item in shown]
    positions = list(range(len(shown)))[::-1]
    colours = [("#3a9a4a" if item.met else "#c0392b") if item.met is not None else ZQSYNC_COLOUR for item in shown]
    axis.barh(positions, advantages, color=colours, height=0.6)
    for position, item, advantage in zip(positions, shown, advantages):
        if item.target is not None:
            axis.plot([item.target, item.target], [position - 0.4, position + 0.4], color="black", linewidth=2)
        figure = f"{advantage:.2f}" if advantage < 10 else f"{advantage:,.0f}"
        axis.text(advantage, position, f" {figure}x", va="center", fontsize=7)
    axis.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    axis.set_xscale("log")
    axis.set_yticks(positions, labels, fontsize=7)
    axis.set_xlabel("times better than the peer (peer time / zqsync time, or zqsync rate / peer rate)")
    axis.grid(axis="x", which="both", alpha=0.3)


def draw(path: str, outcomes: dict[str, dict[str, Any]], comparisons: Sequence[Comparison], title: str) -> None:
    """Write the chart to ``path`` (PNG).

    :param outcomes: scenario name -> ``{"status", "reason", "rows"}``.
    :param title: the figure's title (machine and command).
    :raises ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure = pyplot.figure(figsize=(12, 11), layout="constrained")
    top, bottom = figure.subfigures(2, 1, height_ratios=[1, 1.25])  # type: ignore[misc]
    left, right = top.subplots(1, 2, width_ratios=[4, 3])
    _boxes(left, outcomes, CALL_BOXES, "call round trip, per call (box: 25th-75th percentile, whiskers: 1st-99th)")
    _boxes(right, outcomes, OTHER_BOXES, "fork cycle; enqueue to a stalled worker")
    _advantages(bottom.subplots(), comparisons)
    figure.suptitle(title, fontsize=9)
    figure.savefig(path, dpi=90)
    pyplot.close(figure)
