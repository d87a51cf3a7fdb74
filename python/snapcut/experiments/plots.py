"""Shared matplotlib helpers (the `experiments` extra). Figures are written
with the Agg backend: no display needed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from snapcut._core import ConfigError
from snapcut.experiments.analysis import Summary

COLORS = {
    "none": "black",
    "aligned": "tab:blue",
    "aligned-timeout": "tab:cyan",
    "unaligned": "tab:green",
    "chandy-lamport": "tab:purple",
    "sync-capture": "tab:orange",
    "sync": "tab:red",
}


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or a ConfigError saying how to get it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ConfigError(
            "plots need matplotlib: pip install 'snapcut[experiments]' (or pass --no-plots)"
        ) from err
    return plt


def lines(
    ax: Any,
    summaries: list[Summary],
    x: Callable[[Summary], float],
    y: Callable[[Summary], tuple[float, float, float] | None],
    *,
    label: Callable[[Summary], str] = lambda s: s.cell.protocol,
    linestyle: Callable[[Summary], str] = lambda s: "-",
) -> None:
    """One line per label: y = (median, min, max) drawn with min-max error bars."""
    series: dict[str, list[tuple[float, float, float, float]]] = {}
    styles: dict[str, str] = {}
    for s in summaries:
        v = y(s)
        if v is not None:
            name = label(s)
            series.setdefault(name, []).append((x(s), *v))
            styles.setdefault(name, linestyle(s))
    for name, pts in series.items():
        pts.sort()
        xs = [p[0] for p in pts]
        med = [p[1] for p in pts]
        lo = [p[1] - p[2] for p in pts]
        hi = [p[3] - p[1] for p in pts]
        proto = name.split(" ")[0]
        ax.errorbar(
            xs,
            med,
            yerr=[lo, hi],
            marker="o",
            capsize=3,
            label=name,
            color=COLORS.get(proto),
            linestyle=styles[name],
        )


def overhead_pct(s: Summary) -> tuple[float, float, float] | None:
    """A summary's overhead in % as (median, min, max) for `lines`, if it has one."""
    if s.overhead_median is None:
        return None
    return (100 * s.overhead_median, 100 * (s.overhead_min or 0.0), 100 * (s.overhead_max or 0.0))


def slowdown(s: Summary) -> tuple[float, float, float] | None:
    """A summary's runtime relative to `none` (1 + overhead) as (median, min, max):
    a ratio, so that a log axis can show +5 % and x200 on one plot."""
    if s.overhead_median is None:
        return None
    return (1 + s.overhead_median, 1 + (s.overhead_min or 0.0), 1 + (s.overhead_max or 0.0))


def save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
