"""Where a snapshot root's bytes come from: the Rust store for local paths,
any pyarrow filesystem (S3, GCS, HDFS, memory) for URIs. :class:`Backend` is
the one interface the readers above it use."""

from __future__ import annotations

import builtins
import json
from typing import Any

import pyarrow as pa

from snapcut import _fs
from snapcut._core import (
    SnapshotError,
    SnapshotReader,
    format_check_file,
    format_check_manifest,
    format_missing_file,
    format_needs,
    format_state_chain,
    format_verify_plan,
)
from snapcut.snapshots.layout import (
    MANIFEST_FILE,
    Channel,
    Task,
    checkpoint_dir_name,
    parse_dir_name,
    read_ipc,
    rebuild_state,
)


class Backend:
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


class RustBackend(Backend):
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


class FsBackend(Backend):
    """The same reader over any pyarrow filesystem: it moves the bytes, the
    Rust format rules (``snapcut._core.format_*``) check and read them."""

    def __init__(self, fs: Any, root: str, check: bool = True) -> None:
        self.fs = fs
        self.root = root
        self._raw: dict[int, bytes] = {}
        if check and not _fs.exists(fs, root):
            _fs.check_bucket(fs, root, f"opening snapshot root {root}")
            raise SnapshotError(f"snapshot root {root} does not exist")

    def _dir(self, checkpoint_id: int) -> str:
        return f"{self.root}/{checkpoint_dir_name(checkpoint_id)}"

    def scan(self) -> dict[int, bool]:
        """Every checkpoint directory with whether it has a manifest."""
        from pyarrow.fs import FileSelector, FileType

        out: dict[int, bool] = {}
        for info in self.fs.get_file_info(FileSelector(self.root)):
            cid = parse_dir_name(info.base_name)
            if cid is not None and info.type == FileType.Directory:
                out[cid] = _fs.exists(self.fs, f"{info.path}/{MANIFEST_FILE}")
        return out

    def complete(self) -> builtins.list[int]:
        return sorted(c for c, complete in self.scan().items() if complete)

    def partial(self) -> builtins.list[int]:
        return sorted(c for c, complete in self.scan().items() if not complete)

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
            if _fs.exists(self.fs, d):
                raise SnapshotError(
                    f"checkpoint {checkpoint_id} has no {MANIFEST_FILE} in {d}: it is partial "
                    "(crashed or aborted before commit) and cannot be restored"
                ) from None
            raise SnapshotError(
                f"checkpoint {checkpoint_id} does not exist under {self.root}"
            ) from None
        format_check_manifest(raw, f"manifest {path}", checkpoint_id)
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
        try:
            data = _fs.read_bytes(self.fs, path)
        except OSError:
            if _fs.exists(self.fs, path):
                raise
            raise format_missing_file(checkpoint_id, path) from None
        format_check_file(data, json.dumps(entry), checkpoint_id, path)
        return data

    def verify(self, checkpoint_id: int) -> dict[str, Any]:
        raw = self.manifest_bytes(checkpoint_id)
        manifest: dict[str, Any] = json.loads(raw)
        bases: dict[int, bytes] = {}
        for needed in format_needs(raw, checkpoint_id):
            if needed != checkpoint_id:
                bases[needed] = self._base_manifest(checkpoint_id, needed)
        files, _ = format_verify_plan(checkpoint_id, raw, list(bases.items()), [])
        parsed = {c: json.loads(b) for c, b in bases.items()}
        for cid, index in files:
            m = manifest if cid == checkpoint_id else parsed[cid]
            try:
                self.read_checked(cid, m["files"][index])
            except SnapshotError as e:
                if cid == checkpoint_id:
                    raise
                raise SnapshotError(
                    f"checkpoint {checkpoint_id} needs base checkpoint {cid}: {e}"
                ) from e
        return manifest

    def _base_manifest(self, checkpoint_id: int, base: int) -> bytes:
        try:
            return self.manifest_bytes(base)
        except SnapshotError as e:
            raise SnapshotError(
                f"checkpoint {checkpoint_id} needs base checkpoint {base}: {e}"
            ) from e

    def chain(
        self, checkpoint_id: int, task: Task, manifest: dict[str, Any] | None = None
    ) -> builtins.list[tuple[int, str, pa.Table]] | None:
        """The ``(id, kind, table)`` files that rebuild `task`'s state at a
        checkpoint, each checked; None if the task has no state there.
        `manifest`: the checkpoint's manifest when the caller holds it (not
        read again). Which files, in what order, is the Rust chain rule
        (``format_state_chain``); this only reads the manifests and files."""
        raw = self.manifest_bytes(checkpoint_id) if manifest is None else _json_bytes(manifest)
        links = format_state_chain(checkpoint_id, raw, task[0], task[1], self.manifest_bytes)
        if links is None:
            return None
        return [
            (cid, kind, read_ipc(self.read_checked(cid, json.loads(entry))))
            for cid, kind, entry in links
        ]

    def state(self, checkpoint_id: int, task: Task) -> pa.Table | None:
        chain = self.chain(checkpoint_id, task)
        if chain is None:
            return None
        return rebuild_state([(kind, table) for _, kind, table in chain])

    def channels(self, checkpoint_id: int, task: Task) -> builtins.list[Channel]:
        manifest = self.manifest(checkpoint_id)
        out = []
        for f in manifest["files"]:
            if f["role"] == "channel" and (f.get("vertex"), f.get("subtask")) == task:
                records = read_ipc(self.read_checked(checkpoint_id, f))
                edge = f.get("edge", "")
                out.append(Channel(f.get("input", 0), edge, f["from_subtask"], records))
        return out


def _json_bytes(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest).encode()
