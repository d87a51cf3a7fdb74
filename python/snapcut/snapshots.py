"""Reading (and writing) snapcut snapshots: Arrow IPC files plus a manifest.

    >>> snaps = snapcut.snapshots.open("/tmp/ckpt")        # local: the Rust store
    >>> snaps = snapcut.snapshots.open("s3://bucket/ckpt")  # any pyarrow.fs URI
    >>> chk = snaps.latest()
    >>> chk.state("agg", 0)            # full state, rebuilt from full + diffs
    >>> chk.channels("agg", 0), chk.source_offsets(), chk.meta
    >>> snaps.verify()                 # {id: None | "why it is broken"}

Local paths go through the Rust reader; URIs (and explicit pyarrow
filesystems) through the pure-Python reader below, on the same format and
the same manifest constants (``snapcut._core.SNAPSHOT_FORMAT``).
:class:`SnapshotWriter` writes that format from Python (e.g. from Spark
workers: files per partition, then one manifest from the driver).
"""

from __future__ import annotations

import builtins
import json
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from snapcut import _fs
from snapcut._core import SNAPSHOT_FORMAT, SnapshotError, SnapshotReader, crc32c

FORMAT_NAME: str = SNAPSHOT_FORMAT["FORMAT_NAME"]
FORMAT_VERSION: int = SNAPSHOT_FORMAT["FORMAT_VERSION"]
MANIFEST_FILE: str = SNAPSHOT_FORMAT["MANIFEST_FILE"]
MANIFEST_TMP_FILE: str = SNAPSHOT_FORMAT["MANIFEST_TMP_FILE"]
SOURCES_FILE: str = SNAPSHOT_FORMAT["SOURCES_FILE"]
CHECKPOINT_DIR_PREFIX: str = SNAPSHOT_FORMAT["CHECKPOINT_DIR_PREFIX"]
DELETED_COLUMN: str = SNAPSHOT_FORMAT["DELETED_COLUMN"]
KEY_METADATA: str = SNAPSHOT_FORMAT["KEY_METADATA"]

SOURCES_SCHEMA = pa.schema(
    [
        pa.field("vertex", pa.string(), nullable=False),
        pa.field("subtask", pa.uint64(), nullable=False),
        pa.field("offset", pa.uint64(), nullable=False),
    ]
)

Task = tuple[str, int]

__all__ = [
    "Channel",
    "Checkpoint",
    "CheckpointCheck",
    "CheckpointInfo",
    "CheckpointRow",
    "ExportResult",
    "ExportedTable",
    "FileCheck",
    "PruneResult",
    "SnapshotWriter",
    "Snapshots",
    "TaskDiff",
    "TaskInfo",
    "checkpoint_dir_name",
    "diff_checkpoints",
    "export_checkpoint",
    "list_checkpoints",
    "open",
    "prune",
    "show_checkpoint",
    "verify_checkpoints",
]


def checkpoint_dir_name(checkpoint_id: int) -> str:
    return f"{CHECKPOINT_DIR_PREFIX}{checkpoint_id:08d}"


def _parse_dir(name: str) -> int | None:
    digits = name.removeprefix(CHECKPOINT_DIR_PREFIX)
    if digits == name or len(digits) < 8 or not digits.isdigit():
        return None
    return int(digits)


def file_component(name: str) -> str:
    """Same escaping as the Rust store: keep [A-Za-z0-9_-], %XX the rest."""
    out = []
    for b in name.encode():
        c = chr(b)
        out.append(c if (c.isascii() and (c.isalnum() or c in "_-")) else f"%{b:02X}")
    return "".join(out)


def _parse_manifest(data: bytes, what: str) -> dict[str, Any]:
    try:
        manifest = json.loads(data)
    except ValueError as e:
        raise SnapshotError(f"{what} is not valid JSON: {e}") from e
    if not isinstance(manifest, dict) or "format_version" not in manifest:
        raise SnapshotError(f"{what} has no format_version: not a snapcut manifest")
    version = manifest["format_version"]
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise SnapshotError(
            f"{what} has format_version {version}, newer than the {FORMAT_VERSION} this "
            "snapcut reads: upgrade snapcut to read it"
        )
    if manifest.get("format") != FORMAT_NAME:
        raise SnapshotError(
            f"{what} has format {manifest.get('format')!r}, expected {FORMAT_NAME!r}"
        )
    return manifest


def _state_entry(manifest: dict[str, Any], task: Task) -> dict[str, Any] | None:
    for f in manifest["files"]:
        if f["role"] == "state" and (f.get("vertex"), f.get("subtask")) == task:
            return dict(f)
    return None


def _needs(manifest: dict[str, Any]) -> list[int]:
    ids = {manifest["checkpoint_id"]}
    for f in manifest["files"]:
        ids.update(f.get("chain", []))
    return sorted(ids)


def _read_ipc(data: bytes) -> pa.Table:
    return ipc.open_file(pa.BufferReader(data)).read_all()


