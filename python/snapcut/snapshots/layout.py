"""The snapshot format's names and rules as Python reads them: file and
directory names, manifest parsing, diff chains, and rebuilding state from a
chain (the spec: docs/format.md; the Rust store in rust/core/src/store is
the other reader of the same files)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from snapcut._core import SNAPSHOT_FORMAT, SnapshotError

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


def checkpoint_dir_name(checkpoint_id: int) -> str:
    return f"{CHECKPOINT_DIR_PREFIX}{checkpoint_id:08d}"


def parse_dir_name(name: str) -> int | None:
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


def parse_manifest(data: bytes, what: str) -> dict[str, Any]:
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


def state_entry(manifest: dict[str, Any], task: Task) -> dict[str, Any] | None:
    for f in manifest["files"]:
        if f["role"] == "state" and (f.get("vertex"), f.get("subtask")) == task:
            return dict(f)
    return None


def needs(manifest: dict[str, Any]) -> list[int]:
    ids = {manifest["checkpoint_id"]}
    for f in manifest["files"]:
        ids.update(f.get("chain", []))
    return sorted(ids)


def read_ipc(data: bytes) -> pa.Table:
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
