"""Shared set-up of the pytest-benchmark harness (``pytest bench --benchmark-only``).

- Every benchmark belongs to a group (``@pytest.mark.benchmark(group=...)``): a
  side-by-side comparison, read as ratios within the group (bench/README.md).
  The test marked ``baseline`` in ``extra_info`` is the group's denominator for
  ``bench/compare.py``.
- Machine and load go into the benchmark JSON: a top-level ``"snapcut"`` object
  has the cores, the load average when the session started and when the JSON
  was written, the git commit and the order; ``machine_info["snapcut_cores"]``
  the cores (only stable facts there: --benchmark-compare warns when a saved
  run's machine_info differs); every benchmark's ``extra_info`` has the 1-minute
  load average before and after it.
- ``spark``: one SparkSession for the whole run (local[2], UI off, 2 shuffle
  partitions), started by the first Spark benchmark. The Spark benchmarks carry
  the ``spark`` marker: ``-m "not spark"`` runs the others only.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent

_SESSION_START: dict[str, Any] = {}


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _cores() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bench-reverse",
        action="store_true",
        help="run each bench file's benchmarks in reverse order (a second run with the "
        "order rotated: compare the two with bench/compare.py)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("bench_reverse"):
        return
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(str(item.path), []).append(item)
    items[:] = [item for group in by_file.values() for item in reversed(group)]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "spark: needs a SparkSession (Java 17, pyspark); deselect with -m 'not spark'"
    )
    _SESSION_START.update(load=os.getloadavg(), time=time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def pytest_benchmark_update_machine_info(
    config: pytest.Config, machine_info: dict[str, Any]
) -> None:
    """Only what stays the same between runs on one machine: pytest-benchmark
    warns on --benchmark-compare when a saved run's machine_info differs."""
    machine_info["snapcut_cores"] = _cores()


def pytest_benchmark_update_json(
    config: pytest.Config, benchmarks: Any, output_json: dict[str, Any]
) -> None:
    """The run's facts, top-level ``"snapcut"`` of the JSON (--benchmark-json and
    --benchmark-autosave alike). Called after the benchmarks: the load then is
    the load "after"; the load "before" is the session's start."""
    output_json["snapcut"] = {
        **_cores(),
        "load_before": _SESSION_START.get("load"),
        "load_after": os.getloadavg(),
        "started": _SESSION_START.get("time"),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "node": platform.node(),
        "argv": sys.argv[1:],
        "order": "reverse" if config.getoption("bench_reverse") else "forward",
    }


@pytest.fixture(autouse=True)
def _load_around_benchmark(request: pytest.FixtureRequest) -> Iterator[None]:
    """The 1-minute load average before and after each benchmark, in its extra_info."""
    if "benchmark" not in request.fixturenames:
        yield
        return
    bench = request.getfixturevalue("benchmark")
    bench.extra_info["load_before"] = round(os.getloadavg()[0], 2)
    yield
    bench.extra_info["load_after"] = round(os.getloadavg()[0], 2)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[2] SparkSession for every Spark benchmark of the run."""
    import snapcut

    # Python workers unpickle the bench's functions (bench/spark_state.py) by
    # module name: they need bench/ on their path, and the snapcut the driver
    # imported (a source tree on PYTHONPATH, an editable or a wheel install).
    paths = [str(BENCH), str(Path(snapcut.__file__).resolve().parent.parent)]
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*paths, *inherited]))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

    from spark_state import start_session

    session = start_session(
        driver_memory="2g",
        **{
            "spark.executorEnv.PYTHONPATH": os.environ["PYTHONPATH"],
            "spark.executorEnv.PYSPARK_PYTHON": os.environ["PYSPARK_PYTHON"],
            "spark.sql.streaming.pollingDelay": "10ms",
        },
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def smoke(pytestconfig: pytest.Config) -> bool:
    """True under ``--benchmark-disable``: every benchmark runs its function once,
    as a test, so the benches use small sizes then (CI's smoke run)."""
    return bool(pytestconfig.getoption("benchmark_disable"))
