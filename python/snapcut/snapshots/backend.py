"""Where a snapshot root's bytes come from: the Rust store for local paths,
any pyarrow filesystem (S3, GCS, HDFS, memory) for URIs. :class:`Backend` is
the one interface the readers above it use."""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable
from typing import Any, NamedTuple

import pyarrow as pa

from snapcut import _fs
from snapcut._core import SnapshotError, SnapshotReader
from snapcut._core import format as fmt
from snapcut.snapshots.layout import (
    HELD_FILE,
    MANIFEST_FILE,
    Channel,
    Task,
    checkpoint_dir_name,
    parse_dir_name,
    read_ipc,
    rebuild_state,
)
from snapcut.snapshots.mapped import MappedRead, checked, map_file
from snapcut.snapshots.run_cache import RunCache, RunCacheSpec, shared


class ChainFile(NamedTuple):
    """One state file of a chain, read and checked (:meth:`FsBackend.chain_files`)."""

    checkpoint: int
    kind: str
    table: pa.Table
    filter: bytes | None
    pages: fmt.MappedFile | None = None
    """The mapping the table's buffers lie in (a mapped read), else None."""
    times: pa.Table | None = None
    """A full's time index stored beside it (format 5), read and checked, else None."""
    times_pages: fmt.MappedFile | None = None
    """The mapping `times` lies in (a mapped read), else None."""


class Backend:
    """What a snapshot root must answer; one implementation per storage path."""

    root: str

    def complete(self) -> builtins.list[int]:
        raise NotImplementedError

    def partial(self) -> builtins.list[int]:
        raise NotImplementedError

    def held(self) -> builtins.list[int]:
        """Held directories: checkpoints retention removed whose runs newer
        checkpoints still read (a held record, no manifest)."""
        raise NotImplementedError

    def manifest(self, checkpoint_id: int) -> dict[str, Any]:
        raise NotImplementedError

    def verify(self, checkpoint_id: int) -> dict[str, Any]:
        raise NotImplementedError

    def state(self, checkpoint_id: int, task: Task) -> pa.Table | None:
        raise NotImplementedError

    def channels(self, checkpoint_id: int, task: Task) -> builtins.list[Channel]:
        raise NotImplementedError


class RustBackend(Backend):
    def __init__(self, root: str) -> None:
        self.root = root
        self._reader = SnapshotReader(root)

    def complete(self) -> builtins.list[int]:
        return self._reader.list()

    def partial(self) -> builtins.list[int]:
        return self._reader.partial()

    def held(self) -> builtins.list[int]:
        return sorted(self._reader.held())

    def manifest(self, checkpoint_id: int) -> dict[str, Any]:
        return dict(json.loads(self._reader.manifest(checkpoint_id)))

    def verify(self, checkpoint_id: int) -> dict[str, Any]:
        return dict(json.loads(self._reader.verify(checkpoint_id)))

    def state(self, checkpoint_id: int, task: Task) -> pa.Table | None:
        return self._reader.state(checkpoint_id, task[0], task[1])

    def channels(self, checkpoint_id: int, task: Task) -> builtins.list[Channel]:
        return [Channel(*c) for c in self._reader.channels(checkpoint_id, task[0], task[1])]


