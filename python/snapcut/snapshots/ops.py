"""Operating a snapshot root: list, show, verify and prune its checkpoints.

The Python API behind ``snapcut snapshots list|show|verify|prune``
(re-exported by :mod:`snapcut.snapshots`; diff and export are in
:mod:`snapcut.snapshots.tables`). Every root, a local path or any pyarrow.fs
URI, is read through the existing reader over ``pyarrow.fs``, which keeps
each manifest as written (a Spark root's ``"spark"`` object, file roles
beyond state/channel/sources) and reads files one by one, so a broken file
can be named. The rules (file checks, verify plans, chains, retention) are
the Rust ones (``snapcut._core.format``); this module moves bytes and
shapes the results. Pruning applies :meth:`SnapshotWriter.apply_retention`.

    >>> rows = snapcut.snapshots.list_checkpoints("/tmp/ckpt")
    >>> info = snapcut.snapshots.show_checkpoint("/tmp/ckpt")      # the latest
    >>> checks = snapcut.snapshots.verify_checkpoints("/tmp/ckpt", "all")
    >>> [c.reasons() for c in checks if not c.ok]
    >>> snapcut.snapshots.prune("/tmp/ckpt", keep=3, dry_run=True).removed
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from snapcut import _fs
from snapcut._core import SnapshotError
from snapcut._core import format as fmt
from snapcut.snapshots.backend import FsBackend
from snapcut.snapshots.layout import MANIFEST_FILE, checkpoint_dir_name
from snapcut.snapshots.writer import SnapshotWriter

Root = str | os.PathLike[str]
Progress = Callable[[int, int], None]
"""Called as ``progress(advance, total)``: first ``(0, total)``, then once per unit done."""

__all__ = [
    "CheckpointCheck",
    "CheckpointInfo",
    "CheckpointRow",
    "FileCheck",
    "Progress",
    "PruneResult",
    "TaskInfo",
    "list_checkpoints",
    "open_root",
    "prune",
    "resolve_id",
    "show_checkpoint",
    "verify_checkpoints",
]


def open_root(root: Root, filesystem: Any = None) -> FsBackend:
    """The reader over pyarrow.fs for `root` (a local path, a URI, or a path in `filesystem`)."""
    fs, path = _fs.resolve(root, filesystem)
    return FsBackend(fs, path)


def resolve_id(backend: FsBackend, checkpoint_id: int | None) -> int:
    """`checkpoint_id`, or the newest complete checkpoint when it is None."""
    if checkpoint_id is not None:
        return checkpoint_id
    ids = backend.complete()
    if not ids:
        raise SnapshotError(f"no complete checkpoint under {backend.root}")
    return ids[-1]


# --- list ---


@dataclass(frozen=True)
class CheckpointRow:
    """One checkpoint directory of a root, as ``snapcut snapshots list`` shows it.

    status: "complete" (has a manifest), "partial" (no manifest: never
    committed, cannot be restored), "held" (retention removed it; the
    directory keeps only runs newer checkpoints read) or "unreadable" (its
    manifest fails to parse). kind: "diff" when a state file here is a diff (restoring reads
    a chain), "full" when every one is full, None without state. records: rows of every
    file but the source offsets (state rows of a diff are its changed keys).
    chain: the longest chain of checkpoints a state file here is rebuilt
    from, oldest (the full) first, ending with this id (for a state listing
    runs, format 2: the checkpoints holding them). runs: the most files a
    task's state here is rebuilt from (its runs, or its chain), 0 without state.
    """

    id: int
    status: str
    committed_ms: int | None = None
    engine: str | None = None
    protocol: str | None = None
    kind: str | None = None
    files: int = 0
    bytes: int = 0
    records: int | None = None
    chain: list[int] = field(default_factory=list)
    runs: int = 0
    savepoint: bool = False
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _row(backend: FsBackend, checkpoint_id: int) -> CheckpointRow:
    summary = fmt.summary(backend.manifest_bytes(checkpoint_id), checkpoint_id)
    return CheckpointRow(status="complete", **summary)


def _dir_files(backend: FsBackend, checkpoint_id: int) -> list[Any]:
    from pyarrow.fs import FileSelector, FileType

    selector = FileSelector(f"{backend.root}/{checkpoint_dir_name(checkpoint_id)}")
    return [i for i in backend.fs.get_file_info(selector) if i.type == FileType.File]


def list_checkpoints(root: Root, filesystem: Any = None) -> list[CheckpointRow]:
    """Every checkpoint directory under `root`, oldest first."""
    backend = open_root(root, filesystem)
    complete, partial, held = backend.scan()
    rows = []
    for cid in sorted({*complete, *partial, *held}):
        if cid in complete:
            try:
                rows.append(_row(backend, cid))
                continue
            except SnapshotError as e:
                status, error = "unreadable", str(e)
        elif cid in held:
            status = "held"
            error = "removed by retention: holds runs newer checkpoints read, cannot be restored"
        else:
            status = "partial"
            error = f"no {MANIFEST_FILE}: never committed, cannot be restored"
        infos = _dir_files(backend, cid)
        rows.append(
            CheckpointRow(
                id=cid,
                status=status,
                files=len(infos),
                bytes=sum(i.size or 0 for i in infos),
                error=error,
            )
        )
    return rows


# --- show ---


@dataclass(frozen=True)
class TaskInfo:
    """What one task (a vertex's subtask, or a Spark state partition) holds."""

    vertex: str
    subtask: int
    source_offset: int | None
    alignment_ms: float | None
    state: dict[str, Any] | None
    channels: list[dict[str, Any]]
    other: list[dict[str, Any]]

    @property
    def label(self) -> str:
        return f"{self.vertex}-{self.subtask}"


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint's manifest in readable form (``snapcut snapshots show``)."""

    summary: CheckpointRow
    manifest: dict[str, Any]
    tasks: list[TaskInfo]
    files: list[dict[str, Any]]
    """Files of no task: source offsets, and e.g. a Spark batch's output files."""

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.summary.to_dict(),
            "format": self.manifest.get("format"),
            "format_version": self.manifest.get("format_version"),
            "started_ms": self.manifest.get("started_ms"),
            "finished_ms": self.manifest.get("finished_ms"),
            "graph_fingerprint": self.manifest.get("graph_fingerprint"),
            "spark": self.manifest.get("spark"),
            "tasks": [asdict(t) for t in self.tasks],
            "files_of_no_task": self.files,
            "manifest": self.manifest,
        }


