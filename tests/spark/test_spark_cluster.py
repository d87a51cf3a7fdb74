"""The stateful helper on two executor JVMs (``local-cluster[2,1,1024]``):
state partitions move between executors and Python workers, whose caches
cannot be trusted, and an executor SIGKILLed mid-batch loses its tasks,
which Spark re-runs elsewhere: the output and state equal a failure-free run,
and the state files are byte-identical."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
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

pytestmark = pytest.mark.local_cluster

FILES = 3


@pytest.fixture(scope="module")
def failpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("failpoints") / "points"
    path.write_text("")
    return path


@pytest.fixture(scope="module")
def spark(failpoints: Path) -> Iterator[Any]:
    session = start_session(
        "local-cluster[2,1,1024]",
        **{
            "spark.executorEnv.SNAPCUT_SPARK_FAILPOINTS": f"@{failpoints}",
            "spark.task.maxFailures": "4",
            "spark.executor.memory": "768m",
        },
    )
    wait_for_executors(session, 2)
    yield session
    session.stop()


def wait_for_executors(session: Any, n: int, timeout: float = 180.0) -> None:
    """local-cluster launches its executor JVMs after the session is up;
    on a loaded machine they register many seconds later."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        registered = session.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
        if registered >= n and len(executor_pids(session)) >= n:
            return
        time.sleep(0.5)
    raise AssertionError(f"{n} executors did not register within {timeout:.0f} s")


def executor_pids(session: Any) -> list[int]:
    """This application's executor JVMs (another test process may run a
    local-cluster of its own at the same time)."""
    app = session.sparkContext.applicationId
    out = subprocess.run(
        ["pgrep", "-f", f"CoarseGrainedExecutorBackend .*--app-id {app}( |$)"],
        capture_output=True,
        text=True,
    ).stdout
    return [int(p) for p in out.split()]


def counts(
    key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: Any
) -> Iterator[pd.DataFrame]:
    n = (state.get[0] if state.exists else 0) + sum(len(p) for p in pdfs)
    state.update((n,))
    yield pd.DataFrame({"user": [key[0]], "n": [n]})


def state_files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.glob("chk-*/*.state.arrow"))
    }


def test_two_executors_match_spark_and_survive_an_executor_kill(
    spark: Any, failpoints: Path, tmp_path: Path
) -> None:
    assert len(executor_pids(spark)) == 2
    frames = dwell_frames(files=FILES, rows=1500, users=200, seed=5)
    directory = write_inputs(tmp_path / "events", frames)

    def query(root: Path) -> Any:
        return keyed_state(
            stream(spark, directory), "user", str(root), 4
        ).apply_in_pandas_with_state(
            counts, "user long, n long", "n long", "update", GroupStateTimeout.NoTimeout
        )

    clean = run_to_end(query(tmp_path / "clean"), tmp_path / "chk-clean")
    native = run_to_end(
        stream(spark, directory)
        .groupBy("user")
        .applyInPandasWithState(counts, "user long, n long", "n long", "update", "NoTimeout"),
        tmp_path / "chk-native",
    )
    for b in range(FILES):
        assert rows_of(clean[b], ["user"]) == rows_of(native[b], ["user"])
    # Batch 1's tasks stall before writing their state; one executor is killed meanwhile.
    failpoints.write_text("state.before_write:1:*:sleep:0")
    killed: list[int] = []

    def kill_one() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (tmp_path / "killed").exists():
            if (tmp_path / "crashed" / "chk-00000000" / "manifest.json").exists():
                time.sleep(1.0)
                pids = executor_pids(spark)
                if pids:
                    os.kill(pids[0], signal.SIGKILL)
                    killed.append(pids[0])
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one)
    killer.start()
    try:
        crashed = run_to_end(query(tmp_path / "crashed"), tmp_path / "chk-crashed")
    finally:
        (tmp_path / "killed").touch()
        killer.join()
        failpoints.write_text("")
    assert killed, "no executor was killed"
    for b in range(FILES):
        assert rows_of(crashed[b], ["user"]) == rows_of(clean[b], ["user"])
    assert state_files(tmp_path / "crashed") == state_files(tmp_path / "clean")
    assert read_state_arrow(str(tmp_path / "crashed")) == read_state_arrow(str(tmp_path / "clean"))


def test_transform_with_state_on_two_executors(spark: Any, tmp_path: Path) -> None:
    """A StatefulProcessor with value, list and map state: its variables'
    partitions move between executors' Python workers; every batch's rows
    are the users' running count and total, as pandas computes them."""
    from snapcut.jobs.dwell_processor import OUTPUT, DwellProcessor

    frames = dwell_frames(files=FILES, rows=1500, users=200, seed=9)
    directory = write_inputs(tmp_path / "events", frames)
    step = keyed_state(stream(spark, directory), "user", str(tmp_path / "root"), 4)
    out = run_to_end(
        step.transform_with_state_in_pandas(DwellProcessor(), OUTPUT, "Update", "None"),
        tmp_path / "chk",
    )
    seen = pd.DataFrame(columns=["user", "dwell_ms"])
    for b, frame in enumerate(frames):
        seen = pd.concat([seen, frame[["user", "dwell_ms"]]]).astype("int64")
        totals = seen.groupby("user")["dwell_ms"].agg(["count", "sum"])
        want = [
            {"user": u, "count": int(totals.loc[u, "count"]), "total": int(totals.loc[u, "sum"])}
            for u in sorted(frame["user"].unique())
        ]
        got = [{k: r[k] for k in ("user", "count", "total")} for r in rows_of(out[b], ["user"])]
        assert got == want, b
    state = read_state_arrow(str(tmp_path / "root"), variable="totals").sort_by("user")
    assert state["count"].to_pylist() == [int(c) for c in totals["count"]]


def test_data_source_reads_versions_and_change_feed_on_two_executors(
    spark: Any, tmp_path: Path
) -> None:
    """spark.read.format("snapcut") on local-cluster: roots written by two
    executors, their partitions read back by two; the change feed of
    batches 3-7 equals the difference of the versions (level 1 and each
    transformWithState variable), and the sink root reads its output."""
    from source_roots import VARIABLES, assert_feed_matches_versions, build, read

    from snapcut.spark import read_output_arrow

    roots = build(spark, tmp_path)
    assert assert_feed_matches_versions(spark, roots.level1)["update"] > 0
    for variable in VARIABLES:
        assert assert_feed_matches_versions(spark, roots.tws, variable=variable)["delete"] > 0
    got = read(spark, roots.sink).toArrow()
    want = read_output_arrow(str(roots.sink))
    assert sorted(map(str, got.sort_by("user").to_pylist())) == sorted(
        map(str, want.sort_by("user").to_pylist())
    )
