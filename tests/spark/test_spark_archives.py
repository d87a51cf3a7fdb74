"""Shipping snapcut to a cluster: executors that get snapcut ONLY through
``spark.archives``. The wheel (``$SNAPCUT_WHEEL``, which scripts/test.sh sets to
the manylinux_2_28 wheel it built; else one built here with maturin) goes
into a fresh venv with its runtime dependencies, ``venv-pack`` packs that
venv, and a ``local-cluster[2,1,1024]`` session (two executor JVMs) runs
Python as ``./environment/bin/python`` of the unpacked archive. Inside the
tasks, snapcut, pyarrow, pandas and numpy come from the archive, and nothing
of the repository or of the driver's venv is on ``sys.path``; a keyed_state
aggregate gives the right results."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark import SparkContext
from pyspark.find_spark_home import _find_spark_home
from tests.spark_support import (
    dwell_frames,
    rows_of,
    run_to_end,
    start_session,
    stream,
    write_inputs,
)

from snapcut.spark import keyed_state, read_state

pytestmark = pytest.mark.local_cluster

REPO = Path(__file__).resolve().parents[2]
ENV_PYTHON = "./environment/bin/python"
FILES = 2


def run(cmd: list[str], **kwargs: Any) -> None:
    """Runs a setup command; its output goes into the failure message."""
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")


def snapcut_wheel(tmp: Path) -> Path:
    """$SNAPCUT_WHEEL, or a wheel of this checkout built now (no zig: any
    abi3 wheel of snapcut does for shipping; scripts/test.sh checks the tag)."""
    given = os.environ.get("SNAPCUT_WHEEL")
    if given:
        if not Path(given).is_file():
            pytest.fail(f"SNAPCUT_WHEEL={given} is not a file")
        return Path(given)
    maturin = Path(sys.executable).parent / "maturin"
    if not maturin.exists():
        pytest.fail(
            "SNAPCUT_WHEEL is not set and maturin is not in this venv: build the wheel "
            "(maturin build --release --zig --compatibility manylinux_2_28 -o DIR) and "
            "set SNAPCUT_WHEEL to its path"
        )
    run([str(maturin), "build", "--release", "-q", "-o", str(tmp)], cwd=REPO)
    wheels = sorted(tmp.glob("snapcut-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def packed_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the wheel and its runtime dependencies (pinned to the
    driver's versions), packed by venv-pack into a tar.gz."""
    tmp = tmp_path_factory.mktemp("archives")
    wheel = snapcut_wheel(tmp / "wheel")
    assert "-abi3-" in wheel.name, wheel
    venv = tmp / "snapcut-env"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-compile",
            str(wheel),
            f"pyarrow=={pa.__version__}",
            f"pandas=={pd.__version__}",
            f"numpy=={np.__version__}",
        ]
    )
    archive = tmp / "snapcut-env.tar.gz"
    # Level 0: gzip's framing without its work (packing the ~280 MB venv took
    # 6.1 s of CPU at the default level 4, 1.0 s at 0; each executor unpacks
    # it too); what is checked is where the executors import from, not the
    # archive's size.
    run(
        [
            sys.executable,
            "-m",
            "venv_pack",
            "-q",
            "--compress-level",
            "0",
            "-p",
            str(venv),
            "-o",
            str(archive),
        ]
    )
    return archive


@pytest.fixture(scope="module")
def spark(packed_env: Path) -> Iterator[Any]:
    # The gateway JVM (shared by every session of this process) is launched
    # before PYSPARK_PYTHON changes, so it does not inherit it.
    SparkContext._ensure_initialized()
    with pytest.MonkeyPatch.context() as mp:
        # The driver's SparkContext takes the executors' Python from PYSPARK_PYTHON.
        mp.setenv("PYSPARK_PYTHON", ENV_PYTHON)
        session = start_session(
            "local-cluster[2,1,1024]",
            **{
                "spark.archives": f"{packed_env}#environment",
                "spark.pyspark.python": ENV_PYTHON,
                "spark.executorEnv.PYSPARK_PYTHON": ENV_PYTHON,
                # tests/spark_support.py put the repository on PYTHONPATH (and the
                # gateway JVM, so the executor JVMs, inherited it): not for these.
                "spark.executorEnv.PYTHONPATH": "",
                "spark.executor.memory": "768m",
            },
        )
        try:
            wait_for_executors(session, 2)
            yield session
        finally:
            session.stop()


