"""State files mapped by the Rust store for pyarrow to read (issue 37).

A ``pyarrow.memory_map`` keeps every page a pass reads (a restore's checksum,
a batch's lookups) in the process's resident set for as long as the file is
mapped. A file mapped by :class:`snapcut._core.format.MappedFile` reads the
same, without a copy, and can let its pages go: after the checksum, and, once a
table restored from it holds its pages, whenever the table's lookups have read
more of them than its ``mapped_memory`` (``StateTable.release_pages``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import pyarrow as pa

from snapcut._core import format as fmt


class MappedRead(NamedTuple):
    """A file's bytes and, if it is mapped, its pages."""

    buffer: pa.Buffer
    pages: fmt.MappedFile | None


def map_file(path: str) -> MappedRead:
    """`path` mapped read-only, whole (a file no one writes again); a missing
    file raises ``FileNotFoundError``."""
    pages = fmt.MappedFile(path)
    return MappedRead(pa.foreign_buffer(pages.address, pages.size, base=pages), pages)


def checked(read: MappedRead, check: Callable[[memoryview], object]) -> MappedRead:
    """`read` after `check` (a callable taking its bytes as a memoryview) passed:
    its pages released either way, since the check read every one."""
    try:
        check(memoryview(read.buffer).cast("B"))
    finally:
        if read.pages is not None:
            read.pages.release()
    return read
