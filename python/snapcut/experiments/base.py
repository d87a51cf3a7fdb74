"""What an experiment is: a named grid of cells and the plots drawn from it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from snapcut.experiments.analysis import Row, Summary
from snapcut.experiments.grid import Cell, Preset
from snapcut.experiments.measurement import Measurement

Timelines = dict[Cell, Measurement]
"""The first repetition's measurement of every cell that records a timeline."""


@dataclass(frozen=True)
class Experiment:
    name: str
    number: int
    title: str
    question: str
    cells: Callable[[Preset, tuple[str, ...] | None], list[Cell]]
    plot: Callable[[list[Summary], Timelines, Path], list[Path]]
    simulate: Callable[[Cell, list[Row], Preset, Path], Measurement] | None = None
    """Runs a cell in a model instead of a real job (sees the rows so far)."""
    notes: Callable[[list[Row], list[Summary]], str] | None = None
    """Extra report text for this experiment."""
    estimate: Callable[[Cell, Preset], float] | None = None
    """Seconds a run of a cell takes in a preset, when not records / rate."""
    windowed: bool = False
    """Its overhead cells are also measured by the windowed method (`windows.py`)."""