def wait_for_executors(session: Any, n: int, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if session.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1 >= n:
            return
        time.sleep(0.5)
    raise AssertionError(f"{n} executors did not register within {timeout:.0f} s")


def where_python_runs(spark: Any) -> pd.DataFrame:
    """One row per task: where its Python worker runs and imports from."""

    def probe(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import json
        import os
        import sys
        import time

        import numpy
        import pandas
        import pyarrow
        import pyspark

        import snapcut

        for _ in batches:
            pass
        time.sleep(0.5)  # so that both executors get tasks
        yield pandas.DataFrame(
            {
                "cwd": [os.getcwd()],
                "executable": [sys.executable],
                "prefix": [sys.prefix],
                "base_prefix": [sys.base_prefix],
                "snapcut": [snapcut.__file__],
                "pyarrow": [pyarrow.__file__],
                "pandas": [pandas.__file__],
                "numpy": [numpy.__file__],
                "pyspark": [pyspark.__file__],
                "path": [json.dumps(sys.path)],
                "pythonpath": [os.environ.get("PYTHONPATH", "")],
            }
        )

    schema = (
        "cwd string, executable string, prefix string, base_prefix string, snapcut string, "
        "pyarrow string, pandas string, numpy string, pyspark string, path string, "
        "pythonpath string"
    )
    return spark.range(0, 8, numPartitions=8).mapInPandas(probe, schema).toPandas()


def test_executors_import_snapcut_only_from_the_archive(spark: Any) -> None:
    rows = where_python_runs(spark)
    assert len(rows) == 8
    spark_home = Path(_find_spark_home()).resolve()
    spark_lib = spark_home / "python" / "lib"
    # What Spark itself puts on its Python workers' path: pyspark.zip, py4j, spark-core.
    spark_files = {*spark_lib.glob("*.zip"), *(spark_home / "jars").glob("spark-core_*.jar")}
    hidden = {REPO, REPO / "python", REPO / "tests", *map(Path, site.getsitepackages())}
    hidden = {p.resolve() for p in hidden}
    for row in rows.itertuples():
        env = (Path(row.cwd) / "environment").resolve()
        assert Path(row.executable).parent.resolve() == env / "bin", row.executable
        assert Path(row.prefix).resolve() == env, row.prefix
        for module in ("snapcut", "pyarrow", "pandas", "numpy"):
            file = Path(getattr(row, module)).resolve()
            assert file.is_relative_to(env / "lib"), f"{module} imported from {file}"
        # pyspark itself comes from the Spark installation, as on a real cluster.
        assert Path(row.pyspark).resolve().is_relative_to(spark_lib / "pyspark.zip"), row.pyspark
        base = Path(row.base_prefix).resolve()
        for entry in json.loads(row.path):
            p = (Path(row.cwd) / entry).resolve()  # "." is the worker's directory
            where = f"sys.path {row.path}, PYTHONPATH {row.pythonpath!r}"
            assert p not in hidden, f"{p} is on the executors' sys.path: {where}"
            assert (
                p.is_relative_to(env)
                or p == Path(row.cwd).resolve()
                or p in spark_files
                or (p.is_relative_to(base) and not any(s.endswith("-packages") for s in p.parts))
            ), f"{p} is on the executors' sys.path: {where}"
    # Two executor JVMs, each with its own working directory and copy of the archive.
    assert rows["cwd"].nunique() == 2, rows["cwd"].unique()


def test_keyed_state_aggregate_with_snapcut_from_the_archive(spark: Any, tmp_path: Path) -> None:
    frames = dwell_frames(files=FILES, rows=2000, users=200, seed=11)
    directory = write_inputs(tmp_path / "events", frames)
    root = tmp_path / "state"
    query = keyed_state(stream(spark, directory), "user", str(root), 4).aggregate(
        count="count", total=("sum", "dwell_ms")
    )
    got = run_to_end(query, tmp_path / "chk")
    assert sorted(got) == list(range(FILES))
    for b in range(FILES):
        totals = pd.concat(frames[: b + 1]).groupby("user")["dwell_ms"].agg(["count", "sum"])
        changed = sorted(int(u) for u in frames[b]["user"].unique())
        want = [
            {"user": u, "count": int(totals.at[u, "count"]), "total": int(totals.at[u, "sum"])}
            for u in changed
        ]
        assert rows_of(got[b].select(["user", "count", "total"]), ["user"]) == want
    # The state, read back in parallel by the executors (snapcut from the archive again).
    state = {
        r["user"]: (r["count"], r.get("total__sum", r.get("total")))
        for r in read_state(spark, str(root)).toArrow().to_pylist()
    }
    everything = pd.concat(frames).groupby("user")["dwell_ms"].agg(["count", "sum"])
    assert state == {int(u): (int(r["count"]), int(r["sum"])) for u, r in everything.iterrows()}
