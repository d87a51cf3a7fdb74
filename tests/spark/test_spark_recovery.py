"""Exactly-once state on Spark under task failures: tasks that raise or whose
Python worker is SIGKILLed mid-batch are retried by Spark and rewrite the same
bytes; a user function that raises fails the query with its traceback, and
the query re-runs cleanly after the fix. Every task here starts with no warm
state (``SNAPCUT_STATE_CACHE=0``): each batch restores from the root."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from tests.spark_support import (
    dwell_frames,
    rows_of,
    run_to_end,
    start_session,
    stream,
    write_inputs,
)

from snapcut.spark import GroupStateTimeout, keyed_state, read_state_arrow

FILES = 3


@pytest.fixture(scope="module")
def failpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("failpoints") / "points"


@pytest.fixture(scope="module")
def spark(failpoints: Path) -> Iterator[Any]:
    session = start_session(
        "local[2,4]",
        **{
            "spark.executorEnv.SNAPCUT_SPARK_FAILPOINTS": f"@{failpoints}",
            "spark.executorEnv.SNAPCUT_STATE_CACHE": "0",
        },
    )
    yield session
    session.stop()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    frames = dwell_frames(files=FILES, rows=2000, users=250, seed=3)
    return write_inputs(tmp_path_factory.mktemp("in") / "events", frames), pd.concat(frames)


def dwell_query(spark: Any, directory: Path, root: Path) -> Any:
    return keyed_state(stream(spark, directory), "user", str(root), 3, full_every=2).aggregate(
        count="count", total=("sum", "dwell_ms"), avg=("mean", "dwell_ms")
    )


def state_files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.glob("chk-*/*.state.arrow"))
    }


def test_failed_and_killed_tasks_retry_to_the_same_state_bytes(
    spark: Any, inputs: tuple[Path, pd.DataFrame], failpoints: Path, tmp_path: Path
) -> None:
    directory, events = inputs
    failpoints.write_text("")
    clean = run_to_end(dwell_query(spark, directory, tmp_path / "clean"), tmp_path / "chk-clean")
    failpoints.write_text(
        ",".join(
            [
                "state.before_write:0:1:raise:0",
                "state.after_write:1:0:raise:0",
                "state.after_ack:1:2:kill:0",
                "state.after_write:2:*:kill:0",
            ]
        )
    )
    try:
        failed = run_to_end(dwell_query(spark, directory, tmp_path / "failed"), tmp_path / "chk-f")
    finally:
        failpoints.write_text("")
    assert sorted(failed) == sorted(clean) == list(range(FILES))
    for b in range(FILES):
        assert rows_of(failed[b], ["user"]) == rows_of(clean[b], ["user"])
    files = state_files(tmp_path / "clean")
    assert len(files) == FILES * 3
    assert state_files(tmp_path / "failed") == files
    g = events.groupby("user")["dwell_ms"].agg(["count", "sum"])
    model = {int(u): (int(r["count"]), int(r["sum"])) for u, r in g.iterrows()}
    state = read_state_arrow(str(tmp_path / "failed"))
    assert {r["user"]: (r["count"], r["total"]) for r in state.to_pylist()} == model


def test_function_error_fails_the_query_and_reruns_cleanly_after_the_fix(
    spark: Any, inputs: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    directory, _ = inputs
    bad_user = 17

    def make(fail: bool) -> Any:
        def func(
            key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: Any
        ) -> Iterator[pd.DataFrame]:
            n = (state.get[0] if state.exists else 0) + sum(len(p) for p in pdfs)
            if fail and key[0] == bad_user and n > 5:
                raise ValueError(f"user {key[0]} is not allowed")
            state.update((n,))
            yield pd.DataFrame({"user": [key[0]], "n": [n]})

        return func

    def query(fail: bool, root: Path) -> Any:
        return keyed_state(
            stream(spark, directory), "user", str(root), 2
        ).apply_in_pandas_with_state(
            make(fail), "user long, n long", "n long", "update", GroupStateTimeout.NoTimeout
        )

    with pytest.raises(Exception, match="user 17 is not allowed") as failure:
        run_to_end(query(True, tmp_path / "state"), tmp_path / "chk")
    assert "Traceback" in str(failure.value) or "ValueError" in str(failure.value)
    fixed = run_to_end(query(False, tmp_path / "state"), tmp_path / "chk")
    clean = run_to_end(query(False, tmp_path / "clean"), tmp_path / "chk-clean")
    assert sorted(fixed) == [b for b in sorted(clean) if b >= min(fixed)]
    assert read_state_arrow(str(tmp_path / "state")) == read_state_arrow(str(tmp_path / "clean"))
    assert state_files(tmp_path / "state") == state_files(tmp_path / "clean")