def rebuild_state(chain: Sequence[tuple[str, pa.Table]]) -> pa.Table:
    """Full state from a chain of ``(kind, table)``: one "full", then "diff"s.

    A diff's rows replace the rows of their keys; rows with ``__deleted``
    true remove them.
    """
    if not chain or chain[0][0] != "full":
        raise SnapshotError("a state chain must start with a full state file")
    state: pa.Table = chain[0][1]
    if len(chain) == 1:
        # A lone full state is the state itself, whatever its layout.
        return state
    key = (state.schema.metadata or {}).get(KEY_METADATA.encode(), b"").decode()
    if not key:
        raise SnapshotError(f"state file has no {KEY_METADATA!r} metadata naming its key")
    for kind, diff in chain[1:]:
        if kind != "diff":
            raise SnapshotError(f"state chain continues with a {kind!r} file, expected a diff")
        keep = pc.invert(pc.is_in(state[key], value_set=diff[key].combine_chunks()))
        state = state.filter(keep)
        deleted = pc.fill_null(diff[DELETED_COLUMN], False)
        upserts = diff.filter(pc.invert(deleted)).drop_columns([DELETED_COLUMN])
        upserts = pa.Table.from_arrays(upserts.columns, schema=state.schema)
        state = pa.concat_tables([state, upserts])
    return state


@dataclass(frozen=True)
class Channel:
    """Records a task recorded in flight on one input channel."""

    input: int
    edge: str
    from_subtask: int
    records: pa.Table


class _Backend:
    """What a snapshot root must answer; one implementation per storage path."""

    root: str

    def complete(self) -> builtins.list[int]:
        raise NotImplementedError

    def partial(self) -> builtins.list[int]:
        raise NotImplementedError

    def manifest(self, checkpoint_id: int) -> dict[str, Any]:
        raise NotImplementedError

    def verify(self, checkpoint_id: int) -> dict[str, Any]:
        raise NotImplementedError

    def state(self, checkpoint_id: int, task: Task) -> pa.Table | None:
        raise NotImplementedError

    def channels(self, checkpoint_id: int, task: Task) -> builtins.list[Channel]:
        raise NotImplementedError


class _RustBackend(_Backend):
    def __init__(self, root: str) -> None:
        self.root = root
        self._reader = SnapshotReader(root)

    def complete(self) -> builtins.list[int]:
        return self._reader.list()

    def partial(self) -> builtins.list[int]:
        return self._reader.partial()

    def manifest(self, checkpoint_id: int) -> dict[str, Any]:
        return dict(json.loads(self._reader.manifest(checkpoint_id)))

    def verify(self, checkpoint_id: int) -> dict[str, Any]:
        return dict(json.loads(self._reader.verify(checkpoint_id)))

    def state(self, checkpoint_id: int, task: Task) -> pa.Table | None:
        return self._reader.state(checkpoint_id, task[0], task[1])

    def channels(self, checkpoint_id: int, task: Task) -> builtins.list[Channel]:
        return [Channel(*c) for c in self._reader.channels(checkpoint_id, task[0], task[1])]


