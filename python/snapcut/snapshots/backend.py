"""Where a snapshot root's bytes come from: the Rust store for local paths,
any pyarrow filesystem (S3, GCS, HDFS, memory) for URIs. :class:`Backend` is
the one interface the readers above it use."""

from __future__ import annotations

import builtins
import json
from typing import Any

import pyarrow as pa

from snapcut import _fs
from snapcut._core import SnapshotError, SnapshotReader, crc32c
from snapcut.snapshots.layout import (
    MANIFEST_FILE,
    Channel,
    Task,
    checkpoint_dir_name,
    needs,
    parse_dir_name,
    parse_manifest,
    read_ipc,
    rebuild_state,
    state_entry,
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
            cid = parse_dir_name(info.base_name)
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
        m = parse_manifest(_fs.read_bytes(self.fs, path), f"manifest {path}")
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
        for needed in needs(manifest):
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
        entry = state_entry(manifest, task)
        if entry is None:
            return None
        chain: list[tuple[str, pa.Table]] = []
        for cid in entry.get("chain") or [checkpoint_id]:
            m = manifest if cid == checkpoint_id else self.manifest(cid)
            f = state_entry(m, task)
            if f is None:
                raise SnapshotError(
                    f"checkpoint {checkpoint_id}: state of {task[0]}-{task[1]} needs checkpoint "
                    f"{cid}, which has no state file for it"
                )
            chain.append((f.get("kind", "full"), read_ipc(self.read_checked(cid, f))))
        return rebuild_state(chain)

    def channels(self, checkpoint_id: int, task: Task) -> builtins.list[Channel]:
        manifest = self.manifest(checkpoint_id)
        out = []
        for f in manifest["files"]:
            if f["role"] == "channel" and (f.get("vertex"), f.get("subtask")) == task:
                records = read_ipc(self.read_checked(checkpoint_id, f))
                edge = f.get("edge", "")
                out.append(Channel(f.get("input", 0), edge, f["from_subtask"], records))
        return out
