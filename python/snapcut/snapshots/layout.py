"""The snapshot format's names as Python uses them: constants, file and
directory names. The rules (checks, chains, rebuild, manifests, retention,
verify plans) live once, in rust/core/src/store/format/, called through
``snapcut._core.format`` (the spec: docs/format.md)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from snapcut._core import SNAPSHOT_FORMAT
from snapcut._core import format as fmt

FORMAT_NAME: str = SNAPSHOT_FORMAT["FORMAT_NAME"]
FORMAT_VERSION: int = SNAPSHOT_FORMAT["FORMAT_VERSION"]
MANIFEST_FILE: str = SNAPSHOT_FORMAT["MANIFEST_FILE"]
MANIFEST_TMP_FILE: str = SNAPSHOT_FORMAT["MANIFEST_TMP_FILE"]
HELD_FILE: str = SNAPSHOT_FORMAT["HELD_FILE"]
HELD_TMP_FILE: str = SNAPSHOT_FORMAT["HELD_TMP_FILE"]
SOURCES_FILE: str = SNAPSHOT_FORMAT["SOURCES_FILE"]
CHECKPOINT_DIR_PREFIX: str = SNAPSHOT_FORMAT["CHECKPOINT_DIR_PREFIX"]
DELETED_COLUMN: str = SNAPSHOT_FORMAT["DELETED_COLUMN"]
KEY_METADATA: str = SNAPSHOT_FORMAT["KEY_METADATA"]
LIVE_KEYS_METADATA: str = SNAPSHOT_FORMAT["LIVE_KEYS_METADATA"]
TIME_METADATA: str = SNAPSHOT_FORMAT["TIME_METADATA"]

SOURCES_SCHEMA: pa.Schema = fmt.sources_schema().schema

Task = tuple[str, int]


def checkpoint_dir_name(checkpoint_id: int) -> str:
    """``chk-NNNNNNNN`` (the Rust store's name)."""
    return fmt.checkpoint_dir_name(checkpoint_id)


def parse_dir_name(name: str) -> int | None:
    """The checkpoint id of a directory name, or None if it is not one."""
    return fmt.parse_checkpoint_dir(name)


def file_component(name: str) -> str:
    """`name` as part of a file name: [A-Za-z0-9_-] stay, other bytes %XX."""
    return fmt.file_component(name)


def channel_file_name(vertex: str, subtask: int, edge: str, from_subtask: int) -> str:
    """``<vertex>-<subtask>.channel-<edge>.<from_subtask>.arrow``."""
    return fmt.channel_file_name(vertex, subtask, edge, from_subtask)


def parse_manifest(data: bytes, what: str, checkpoint_id: int) -> dict[str, Any]:
    """The manifest of `checkpoint_id` as written, checked by the Rust rules."""
    fmt.check_manifest(data, what, checkpoint_id)
    manifest: dict[str, Any] = json.loads(data)
    return manifest


def read_ipc(data: bytes | pa.Buffer) -> pa.Table:
    return ipc.open_file(pa.BufferReader(data)).read_all()


def rebuild_state(chain: Sequence[tuple[str, pa.Table]]) -> pa.Table:
    """Full state from a chain of ``(kind, table)``: one "full", then "diff"s
    (the Rust rule: a diff's rows replace the rows of their keys; rows with
    ``__deleted`` true remove them)."""
    table: pa.Table = fmt.rebuild_state(list(chain))
    return table


@dataclass(frozen=True)
class Channel:
    """Records a task recorded in flight on one input channel."""

    input: int
    edge: str
    from_subtask: int
    records: pa.Table
