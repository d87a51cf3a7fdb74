"""A Python worker's ``state_memory`` and how it splits, so that what the
worker holds of state rows stays within it (issue 37):

- half to the partition a task works on, shared by its tables
  (:func:`table_memory`);
- a quarter to the input a task holds before it spills it into key parts
  (:func:`input_held_bytes`);
- a quarter to the partitions the worker keeps warm for later batches
  (:func:`warm_memory`; the largest warm tables flush past it).

Beside the rows: the pages of mapped runs a table's lookups may leave
resident (:func:`mapped_memory`), and pyarrow's free pages, handed back to
the OS between a task's steps (:func:`release_unused_arrow_memory`).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from snapcut._core import ConfigError
from snapcut.spark.state.spec import TableLayout

__all__ = [
    "MIN_TABLE_MEMORY",
    "input_held_bytes",
    "mapped_memory",
    "release_unused_arrow_memory",
    "table_memory",
    "warm_memory",
]

MIN_TABLE_MEMORY = 1 << 20
"""The least budget of one spilling table (Rust's MIN_STATE_MEMORY)."""


def table_memory(state_memory: int, layouts: Sequence[TableLayout]) -> int:
    """Each table's budget under a Python worker's `state_memory`: half of
    it, shared by the tables of the partition a task works on. ConfigError
    if a table would get less than 1 MiB, naming the least budget that
    works."""
    spilling = max(len(layouts), 1)
    least = 2 * spilling * MIN_TABLE_MEMORY
    if state_memory < least:
        raise ConfigError(
            f"state_memory of {state_memory} bytes is below the minimum of {least} bytes a "
            f"Python worker needs for this step's {spilling} spilling state table(s): half of "
            "it goes to the partition a task works on, at least 1 MiB a table, and the other "
            "half to the input a task holds and the partitions the worker keeps warm; raise "
            "it, or leave it unset for no limit"
        )
    return state_memory // 2 // spilling


def input_held_bytes(state_memory: int) -> int:
    """Input a task holds before it spills it into key parts: a quarter of
    `state_memory`."""
    return state_memory // 4


def warm_memory(state_memory: int) -> int:
    """In-memory rows the warm tables of the partitions a worker keeps may
    hold between tasks: a quarter of `state_memory`."""
    return state_memory // 4


def mapped_memory(table_memory: int) -> int:
    """The pages of a table's mapped runs its lookups may leave resident:
    a quarter of its memory (at least 1 MiB). A worker's resident set is what
    a container's memory limit sees, and random lookups over a partition's
    runs would otherwise leave every page of them there."""
    return max(table_memory // 4, MIN_TABLE_MEMORY)


def release_unused_arrow_memory() -> None:
    """Hands back to the OS the pages pyarrow's default pool holds free.
    Its allocator (mimalloc here) keeps freed pages for reuse: after the
    input's spill, ~140 MB of a 10M-row partition's held and sorted rows
    stayed resident through every part, and each part's transient tables
    added tens of MB more."""
    pa.default_memory_pool().release_unused()
