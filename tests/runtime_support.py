"""What the local runtime's keyed-state tests share: the model a running sum
folds to, and the state files a durable root lists per subtask."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def fold(rows: list[tuple[Any, int]]) -> dict[Any, int]:
    """A running sum per key after `rows`: a negative value drops the key."""
    state: dict[Any, int] = {}
    for k, v in rows:
        if v < 0:
            state.pop(k, None)
        else:
            state[k] = state.get(k, 0) + v
    return state


def state_files_by_subtask(
    root: Path, vertex: str, subtasks: int = 2
) -> dict[int, dict[int, tuple[str, int | None]]]:
    """Each subtask's state files of `vertex` under `root`, by checkpoint:
    (kind, base)."""
    files: dict[int, dict[int, tuple[str, int | None]]] = {s: {} for s in range(subtasks)}
    for manifest in sorted(root.glob("chk-*/manifest.json")):
        m = json.loads(manifest.read_text())
        for f in m["files"]:
            if f["role"] == "state" and f["vertex"] == vertex:
                files[f["subtask"]][m["checkpoint_id"]] = (f.get("kind", "full"), f.get("base"))
    return files