class _FsBackend(_Backend):
    """The same reader over any pyarrow filesystem."""

    def __init__(self, fs: Any, root: str) -> None:
        self.fs = fs
        self.root = root
        if not _fs.exists(fs, root):
            _fs.check_bucket(fs, root, f"opening snapshot root {root}")
            raise SnapshotError(f"snapshot root {root} does not exist")

    def _dir(self, checkpoint_id: int) -> str:
        return f"{self.root}/{checkpoint_dir_name(checkpoint_id)}"

    def _scan(self) -> dict[int, bool]:
        from pyarrow.fs import FileSelector, FileType

        out: dict[int, bool] = {}
        for info in self.fs.get_file_info(FileSelector(self.root)):
            cid = _parse_dir(info.base_name)
            if cid is not None and info.type == FileType.Directory:
                out[cid] = _fs.exists(self.fs, f"{info.path}/{MANIFEST_FILE}")
        return out

    def complete(self) -> builtins.list[int]:
        return sorted(c for c, complete in self._scan().items() if complete)

    def partial(self) -> builtins.list[int]:
        return sorted(c for c, complete in self._scan().items() if not complete)

    def manifest(self, checkpoint_id: int) -> dict[str, Any]:
        d = self._dir(checkpoint_id)
        path = f"{d}/{MANIFEST_FILE}"
        if not _fs.exists(self.fs, path):
            if _fs.exists(self.fs, d):
                raise SnapshotError(
                    f"checkpoint {checkpoint_id} has no {MANIFEST_FILE} in {d}: it is partial "
                    "(crashed or aborted before commit) and cannot be restored"
                )
            raise SnapshotError(f"checkpoint {checkpoint_id} does not exist under {self.root}")
        m = _parse_manifest(_fs.read_bytes(self.fs, path), f"manifest {path}")
        if m["checkpoint_id"] != checkpoint_id:
            raise SnapshotError(
                f"manifest {path} names checkpoint {m['checkpoint_id']}, expected {checkpoint_id}"
            )
        return m

    def read_checked(self, checkpoint_id: int, entry: dict[str, Any]) -> bytes:
        path = f"{self._dir(checkpoint_id)}/{entry['path']}"
        if not _fs.exists(self.fs, path):
            raise SnapshotError(
                f"checkpoint {checkpoint_id}: file {path} listed in the manifest is missing"
            )
        data = _fs.read_bytes(self.fs, path)
        if len(data) != entry["bytes"]:
            raise SnapshotError(
                f"checkpoint {checkpoint_id}: file {path} is {len(data)} bytes, the manifest "
                f"says {entry['bytes']}: truncated or overwritten"
            )
        crc = crc32c(data)
        if crc != entry["crc32c"]:
            raise SnapshotError(
                f"checkpoint {checkpoint_id}: file {path} fails its checksum (crc32c "
                f"{crc:#010x}, manifest says {entry['crc32c']:#010x}): corrupt"
            )
        return data

    def verify(self, checkpoint_id: int) -> dict[str, Any]:
        manifest = self.manifest(checkpoint_id)
        for needed in _needs(manifest):
            try:
                m = manifest if needed == checkpoint_id else self.manifest(needed)
                for f in m["files"]:
                    if needed == checkpoint_id or f["role"] == "state":
                        self.read_checked(needed, f)
            except SnapshotError as e:
                if needed == checkpoint_id:
                    raise
                raise SnapshotError(
                    f"checkpoint {checkpoint_id} needs base checkpoint {needed}: {e}"
                ) from e
        return manifest

    def state(self, checkpoint_id: int, task: Task) -> pa.Table | None:
        manifest = self.manifest(checkpoint_id)
        entry = _state_entry(manifest, task)
        if entry is None:
            return None
        chain: list[tuple[str, pa.Table]] = []
        for cid in entry.get("chain") or [checkpoint_id]:
            m = manifest if cid == checkpoint_id else self.manifest(cid)
            f = _state_entry(m, task)
            if f is None:
                raise SnapshotError(
                    f"checkpoint {checkpoint_id}: state of {task[0]}-{task[1]} needs checkpoint "
                    f"{cid}, which has no state file for it"
                )
            chain.append((f.get("kind", "full"), _read_ipc(self.read_checked(cid, f))))
        return rebuild_state(chain)

    def channels(self, checkpoint_id: int, task: Task) -> builtins.list[Channel]:
        manifest = self.manifest(checkpoint_id)
        out = []
        for f in manifest["files"]:
            if f["role"] == "channel" and (f.get("vertex"), f.get("subtask")) == task:
                records = _read_ipc(self.read_checked(checkpoint_id, f))
                edge = f.get("edge", "")
                out.append(Channel(f.get("input", 0), edge, f["from_subtask"], records))
        return out


class Checkpoint:
    """One complete checkpoint of a snapshot root."""

    def __init__(self, backend: _Backend, manifest: dict[str, Any]) -> None:
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

    def __init__(self, backend: _Backend) -> None:
        self._backend = backend

    @property
    def root(self) -> str:
        return self._backend.root

    def list(self) -> builtins.list[int]:
        """Ids of complete checkpoints (with a manifest), oldest first."""
        return self._backend.complete()

    def partial(self) -> builtins.list[int]:
        """Ids of checkpoint directories without a manifest (never restorable)."""
        return self._backend.partial()

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
        return Snapshots(_RustBackend(os.fspath(root)))
    fs, path = _fs.resolve(root, filesystem)
    return Snapshots(_FsBackend(fs, path))


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
            base = _FsBackend(self.fs, self.root).manifest(f["base"])
            base_entry = _state_entry(base, (f["vertex"], f["subtask"]))
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
        backend = _FsBackend(self.fs, self.root)
        manifests = {}
        for cid in backend.complete():
            try:
                manifests[cid] = backend.manifest(cid)
            except SnapshotError:
                continue  # unreadable: never a base, left for inspection
        regular = [c for c, m in manifests.items() if not m["savepoint"]]
        keep = set(sorted(regular)[-retain:])
        keep |= {c for c, m in manifests.items() if m["savepoint"]}
        keep |= {n for c in list(keep) for n in _needs(manifests[c])}
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
        backend = _FsBackend(self.fs, self.root)
        removed = [c for c in backend.partial() if c < below]
        for cid in removed:
            self.fs.delete_dir(self._dir(cid))
        return removed


# The operations behind `snapcut snapshots list|show|verify|diff|export|prune`
# live in their own modules, over the readers above; they are this module's API.
from snapcut.snapshot_ops import (  # noqa: E402
    CheckpointCheck,
    CheckpointInfo,
    CheckpointRow,
    FileCheck,
    PruneResult,
    TaskInfo,
    list_checkpoints,
    prune,
    show_checkpoint,
    verify_checkpoints,
)
from snapcut.snapshot_tables import (  # noqa: E402
    ExportedTable,
    ExportResult,
    TaskDiff,
    diff_checkpoints,
    export_checkpoint,
)