def show_checkpoint(
    root: Root, checkpoint_id: int | None = None, filesystem: Any = None
) -> CheckpointInfo:
    """The manifest of `checkpoint_id` (default: the newest complete one), per task."""
    backend = open_root(root, filesystem)
    cid = resolve_id(backend, checkpoint_id)
    manifest = backend.manifest(cid)
    entries = {(t["vertex"], int(t["subtask"])): t for t in manifest["tasks"]}
    files: dict[tuple[str, int], list[dict[str, Any]]] = {}
    loose = []
    for f in manifest["files"]:
        if f.get("vertex") is None or f.get("subtask") is None:
            loose.append(f)
        else:
            files.setdefault((f["vertex"], int(f["subtask"])), []).append(f)
    tasks = []
    for vertex, subtask in sorted(entries.keys() | files.keys()):
        entry = entries.get((vertex, subtask), {})
        own = files.get((vertex, subtask), [])
        nanos = entry.get("alignment_nanos")
        tasks.append(
            TaskInfo(
                vertex=vertex,
                subtask=subtask,
                source_offset=entry.get("source_offset"),
                alignment_ms=None if nanos is None else nanos / 1e6,
                state=next((f for f in own if f["role"] == "state"), None),
                channels=[f for f in own if f["role"] == "channel"],
                other=[f for f in own if f["role"] not in ("state", "channel")],
            )
        )
    return CheckpointInfo(_row(backend, cid), manifest, tasks, loose)


# --- verify ---


@dataclass(frozen=True)
class FileCheck:
    """One file checked: size, checksum, and that it opens with its manifest's rows."""

    checkpoint: int
    path: str
    """Relative to the root: ``chk-00000005/agg-0.state.arrow``."""
    role: str
    bytes: int
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


