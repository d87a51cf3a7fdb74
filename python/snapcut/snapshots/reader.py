"""Reading a snapshot root: its checkpoints, their state, channels and
source offsets, verification, and the fallback to the newest intact one."""

from __future__ import annotations

import builtins
import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from snapcut import _fs
from snapcut._core import SnapshotError
from snapcut.snapshots.backend import Backend, FsBackend, RustBackend
from snapcut.snapshots.layout import Channel, Task


class Checkpoint:
    """One complete checkpoint of a snapshot root."""

    def __init__(self, backend: Backend, manifest: dict[str, Any]) -> None:
        self._backend = backend
        self.manifest = manifest

    @property
    def id(self) -> int:
        return int(self.manifest["checkpoint_id"])

    @property
    def meta(self) -> dict[str, Any]:
        """Format version, protocol, timestamps, graph fingerprint, savepoint flag."""
        keys = (
            "format_version",
            "checkpoint_id",
            "protocol",
            "started_ms",
            "finished_ms",
            "committed_ms",
            "graph_fingerprint",
            "savepoint",
        )
        return {k: self.manifest[k] for k in keys}

    @property
    def protocol(self) -> str:
        return str(self.manifest["protocol"])

    @property
    def savepoint(self) -> bool:
        return bool(self.manifest["savepoint"])

    @property
    def tasks(self) -> list[Task]:
        return [(t["vertex"], t["subtask"]) for t in self.manifest["tasks"]]

    @property
    def files(self) -> list[dict[str, Any]]:
        return list(self.manifest["files"])

    def state(self, vertex: str, subtask: int = 0) -> pa.Table | None:
        """Full state of a task here (rebuilt from full + diffs), None if stateless."""
        return self._backend.state(self.id, (vertex, subtask))

    def states(self) -> dict[Task, pa.Table]:
        out = {}
        for task in self.tasks:
            table = self.state(*task)
            if table is not None:
                out[task] = table
        return out

    def channels(self, vertex: str, subtask: int = 0) -> list[Channel]:
        return self._backend.channels(self.id, (vertex, subtask))

    def source_offsets(self) -> dict[Task, int]:
        return {
            (t["vertex"], t["subtask"]): int(t["source_offset"])
            for t in self.manifest["tasks"]
            if t.get("source_offset") is not None
        }

    def verify(self) -> None:
        """Raises SnapshotError unless every file (and base) is intact."""
        self._backend.verify(self.id)

    def __repr__(self) -> str:
        return f"Checkpoint(id={self.id}, protocol={self.protocol!r}, tasks={len(self.tasks)})"


class Snapshots:
    """A snapshot root: its checkpoints, verification, fallback to intact ones."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    @property
    def root(self) -> str:
        return self._backend.root

    def list(self) -> builtins.list[int]:
        """Ids of complete checkpoints (with a manifest), oldest first."""
        return self._backend.complete()

    def partial(self) -> builtins.list[int]:
        """Ids of checkpoint directories without a manifest nor a held record
        (never restorable)."""
        return self._backend.partial()

    def held(self) -> builtins.list[int]:
        """Ids of held directories: checkpoints retention removed whose runs
        newer checkpoints read (not restorable; docs/format.md, Retention)."""
        return self._backend.held()

    def __getitem__(self, checkpoint_id: int) -> Checkpoint:
        return Checkpoint(self._backend, self._backend.manifest(checkpoint_id))

    def __iter__(self) -> Iterator[Checkpoint]:
        return (self[c] for c in self.list())

    def __len__(self) -> int:
        return len(self.list())

    def latest(self) -> Checkpoint:
        ids = self.list()
        if not ids:
            raise SnapshotError(f"no complete checkpoint under {self.root}")
        return self[ids[-1]]

    def verify(self) -> dict[int, str | None]:
        """Every checkpoint directory → None if intact, else why not."""
        every = sorted(set(self.list()) | set(self.partial()))
        out: dict[int, str | None] = {}
        for c in every:
            try:
                self._backend.verify(c)
                out[c] = None
            except SnapshotError as e:
                out[c] = str(e)
        return out

    def latest_intact(self) -> tuple[Checkpoint, builtins.list[tuple[int, str]]]:
        """The newest checkpoint that verifies, and the newer ones skipped (id, why)."""
        skipped: builtins.list[tuple[int, str]] = []
        for c in sorted(set(self.list()) | set(self.partial()), reverse=True):
            try:
                return Checkpoint(self._backend, self._backend.verify(c)), skipped
            except SnapshotError as e:
                skipped.append((c, str(e)))
        why = "; ".join(f"{c}: {r}" for c, r in skipped)
        raise SnapshotError(
            f"no intact checkpoint under {self.root}" + (f" (skipped {why})" if why else "")
        )

    def __repr__(self) -> str:
        return f"Snapshots({self.root!r})"


def open(root: str | os.PathLike[str], filesystem: Any = None) -> Snapshots:
    """Opens a snapshot root: a local path, a pyarrow.fs URI, or a path in `filesystem`."""
    if filesystem is None and not _fs.is_uri(root):
        return Snapshots(RustBackend(os.fspath(root)))
    fs, path = _fs.resolve(root, filesystem)
    return Snapshots(FsBackend(fs, path))
