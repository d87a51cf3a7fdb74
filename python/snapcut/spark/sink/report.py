"""What the sink did with one batch: :class:`BatchReport` (``sink.reports``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BatchReport"]


@dataclass
class BatchReport:
    """What the sink did with one batch (``sink.reports``)."""

    batch_id: int
    committed: bool
    """False: the batch was already committed and skipped (a re-delivery)."""
    rows: int = 0
    files: int = 0
    bytes: int = 0
    stage_ms: float = 0.0
    state_wait_ms: float = 0.0
    commit_ms: float = 0.0
    total_ms: float = 0.0
    table_version: int | None = None
    """A table output's commit holding the batch: Delta's table version,
    Iceberg's snapshot id."""
