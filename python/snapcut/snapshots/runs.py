"""A state's runs (format 2) for writers that keep them across processes (a
Spark state root's workers): a local root's compactor, whether a merged run
can be adopted on top of a state's runs, and the entry that adopts it. The
rules are Rust's (``snapcut_core::store::format``: ``plan_compaction``,
``adopt``; the merge is the store's compactor)."""

from __future__ import annotations

from typing import Any

from snapcut._core import format as fmt

__all__ = [
    "RunCompactor",
    "adopt_run",
    "adoptable",
    "check_compaction_budget",
    "compaction_inputs",
    "run_counts",
]

RunCompactor = fmt.RunCompactor
"""One process's compactor of a local root's runs (a Rust thread, paced):
``submit`` a task's runs, ``wait_finished`` for the merged runs it staged."""


def adopt_run(
    entry: dict[str, Any], inputs: list[dict[str, Any]], output: dict[str, Any], at: int
) -> dict[str, Any] | None:
    """`entry` (a state file entry listing runs) with the merged run
    `output` in place of its `inputs`, its file in checkpoint `at`'s
    directory; None when the entry's runs no longer hold the inputs
    (superseded: the merge is of no use)."""
    return fmt.adopt_run(entry, inputs, output, at)


def compaction_inputs(
    vertex: str, partition: int, runs: list[dict[str, Any]], limit: int
) -> list[tuple[int, dict[str, Any]]] | None:
    """The files the merge `runs` call for (with `limit` diffs on their
    full) reads: ``(checkpoint, file entry)`` each, to fetch them where a
    :data:`RunCompactor` reads them; None when they call for none."""
    return fmt.compaction_inputs(vertex, partition, runs, limit)


def adoptable(
    runs: list[dict[str, Any]], inputs: list[dict[str, Any]], output: dict[str, Any]
) -> bool:
    """Whether a state built on `runs` can adopt the merge of `inputs`."""
    return fmt.adoptable(runs, inputs, output)


def check_compaction_budget(cpu_share: float, bytes_per_s: int | None) -> None:
    """Raises ConfigError, naming the setting, for a compactor's share of
    one core outside [0.01, 1] or a byte rate that is not positive."""
    fmt.check_compaction_budget(cpu_share, bytes_per_s)


def run_counts(entries: list[dict[str, Any]]) -> dict[str, int]:
    """What state file `entries` say of their runs, by the store's rule for
    its checkpoints' metrics: ``runs_max`` (the most runs one entry's state
    is made of: what a cold task reads), ``runs_total``, and ``debt_bytes``
    (their diff runs' bytes: what compaction folds into a full)."""
    return fmt.run_counts(entries)