class FsBackend(Backend):
    """The same reader over any pyarrow filesystem: it moves the bytes, the
    Rust format rules (``snapcut._core.format``) check and read them."""

    def __init__(
        self,
        fs: Any,
        root: str,
        check: bool = True,
        run_cache: RunCache | RunCacheSpec | None = None,
    ) -> None:
        self.fs = fs
        self.root = root
        remote = _fs.local_path(fs, root) is None
        # A spec is opened at the first read that needs it (a driver that
        # only lists checkpoints makes no cache directory).
        self._run_cache = run_cache if remote else None
        self._raw: dict[int, bytes] = {}
        if check and not _fs.exists(fs, root):
            _fs.check_bucket(fs, root, f"opening snapshot root {root}")
            raise SnapshotError(f"snapshot root {root} does not exist")

    def _dir(self, checkpoint_id: int) -> str:
        return f"{self.root}/{checkpoint_dir_name(checkpoint_id)}"

    def listing(self) -> builtins.list[tuple[str, bool]]:
        """Paths under the root, relative to it, with whether each is a
        directory: what ``fmt.scan`` and ``fmt.retention`` read. On
        object stores one recursive listing (pages of keys) costs less than a
        request per checkpoint; elsewhere the root's entries, the manifests
        of the checkpoint directories among them, the held records of the
        others and the entries of the held directories."""
        from pyarrow.fs import FileSelector, FileType

        prefix = len(self.root.rstrip("/")) + 1
        if _fs.is_object_store(self.fs):
            infos = self.fs.get_file_info(FileSelector(self.root, recursive=True))
            return [(i.path[prefix:], i.type == FileType.Directory) for i in infos]
        out = [
            (i.base_name, i.type == FileType.Directory)
            for i in self.fs.get_file_info(FileSelector(self.root))
        ]
        probes = [
            f"{self.root}/{name}/{MANIFEST_FILE}"
            for name, is_dir in out
            if is_dir and parse_dir_name(name) is not None
        ]
        found = [i for i in self.fs.get_file_info(probes) if i.type == FileType.File]
        out += [(i.path[prefix:], False) for i in found]
        dirs = [p.rsplit("/", 1)[0] for p in probes]
        with_manifest = {i.path.rsplit("/", 1)[0] for i in found}
        held_probes = [f"{d}/{HELD_FILE}" for d in dirs if d not in with_manifest]
        for record in self.fs.get_file_info(held_probes):
            if record.type != FileType.File:
                continue
            held_dir = record.path.rsplit("/", 1)[0]
            out += [
                (i.path[prefix:], i.type == FileType.Directory)
                for i in self.fs.get_file_info(FileSelector(held_dir))
            ]
        return out

    def scan(self) -> tuple[builtins.list[int], builtins.list[int], builtins.list[int]]:
        """``(complete, partial, held)`` checkpoint ids, oldest first: the Rust
        rule over the root's listing."""
        return fmt.scan(self.listing())

    def complete(self) -> builtins.list[int]:
        return self.scan()[0]

    def partial(self) -> builtins.list[int]:
        return self.scan()[1]

    def held(self) -> builtins.list[int]:
        return self.scan()[2]

    def manifest_bytes(self, checkpoint_id: int) -> bytes:
        """The bytes of a checkpoint's manifest, checked (format, version, id)."""
        raw = self._raw.get(checkpoint_id)
        if raw is not None:
            return raw
        d = self._dir(checkpoint_id)
        path = f"{d}/{MANIFEST_FILE}"
        try:
            raw = _fs.read_bytes(self.fs, path)
        except OSError:
            if _fs.exists(self.fs, path):
                raise
            exists = _fs.exists(self.fs, d)
            held = exists and _fs.exists(self.fs, f"{d}/{HELD_FILE}")
            raise fmt.missing_manifest(checkpoint_id, d, self.root, exists, held) from None
        fmt.check_manifest(raw, f"manifest {path}", checkpoint_id)
        self._raw[checkpoint_id] = raw
        return raw

    def manifest(self, checkpoint_id: int) -> dict[str, Any]:
        manifest: dict[str, Any] = json.loads(self.manifest_bytes(checkpoint_id))
        return manifest

    def complete_manifest(self, checkpoint_id: int) -> dict[str, Any] | None:
        """The manifest of a complete checkpoint, or None while it has none
        (one existence check; none once this backend has read it)."""
        path = f"{self._dir(checkpoint_id)}/{MANIFEST_FILE}"
        if checkpoint_id not in self._raw and not _fs.exists(self.fs, path):
            return None
        return self.manifest(checkpoint_id)

    def read_checked(self, checkpoint_id: int, entry: dict[str, Any]) -> bytes:
        path = f"{self._dir(checkpoint_id)}/{entry['path']}"
        data: bytes = self._read_or_missing(checkpoint_id, path, _fs.read_bytes)
        fmt.check_file(data, entry, checkpoint_id, path)
        return data

    @property
    def run_cache(self) -> RunCache | None:
        """A remote root's local cache of files (:meth:`read_mapped`)."""
        if isinstance(self._run_cache, RunCacheSpec):
            self._run_cache = shared(self._run_cache)
        return self._run_cache

    @property
    def mappable(self) -> bool:
        """Whether :meth:`read_mapped` maps files: a local root's, or a remote
        root's through its run cache."""
        cache = self._run_cache
        if isinstance(cache, RunCacheSpec):
            return cache.enabled
        return cache is not None or _fs.local_path(self.fs, self.root) is not None

    def read_mapped(self, checkpoint_id: int, entry: dict[str, Any]) -> MappedRead:
        """As :meth:`read_checked`, but a local file is mapped, not read: its
        pages stay the page cache's (no copy on the heap), and what reads it
        later touches only the pages it needs (the pages the check read are
        released). A remote root's file is mapped from its copy in the run
        cache (downloaded first if missing), if the backend has one and the
        file fits in it; otherwise read as ever (no pages)."""
        path = f"{self._dir(checkpoint_id)}/{entry['path']}"
        local = _fs.local_path(self.fs, path)
        if local is None:
            cache = self.run_cache
            if cache is not None:
                cached = cache.fetch(self.fs, path, entry, checkpoint_id)
                if cached is not None:
                    return cached
            return MappedRead(pa.py_buffer(self.read_checked(checkpoint_id, entry)), None)
        read: MappedRead = self._read_or_missing(
            checkpoint_id, path, lambda _fs, _path: map_file(local)
        )
        return checked(read, lambda data: fmt.check_file(data, entry, checkpoint_id, path))

    def _read_or_missing(
        self, checkpoint_id: int, path: str, read: Callable[[Any, str], Any]
    ) -> Any:
        """``read(fs, path)``; a file that is not there is the format's
        missing-file error, naming the checkpoint and path."""
        try:
            return read(self.fs, path)
        except OSError:
            if _fs.exists(self.fs, path):
                raise
            raise fmt.missing_file(checkpoint_id, path) from None

    def verify(self, checkpoint_id: int) -> dict[str, Any]:
        raw = self.manifest_bytes(checkpoint_id)
        fmt.verify(checkpoint_id, raw, self.manifest_bytes, self.read_checked)
        manifest: dict[str, Any] = json.loads(raw)
        return manifest

    def chain(
        self,
        checkpoint_id: int,
        task: Task,
        manifest: dict[str, Any] | None = None,
        mapped: bool = False,
    ) -> builtins.list[tuple[int, str, pa.Table]] | None:
        """The ``(id, kind, table)`` files that rebuild `task`'s state at a
        checkpoint, each checked; None if the task has no state there.
        `manifest`: the checkpoint's manifest when the caller holds it (not
        read again). `mapped`: local files are mapped (:meth:`read_mapped`),
        the tables' buffers in the mapping. Which files, in what order, is
        the Rust chain rule (``fmt.state_chain``); this only reads the
        manifests and files."""
        files = self.chain_files(checkpoint_id, task, manifest, mapped, sidecars=False)
        return None if files is None else [(f.checkpoint, f.kind, f.table) for f in files]

    def chain_files(
        self,
        checkpoint_id: int,
        task: Task,
        manifest: dict[str, Any] | None = None,
        mapped: bool = False,
        sidecars: bool = True,
    ) -> builtins.list[ChainFile] | None:
        """As :meth:`chain`, each file with what is stored beside it if
        `sidecars`, each checked against its entry: a diff's bloom filter
        (format 3), so a table that keeps runs need not hash their keys, and
        a full's time index (format 5), so a table indexed by time need not
        read every row's time."""
        raw = self.manifest_bytes(checkpoint_id) if manifest is None else _json_bytes(manifest)
        links = fmt.state_chain(checkpoint_id, raw, task[0], task[1], self.manifest_bytes)
        if links is None:
            return None
        files = []
        for cid, kind, entry, bloom, times in links:
            read = self._read(cid, entry, mapped)
            stored = None if bloom is None or not sidecars else self.read_checked(cid, bloom)
            index = None if times is None or not sidecars else self._read(cid, times, mapped)
            files.append(
                ChainFile(
                    cid,
                    kind,
                    read_ipc(read.buffer),
                    stored,
                    read.pages,
                    None if index is None else read_ipc(index.buffer),
                    None if index is None else index.pages,
                )
            )
        return files

    def state_runs(
        self, checkpoint_id: int, task: Task, manifest: dict[str, Any] | None = None
    ) -> builtins.list[dict[str, Any]] | None:
        """The runs (format 2 run entries, newest first, checked) a task's
        state at a checkpoint is made of: those its entry lists, or those
        its chain implies (format 1); None when the checkpoint holds no
        state for the task. Only manifests are read."""
        raw = self.manifest_bytes(checkpoint_id) if manifest is None else _json_bytes(manifest)
        runs: builtins.list[dict[str, Any]] | None = fmt.state_runs(
            checkpoint_id, raw, task[0], task[1], self.manifest_bytes
        )
        return runs

    def _read(self, checkpoint_id: int, entry: dict[str, Any], mapped: bool) -> MappedRead:
        """A file of a checkpoint, checked: mapped (:meth:`read_mapped`) or read."""
        if mapped:
            return self.read_mapped(checkpoint_id, entry)
        return MappedRead(pa.py_buffer(self.read_checked(checkpoint_id, entry)), None)

    def state(self, checkpoint_id: int, task: Task) -> pa.Table | None:
        chain = self.chain(checkpoint_id, task)
        if chain is None:
            return None
        return rebuild_state([(kind, table) for _, kind, table in chain])

    def channels(self, checkpoint_id: int, task: Task) -> builtins.list[Channel]:
        raw = self.manifest_bytes(checkpoint_id)
        return [
            Channel(i, edge, s, read_ipc(self.read_checked(checkpoint_id, entry)))
            for i, edge, s, entry in fmt.channel_files(raw, checkpoint_id, task[0], task[1])
        ]


def _json_bytes(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest).encode()
