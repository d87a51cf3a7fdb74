"""The README's main job: `snapcut demo` on Spark — a driver SIGKILLed
midway and restarted, the result verified against pandas — and the check
it relies on catching wrong results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from tests.spark_support import child_env

from snapcut.demo.spark import compare, event_frames, expected_per_user


# A kill-and-restart harness: at nice 10 beside scripts/test.sh's priority
# stream its query waited past the demo's 180 s for a first micro-batch
# (fresh27), so it runs in that stream (the Connect case with the port's tests).
@pytest.mark.full_priority
@pytest.mark.parametrize(
    "remote",
    [None, pytest.param("local[2,4]", marks=pytest.mark.connect_server)],
    ids=["classic", "connect"],
)
def test_demo_kills_restarts_and_verifies(tmp_path: Path, remote: str | None) -> None:
    """The demo on a classic driver, and on Spark Connect (a local Connect
    server in the query's process, SIGKILLed with it)."""
    work = tmp_path / "demo"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "snapcut", "demo", "--dir", str(work)),
            *("--files", "4", "--rows", "4000", "--users", "200", "--kill-after", "2"),
            *("--every", "0.5"),
            *(() if remote is None else ("--remote", remote)),
        ],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "SIGKILLed the Spark driver's process group after batches [0, 1" in done.stdout
    assert "verified: all 200 users' count, total and average" in done.stdout
    # One file per micro-batch, except that a restart may fold files into one
    # batch: when the kill lands after Spark logged a batch's file but before its
    # offsets, the restarted available-now query plans that batch afresh (seen
    # once: batch 2 read files 2 and 3). What must hold: committed batches
    # 0..n-1 with no gap, and every event read exactly once across them.
    batches = sorted(p.parent.name for p in (work / "output").glob("chk-*/manifest.json"))
    assert 3 <= len(batches) <= 4
    assert batches == [f"chk-{b:08d}" for b in range(len(batches))]
    rows_in = [
        json.loads((work / "state" / b / "manifest.json").read_text())["spark"]["rows_in"]
        for b in batches
    ]
    assert sum(rows_in) == 4 * 4000 and all(n % 4000 == 0 and n > 0 for n in rows_in)
    assert (work / "logs" / "query-2.log").exists()


def test_the_check_catches_a_wrong_lost_or_doubled_user() -> None:
    frames = event_frames(files=2, rows=300, users=20, seed=3)
    expected = expected_per_user(frames)
    right = pa.Table.from_pandas(expected.reset_index(), preserve_index=False)
    assert compare(right, expected) == []
    wrong = expected.copy()
    wrong.loc[wrong.index[0], "total"] += 1
    wrong_table = pa.Table.from_pandas(wrong.reset_index())
    assert any("got count" in p for p in compare(wrong_table, expected))
    lost = right.slice(1)
    assert any("missing from the output" in p for p in compare(lost, expected))
    doubled = pa.concat_tables([right, right.slice(0, 1)])
    assert any("more than one row" in p for p in compare(doubled, expected))
    extra = pd.concat([expected, expected.iloc[:1].rename(index=lambda _: 999)])
    extra_table = pa.Table.from_pandas(extra.reset_index())
    assert any("not in the events" in p for p in compare(extra_table, expected))


def test_the_spark_tools_refuse_a_remote_they_cannot_use(tmp_path: Path) -> None:
    demo = [sys.executable, "-m", "snapcut", "demo", "--dir", str(tmp_path / "d")]
    done = subprocess.run(
        [*demo, "--remote", "sc://elsewhere:15002"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "use --remote local[N]" in done.stderr, done.stderr
    assert not (tmp_path / "d").exists()
    rescale = [sys.executable, "-m", "snapcut", "spark", "rescale", str(tmp_path / "a")]
    rescale += ["--to", str(tmp_path / "b"), "--partitions", "2", "--remote", "yarn"]
    done = subprocess.run(rescale, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "is not a Spark Connect URL" in done.stderr, done.stderr
