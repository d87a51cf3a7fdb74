"""Writing the snapshot format from Python over any pyarrow filesystem (e.g.
from Spark workers: files per partition, then one manifest from the driver)."""

from __future__ import annotations

import builtins
import json
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from snapcut import _fs
from snapcut._core import SnapshotError, crc32c
from snapcut.snapshots.backend import FsBackend
from snapcut.snapshots.layout import (
    DELETED_COLUMN,
    FORMAT_NAME,
    FORMAT_VERSION,
    KEY_METADATA,
    MANIFEST_FILE,
    MANIFEST_TMP_FILE,
    SOURCES_FILE,
    SOURCES_SCHEMA,
    Task,
    checkpoint_dir_name,
    file_component,
    needs,
    state_entry,
)


class SnapshotWriter:
    """Writes the snapshot format from Python over any pyarrow filesystem.

    Files can be written from many processes (each ``write_*`` returns the
    manifest entry of its file); one process then calls :meth:`commit` with
    every entry. Rewriting a file with the same content is idempotent.
    """

    def __init__(self, root: str | os.PathLike[str], filesystem: Any = None) -> None:
        self.fs, self.root = _fs.resolve(root, filesystem)

    def _dir(self, checkpoint_id: int) -> str:
        return f"{self.root}/{checkpoint_dir_name(checkpoint_id)}"

    def _write(self, checkpoint_id: int, name: str, table: pa.Table) -> dict[str, Any]:
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        data = sink.getvalue().to_pybytes()
        path = f"{self._dir(checkpoint_id)}/{name}"
        # Atomic with a temp name of its own: an idempotent rewrite (a Spark
        # task retry) never shows a reader a truncated file.
        _fs.write_atomic(self.fs, path, f"{path}.{os.getpid()}.{uuid.uuid4().hex}.tmp", data)
        return {"path": name, "rows": table.num_rows, "bytes": len(data), "crc32c": crc32c(data)}

    def write_state(
        self,
        checkpoint_id: int,
        vertex: str,
        subtask: int,
        table: pa.Table | pa.RecordBatch,
        key: str,
        kind: str = "full",
        base: int | None = None,
    ) -> dict[str, Any]:
        """Writes a task's state: "full", or "diff" against `base` (needs `__deleted`)."""
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if key not in table.column_names:
            raise SnapshotError(f"state table has no key column {key!r}")
        if kind == "diff" and (base is None or DELETED_COLUMN not in table.column_names):
            raise SnapshotError(f"a diff needs a base id and a boolean {DELETED_COLUMN!r} column")
        if kind not in ("full", "diff"):
            raise SnapshotError(f"state kind must be 'full' or 'diff', got {kind!r}")
        metadata = dict(table.schema.metadata or {})
        metadata[KEY_METADATA.encode()] = key.encode()
        table = table.replace_schema_metadata(metadata)
        name = f"{file_component(vertex)}-{subtask}.state.arrow"
        entry = self._write(checkpoint_id, name, table)
        entry.update(role="state", vertex=vertex, subtask=subtask, kind=kind, key=key)
        if kind == "diff":
            entry["base"] = base
        return entry

    def write_channel(
        self,
        checkpoint_id: int,
        vertex: str,
        subtask: int,
        edge: str,
        from_subtask: int,
        records: pa.Table,
        input: int = 0,
    ) -> dict[str, Any]:
        task = f"{file_component(vertex)}-{subtask}"
        name = f"{task}.channel-{file_component(edge)}.{from_subtask}.arrow"
        entry = self._write(checkpoint_id, name, records)
        entry.update(
            role="channel",
            vertex=vertex,
            subtask=subtask,
            edge=edge,
            input=input,
            from_subtask=from_subtask,
        )
        return entry

    def commit(
        self,
        checkpoint_id: int,
        files: Sequence[dict[str, Any]],
        tasks: Sequence[Task] = (),
        source_offsets: dict[Task, int] | None = None,
        protocol: str = "aligned",
        graph_fingerprint: str = "",
        savepoint: bool = False,
        started_ms: int = 0,
        finished_ms: int = 0,
        extra: dict[str, Any] | None = None,
        replace: bool = False,
    ) -> dict[str, Any]:
        """Writes sources.arrow and then, atomically, the manifest. Returns it.

        `extra` adds top-level manifest fields (e.g. an engine's own record).
        `replace` lets several processes commit the same checkpoint (each
        writes the whole manifest under a temp name of its own, then renames):
        for idempotent writers such as Spark tasks. State entries that carry
        their ``chain`` keep it; others get it from their base's manifest.
        Entries of other roles (e.g. a Spark sink's "output") may name no
        vertex; readers skip roles they do not know.
        """
        d = self._dir(checkpoint_id)
        if not replace and _fs.exists(self.fs, f"{d}/{MANIFEST_FILE}"):
            raise SnapshotError(
                f"checkpoint {checkpoint_id} is already committed under {self.root}; "
                "refusing to overwrite it"
            )
        offsets = dict(source_offsets or {})
        entries = [dict(f) for f in files]
        for f in entries:
            if f["role"] != "state" or f.get("chain"):
                continue
            if f["kind"] == "full":
                f["chain"] = [checkpoint_id]
                continue
            base = FsBackend(self.fs, self.root).manifest(f["base"])
            base_entry = state_entry(base, (f["vertex"], f["subtask"]))
            if base_entry is None:
                raise SnapshotError(
                    f"checkpoint {checkpoint_id}: state diff of {f['vertex']}-{f['subtask']} is "
                    f"based on checkpoint {f['base']}, which holds no state for it"
                )
            f["chain"] = [*(base_entry.get("chain") or [f["base"]]), checkpoint_id]
        all_tasks = sorted(
            set(tasks)
            | set(offsets)
            | {(f["vertex"], f["subtask"]) for f in entries if "vertex" in f}
        )
        src = sorted(offsets.items())
        sources = pa.table(
            [
                pa.array([t[0] for t, _ in src], pa.string()),
                pa.array([t[1] for t, _ in src], pa.uint64()),
                pa.array([o for _, o in src], pa.uint64()),
            ],
            schema=SOURCES_SCHEMA,
        )
        sources_entry = self._write(checkpoint_id, SOURCES_FILE, sources)
        sources_entry["role"] = "sources"
        manifest = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "checkpoint_id": checkpoint_id,
            "protocol": protocol,
            "started_ms": started_ms,
            "finished_ms": finished_ms,
            "committed_ms": int(time.time() * 1000),
            "graph_fingerprint": graph_fingerprint,
            "savepoint": savepoint,
            "tasks": [
                {"vertex": v, "subtask": s, "source_offset": offsets.get((v, s))}
                for v, s in all_tasks
            ],
            "files": [*entries, sources_entry],
            **(extra or {}),
        }
        data = json.dumps(manifest, indent=2).encode()
        tmp = (
            f"{MANIFEST_TMP_FILE}.{os.getpid()}.{uuid.uuid4().hex}"
            if replace
            else MANIFEST_TMP_FILE
        )
        _fs.write_atomic(self.fs, f"{d}/{MANIFEST_FILE}", f"{d}/{tmp}", data)
        return manifest

    def apply_retention(self, retain: int, dry_run: bool = False) -> builtins.list[int]:
        """Deletes completed checkpoints beyond the newest `retain`, keeping
        savepoints and every base a kept checkpoint's diff chain needs (the
        same rule as the Rust store). Returns the removed ids (with `dry_run`,
        the ids it would remove, deleting nothing)."""
        if retain < 1:
            raise SnapshotError("retain must be at least 1 completed checkpoint")
        backend = FsBackend(self.fs, self.root)
        manifests = {}
        for cid in backend.complete():
            try:
                manifests[cid] = backend.manifest(cid)
            except SnapshotError:
                continue  # unreadable: never a base, left for inspection
        regular = [c for c, m in manifests.items() if not m["savepoint"]]
        keep = set(sorted(regular)[-retain:])
        keep |= {c for c, m in manifests.items() if m["savepoint"]}
        keep |= {n for c in list(keep) for n in needs(manifests[c])}
        removed = sorted(set(manifests) - keep)
        if dry_run:
            return removed
        for cid in removed:
            # Manifest first: an interrupted removal leaves a partial directory.
            self.fs.delete_file(f"{self._dir(cid)}/{MANIFEST_FILE}")
            self.fs.delete_dir(self._dir(cid))
        return removed

    def cleanup_partial(self, below: int) -> builtins.list[int]:
        """Deletes checkpoint directories without a manifest whose id is below
        `below` (abandoned attempts). Returns their ids."""
        backend = FsBackend(self.fs, self.root)
        removed = [c for c in backend.partial() if c < below]
        for cid in removed:
            self.fs.delete_dir(self._dir(cid))
        return removed
