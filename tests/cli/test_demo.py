import subprocess
import sys

import pyarrow as pa
import pytest

from snapcut.cli import main
from snapcut.demo import local as demo


def test_demo_runs_checks_and_prints_the_metrics_table() -> None:
    out = subprocess.run(
        [
            *(sys.executable, "-m", "snapcut", "demo", "--engine", "local"),
            *("--records", "20000", "--interval", "0.001"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "20,000 events" in out
    assert "result matches plain Python for all 1,000 users" in out
    assert "top 5 users by average dwell time" in out
    table = out[out.index("checkpoints:") :].splitlines()
    assert "duration ms" in table[1] and "max align ms" in table[1]
    assert any("completed" in line and "yes" in line for line in table[3:]), "a final checkpoint"


@pytest.mark.parametrize("protocol", ["unaligned", "chandy-lamport", "sync", "none"])
def test_demo_with_each_protocol(protocol: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            *("demo", "--engine", "local", "--records", "5000"),
            *("--protocol", protocol, "--parallelism", "3"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"protocol {protocol}" in out
    assert "result matches plain Python" in out


def test_demo_reports_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--engine", "local", "--records", "100", "--interval", "-1"]) == 2
    assert "interval must be a finite, non-negative" in capsys.readouterr().err
    assert main(["demo", "--engine", "local", "--records", "100", "--parallelism", "0"]) == 2


def test_check_detects_a_wrong_result() -> None:
    expected = {1: (2, 30), 2: (1, 5)}
    good = pa.table({"user": [2, 1], "count": [1, 2], "total": [5, 30]})
    assert demo.check(good, expected) == []
    bad = pa.table({"user": [1, 3], "count": [2, 1], "total": [31, 1]})
    problems = demo.check(bad, expected)
    assert "user 1: got (2, 31), expected (2, 30)" in problems
    assert "user 2: got None, expected (1, 5)" in problems
    assert "unexpected user 3" in problems
