"""A client-only environment: a venv with ``snapcut[spark-client]``
(pyspark-client, no pyspark jars, no JVM) imports ``snapcut.spark`` and runs
a keyed_state + ArrowSnapshotSink query against a Spark Connect server of
its own (``SparkConnectServer`` from this venv's pyspark, whose foreachBatch
worker and executors import snapcut from here). The client sees the
committed output and the sink's history; the output equals pandas."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from tests.spark_support import child_env, write_inputs

REPO = Path(__file__).resolve().parents[2]
SERVER_START_S = 180.0
"""Bound on the Connect server's start-up (a JVM on a loaded 2-vCPU machine)."""


@pytest.fixture(scope="module")
def client_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with pyspark-client and snapcut: CI's wheel with the
    spark-client extra (SNAPCUT_WHEEL, see scripts/test.sh), else this
    checkout's package on PYTHONPATH with the extra's requirements."""
    venv = tmp_path_factory.mktemp("client") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    wheel = os.environ.get("SNAPCUT_WHEEL")
    if wheel:
        wanted = [f"{wheel}[spark-client]"]
    else:
        meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
        wanted = [*meta["dependencies"], *meta["optional-dependencies"]["spark-client"]]
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", *wanted], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return python


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import pyspark

    home = Path(pyspark.__file__).parent
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    cmd = [
        str(home / "bin" / "spark-submit"),
        "--class",
        "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--master",
        "local[2,4]",
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.shuffle.partitions=2",
    ]
    env = child_env(SPARK_HOME=str(home), PYSPARK_PYTHON=sys.executable)
    with log.open("wb") as out:
        server = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + SERVER_START_S
        while "SparkConnectService' on port" not in log.read_text(errors="replace"):
            assert server.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"no Connect server after {SERVER_START_S} s"
            time.sleep(0.5)
        yield f"sc://localhost:{port}"
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


def test_a_client_without_a_jvm_runs_keyed_state_and_the_sink(
    client_python: Path, connect_url: str, tmp_path: Path
) -> None:
    frames = [
        pd.DataFrame({"user": [1, 2, 3, i], "dwell_ms": [10, 20, 30, 100 + i]}) for i in range(3)
    ]
    write_inputs(tmp_path / "in", frames)
    env = {k: v for k, v in child_env().items() if k not in ("PYTHONPATH", "SPARK_HOME")}
    if not os.environ.get("SNAPCUT_WHEEL"):
        env["PYTHONPATH"] = str(REPO / "python")
    script = Path(__file__).parent / "connect_client" / "client_query.py"
    done = subprocess.run(
        [str(client_python), str(script), connect_url, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["client"] == "pyspark.sql.connect.session" and not seen["pyspark_has_jars"]
    events = pd.concat(frames)
    g = events.groupby("user")["dwell_ms"].agg(["count", "sum"])
    assert seen["output"] == [[int(u), int(r["count"]), int(r["sum"])] for u, r in g.iterrows()]
    assert [h[0] for h in seen["history"]] == [0, 1, 2]
    assert [h[2] for h in seen["history"]] == [0, 1, 2]  # each with its state version
    assert seen["spark_reader_rows"] == len(seen["output"])  # update mode: newest per key
