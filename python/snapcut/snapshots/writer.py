"""Writing the snapshot format from Python over any pyarrow filesystem (e.g.
from Spark workers: files per partition, then one manifest from the driver).
Python moves the bytes; the Rust format rules (``snapcut._core.format``)
encode the files, build the manifest and pick what retention deletes."""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from snapcut import _fs
from snapcut._core import ConfigError, SnapshotError, StateRuns, StorageError
from snapcut._core import format as fmt
from snapcut.snapshots.backend import FsBackend
from snapcut.snapshots.layout import (
    HELD_FILE,
    HELD_TMP_FILE,
    MANIFEST_FILE,
    MANIFEST_TMP_FILE,
    SOURCES_FILE,
    TIME_METADATA,
    Task,
    checkpoint_dir_name,
)
from snapcut.snapshots.run_cache import RunCache, RunCacheSpec, shared


def encode_ipc(table: pa.Table, what: str) -> tuple[bytes, int, int]:
    """One Arrow IPC file's bytes, its row count and crc32c, encoded by the
    format's writer (``what`` names the file in errors). For writers that
    stage files themselves and name them in a manifest later (the sink)."""
    return fmt.encode_ipc(table, what)


def file_entry(
    path: str, role: str, rows: int, size: int, crc32c: int, fields: dict[str, Any]
) -> dict[str, Any]:
    """The manifest entry of a file written elsewhere (shape from the format;
    ``fields`` are the writer's own additions)."""
    return fmt.file_entry(path, role, rows, size, crc32c, fields)


def _sidecars(entry: dict[str, Any]) -> list[str]:
    """The files a state file's entry names beside it: a diff's bloom filter
    (format 3), a full's time index (format 5)."""
    return [entry[side]["path"] for side in ("filter", "times") if side in entry]


def _indexed_full(table: pa.Table | pa.RecordBatch | StateRuns, kind: str) -> bool:
    """A full of a table with a time index (its schema names the time
    column): written through a file, so the index is read back from it."""
    if kind != "full" or isinstance(table, StateRuns):
        return False
    return TIME_METADATA.encode() in (table.schema.metadata or {})