@dataclass(frozen=True)
class CheckpointCheck:
    """Verification of one checkpoint: its own files and the base files its state needs."""

    id: int
    status: str
    files: list[FileCheck]
    problems: list[str] = field(default_factory=list)
    """Structural problems of no single file (e.g. a chain that names a base without state)."""

    @property
    def ok(self) -> bool:
        return not self.problems and all(f.ok for f in self.files)

    def reasons(self) -> list[str]:
        """Every problem, one line each, naming the file."""
        out = list(self.problems)
        for f in self.files:
            if f.problem is None:
                continue
            if f.checkpoint == self.id:
                out.append(f.problem)
            else:
                base = f"checkpoint {self.id} needs base checkpoint {f.checkpoint}"
                out.append(f"{base}: {f.problem}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "reasons": self.reasons()}


class _Verifier:
    """Checks each file once, however many checkpoints' chains name it."""

    def __init__(self, backend: FsBackend, progress: Progress | None) -> None:
        self.backend = backend
        self.progress = progress
        self.total = 0
        self.broken: dict[int, str] = {}
        self.plans: dict[int, tuple[list[tuple[int, dict[str, Any]]], list[str]]] = {}
        # By file and what its entry says of it: two entries naming one file
        # (a checkpoint's own, a newer one's run) may disagree.
        self.done: dict[tuple[int, str, int, int, int], FileCheck] = {}

    def manifest_bytes(self, cid: int) -> bytes:
        if cid in self.broken:
            raise SnapshotError(self.broken[cid])
        try:
            return self.backend.manifest_bytes(cid)
        except SnapshotError as e:
            self.broken[cid] = str(e)
            raise

    def check(self, cid: int, entry: dict[str, Any]) -> FileCheck:
        rel = f"{checkpoint_dir_name(cid)}/{entry['path']}"
        key = (cid, rel, int(entry["rows"]), int(entry["bytes"]), int(entry["crc32c"]))
        if key in self.done:
            return self.done[key]
        problem = None
        try:
            data = self.backend.read_checked(cid, entry)
            why = fmt.check_structure(data, entry)
            if why is not None:
                problem = f"checkpoint {cid}: file {self.backend.root}/{rel} {why}"
        except SnapshotError as e:
            problem = str(e)
        except OSError as e:
            problem = f"checkpoint {cid}: file {self.backend.root}/{rel} cannot be read: {e}"
        result = FileCheck(cid, rel, str(entry["role"]), int(entry["bytes"]), problem)
        self.done[key] = result
        if self.progress is not None:
            self.progress(result.bytes, self.total)
        return result

    def plan(self, cid: int) -> tuple[list[tuple[int, dict[str, Any]]], list[str]]:
        """The Rust verify plan of checkpoint `cid` (none when its manifest
        is unreadable)."""
        if cid not in self.plans:
            try:
                raw = self.manifest_bytes(cid)
            except SnapshotError:
                return [], []
            self.plans[cid] = fmt.verify_plan(cid, raw, self.manifest_bytes)
        return self.plans[cid]

    def verify(self, cid: int, complete: bool) -> CheckpointCheck:
        manifest_path = f"{checkpoint_dir_name(cid)}/{MANIFEST_FILE}"
        if not complete:
            d = f"{self.backend.root}/{checkpoint_dir_name(cid)}"
            why = str(fmt.missing_manifest(cid, d, self.backend.root, True))
            missing = FileCheck(cid, manifest_path, "manifest", 0, why)
            return CheckpointCheck(cid, "partial", [missing])
        planned, problems = self.plan(cid)
        if cid in self.broken:
            unreadable = FileCheck(cid, manifest_path, "manifest", 0, self.broken[cid])
            return CheckpointCheck(cid, "unreadable", [unreadable])
        files = [self.check(c, f) for c, f in planned]
        return CheckpointCheck(cid, "complete", files, problems)


def verify_checkpoints(
    root: Root,
    which: int | Literal["latest", "all"] = "all",
    filesystem: Any = None,
    progress: Progress | None = None,
) -> list[CheckpointCheck]:
    """Checks every file of the chosen checkpoints (and the base state files
    their chains need): present, of the manifest's size and crc32c, and
    opening as an Arrow/Parquet file with the manifest's rows.

    which: a checkpoint id, "latest" (the newest complete one) or "all"
    (every checkpoint directory, partial ones included: they fail).
    `progress` advances by the bytes of each file read.
    """
    backend = open_root(root, filesystem)
    complete = set(backend.complete())
    if which == "all":
        ids = sorted(complete | set(backend.partial()))
    elif which == "latest":
        ids = [resolve_id(backend, None)]
    else:
        ids = [which]
        if which not in complete and which not in backend.partial():
            raise SnapshotError(f"checkpoint {which} does not exist under {backend.root}")
    verifier = _Verifier(backend, progress)
    planned = {(c, f["path"]): int(f["bytes"]) for cid in ids for c, f in verifier.plan(cid)[0]}
    verifier.total = sum(planned.values())
    if progress is not None:
        progress(0, verifier.total)
    return [verifier.verify(cid, cid in complete) for cid in ids]


# --- prune ---


@dataclass(frozen=True)
class PruneResult:
    """What ``prune`` removed (or, with dry_run, would remove) and what stays."""

    removed: list[int]
    kept: list[int]
    base_only: list[int]
    """Kept only for files a newer checkpoint's chain reads, but themselves
    needing a removed checkpoint: not restorable (``verify`` reports them).
    Happens when tasks take their full states at different checkpoints."""
    partial: list[int]
    """Directories without a manifest: never touched (a running job may be writing one)."""
    held: list[int]
    """Held directories left after the prune (with `dry_run`, those it would
    leave): removed checkpoints whose runs a kept one reads; only those
    files stay."""
    dry_run: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prune(root: Root, keep: int, dry_run: bool = False, filesystem: Any = None) -> PruneResult:
    """Keeps the newest `keep` complete checkpoints, every savepoint and every
    base their chains need; removes the other complete ones, holding the
    directories of those whose runs a kept one reads
    (:meth:`SnapshotWriter.apply_retention`'s rule, the Rust store's)."""
    backend = open_root(root, filesystem)  # a clear error for a missing root
    writer = SnapshotWriter(root, filesystem)
    plan = writer.retention_plan(keep)
    held_after = sorted((set(backend.held()) - set(plan["release"])) | set(plan["hold"]))
    removed = writer.apply_retention(keep, dry_run=dry_run)
    kept = sorted(set(backend.complete()) - set(removed))
    base_only = []
    for cid in kept:
        try:
            needed = fmt.needs(backend.manifest_bytes(cid), cid)
        except SnapshotError:
            continue  # unreadable: kept for inspection, reported by verify
        if not set(needed) <= set(kept):
            base_only.append(cid)
    held = held_after if dry_run else backend.held()
    return PruneResult(removed, kept, base_only, backend.partial(), held, dry_run)
