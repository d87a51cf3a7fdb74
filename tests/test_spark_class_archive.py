"""scripts/spark_class_archive.py (CI's class archive for the test JVMs) fails
with a message naming the problem, not a traceback or an archive missing
later: called wrongly, or when its JVM does not start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "spark_class_archive.py"


def run_script(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, **env},
    )


def test_without_an_archive_path_it_prints_its_usage() -> None:
    done = run_script()
    assert done.returncode == 2
    assert "usage: python scripts/spark_class_archive.py ARCHIVE" in done.stderr


def test_a_jvm_that_does_not_start_is_named_with_its_options(tmp_path: Path) -> None:
    archive = tmp_path / "classes" / "spark.jsa"
    done = run_script(str(archive), JDK_JAVA_OPTIONS="-XX:+NoSuchSnapcutOption")
    assert done.returncode == 1, done.stderr
    assert "spark_class_archive: Spark did not start" in done.stderr, done.stderr
    assert "-XX:+NoSuchSnapcutOption" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert not archive.exists()