class SnapshotWriter:
    """Writes the snapshot format from Python over any pyarrow filesystem.

    Files can be written from many processes (each ``write_*`` returns the
    manifest entry of its file); one process then calls :meth:`commit` with
    every entry. Rewriting a file with the same content is idempotent.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        filesystem: Any = None,
        direct_io: bool = False,
        run_cache: RunCacheSpec | None = None,
    ) -> None:
        """`run_cache`: a remote root's state files are also kept in this
        run cache as they are written (the bytes are at hand), so this
        machine's next read of them (a cold task, a merge) fetches nothing."""
        self.fs, self.root = _fs.resolve(root, filesystem)
        if not isinstance(direct_io, bool):
            raise ConfigError(f"direct_io must be a bool, got {direct_io!r}")
        self.direct_io = direct_io
        self._run_cache = run_cache

    def _dir(self, checkpoint_id: int) -> str:
        return f"{self.root}/{checkpoint_dir_name(checkpoint_id)}"

    def _put(self, checkpoint_id: int, name: str, data: bytes | pa.Buffer) -> None:
        path = f"{self._dir(checkpoint_id)}/{name}"
        # Atomic with a temp name of its own: an idempotent rewrite (a Spark
        # task retry) never shows a reader a truncated file.
        _fs.write_atomic(self.fs, path, f"{path}.{os.getpid()}.{uuid.uuid4().hex}.tmp", data)

    def _write(
        self, checkpoint_id: int, name: str, table: pa.Table, role: str = "output"
    ) -> dict[str, Any]:
        """Writes a file of a role the format leaves to its writer (e.g. the
        Spark sink's "output"); returns its entry."""
        data, entry = fmt.encode_file(table, name, role)
        self._put(checkpoint_id, name, data)
        return entry

    def write_state(
        self,
        checkpoint_id: int,
        vertex: str,
        subtask: int,
        table: pa.Table | pa.RecordBatch | StateRuns,
        key: str,
        kind: str = "full",
        base: int | None = None,
        sort: bool = False,
        base_chain: Sequence[int] | None = None,
        base_runs: Sequence[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Writes a task's state: "full", or "diff" against `base` (needs
        `__deleted`); `sort` orders the rows by `key` first. `table` may be
        the `StateRuns` of `StateTable.checkpoint_streamed` (sorted: merged
        as the file is written). A writer that
        keeps the chain of the state it diffs against passes it as
        `base_chain`: the entry then carries its own chain (and a diff's
        base is that chain's last); else :meth:`commit` resolves it. A
        writer that keeps the runs of that state (format 2, newest first;
        empty under a full) passes them as `base_runs` instead: the entry
        then lists its runs (itself, then, for a diff, the base's) and
        their chain, and a diff's base is the state the newest is at."""
        chain_at = None if base_chain is None else (checkpoint_id, list(base_chain))
        runs_at = None if base_runs is None else (checkpoint_id, list(base_runs))
        local_dir = _fs.local_path(self.fs, self._dir(checkpoint_id))
        if local_dir is None and (isinstance(table, StateRuns) or _indexed_full(table, kind)):
            return self._upload_state_file(
                checkpoint_id, vertex, subtask, table, key, kind, base, sort, chain_at, runs_at
            )
        if local_dir is None:
            data, entry, bloom = fmt.encode_state(
                vertex, subtask, table, key, kind, base, sort, chain_at, runs_at
            )
            # A diff's filter first: the state file in place names it.
            if bloom is not None:
                self._put(checkpoint_id, entry["filter"]["path"], bloom)
            self._put(checkpoint_id, entry["path"], data)
            cache = self._cache()
            if cache is not None:
                with contextlib.suppress(StorageError):  # a cache that is full: read later
                    cache.put_bytes(f"{self._dir(checkpoint_id)}/{entry['path']}", entry, data)
            return entry
        # A local root's file is encoded straight into its temp file (its bytes
        # are never held whole), then renamed into place as _put would.
        suffix = f".{os.getpid()}.{uuid.uuid4().hex}.tmp"
        try:
            os.makedirs(local_dir, exist_ok=True)
        except OSError as e:
            raise _fs.storage_error(e, self.fs, f"creating {local_dir}", local_dir) from e
        entry = fmt.write_state_file(
            local_dir,
            suffix,
            vertex,
            subtask,
            table,
            key,
            kind,
            base,
            sort,
            chain_at,
            direct_io=self.direct_io,
            runs_at=runs_at,
        )
        for name in [*_sidecars(entry), entry["path"]]:
            local = os.path.join(local_dir, name)
            _fs.publish_local(local + suffix, local, f"{self._dir(checkpoint_id)}/{name}")
        return entry

    def _upload_state_file(
        self,
        checkpoint_id: int,
        vertex: str,
        subtask: int,
        table: pa.Table | pa.RecordBatch | StateRuns,
        key: str,
        kind: str,
        base: int | None,
        sort: bool,
        chain_at: tuple[int, list[int]] | None,
        runs_at: tuple[int, list[dict[str, Any]]] | None,
    ) -> dict[str, Any]:
        """A state file for a remote root written into a local temporary
        file (a capture's runs merged as it is written; a full's time index
        read back from it), then uploaded from it a part at a time, what is
        stored beside it first (a state file in place names it)."""
        with tempfile.TemporaryDirectory(prefix="snapcut-state-") as tmp:
            entry = fmt.write_state_file(
                tmp, "", vertex, subtask, table, key, kind, base, sort, chain_at, runs_at=runs_at
            )
            for name in [*_sidecars(entry), entry["path"]]:
                path = f"{self._dir(checkpoint_id)}/{name}"
                _fs.upload(self.fs, os.path.join(tmp, name), path)
            cache = self._cache()
            if cache is not None:
                with contextlib.suppress(StorageError):  # a cache that is full: read later
                    cache.put(path, entry, os.path.join(tmp, entry["path"]))
        return entry

    def _cache(self) -> RunCache | None:
        """The run cache state files are kept in as written (best effort:
        None where the spec turns it off)."""
        if self._run_cache is None:
            return None
        return shared(self._run_cache)

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
        data, entry = fmt.encode_channel(vertex, subtask, edge, from_subtask, input, records)
        self._put(checkpoint_id, entry["path"], data)
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
        backend = FsBackend(self.fs, self.root, check=False)
        offsets = dict(source_offsets or {})
        sources, manifest = fmt.build_manifest(
            checkpoint_id,
            list(files),
            backend.manifest_bytes,
            list(tasks),
            [(v, s, o) for (v, s), o in offsets.items()],
            protocol,
            graph_fingerprint,
            savepoint,
            started_ms,
            finished_ms,
            int(time.time() * 1000),
            extra or {},
        )
        self._put(checkpoint_id, SOURCES_FILE, sources)
        tmp = (
            f"{MANIFEST_TMP_FILE}.{os.getpid()}.{uuid.uuid4().hex}"
            if replace
            else MANIFEST_TMP_FILE
        )
        _fs.write_atomic(self.fs, f"{d}/{MANIFEST_FILE}", f"{d}/{tmp}", manifest)
        written: dict[str, Any] = json.loads(manifest)
        return written

    def apply_retention(self, retain: int, dry_run: bool = False) -> builtins.list[int]:
        """Applies the Rust store's rule, ``format::retention``: keeps the
        newest `retain` completed checkpoints, savepoints, the base of each
        checkpoint in progress (a directory without a manifest: the newest
        complete one before it) and, to a fixpoint, every checkpoint a kept
        one's chain reads link by link; holds the directories of the others
        whose runs a kept checkpoint reads (a held record replaces the
        manifest, only those files stay) and deletes the rest. Returns the
        completed checkpoints removed or held (with `dry_run`, those it
        would, changing nothing)."""
        plan = self.retention_plan(retain)
        removed: builtins.list[int] = plan["removed"]
        if dry_run:
            return removed
        for cid, hold in plan["hold"].items():
            self._hold(cid, hold["files"], hold["read_by"], hold["demote"])
        for cid in plan["remove"]:
            # Manifest first: an interrupted removal leaves a partial directory.
            self.fs.delete_file(f"{self._dir(cid)}/{MANIFEST_FILE}")
            self.fs.delete_dir(self._dir(cid))
        for cid in plan["release"]:
            # Record first: what an interruption leaves is partial.
            self.fs.delete_file(f"{self._dir(cid)}/{HELD_FILE}")
            self.fs.delete_dir(self._dir(cid))
        return removed

    def retention_plan(self, retain: int) -> dict[str, Any]:
        """What :meth:`apply_retention` would do, changing nothing:
        ``fmt.retention``'s plan (``remove``, ``release``, ``hold``,
        ``removed``; docs/format.md, Retention)."""
        backend = FsBackend(self.fs, self.root)
        return fmt.retention(backend.listing(), backend.manifest_bytes, retain)

    def _hold(
        self, cid: int, files: builtins.list[str], read_by: builtins.list[int], demote: bool
    ) -> None:
        """Makes checkpoint `cid`'s directory hold `files` only: its held
        record written first (a crash leaves it complete or held, never
        partial), then its manifest (`demote`) and every other file deleted."""
        from pyarrow.fs import FileSelector, FileType

        d = self._dir(cid)
        record = fmt.held_record(cid, files, read_by)
        _fs.write_atomic(self.fs, f"{d}/{HELD_FILE}", f"{d}/{HELD_TMP_FILE}", record)
        if demote:
            self.fs.delete_file(f"{d}/{MANIFEST_FILE}")
        keep = {*files, HELD_FILE}
        for info in self.fs.get_file_info(FileSelector(d)):
            if info.type == FileType.File and info.base_name not in keep:
                self.fs.delete_file(info.path)

    def cleanup_partial(self, below: int) -> builtins.list[int]:
        """Deletes checkpoint directories without a manifest whose id is below
        `below` (abandoned attempts). Returns their ids."""
        backend = FsBackend(self.fs, self.root)
        removed = [c for c in backend.partial() if c < below]
        for cid in removed:
            self.fs.delete_dir(self._dir(cid))
        return removed
