"""The run loop the chaos harnesses share (``snapcut.chaos.core``): its error
policy (which errors fail a run, which stop the harness), restarts, the
missed-kill redo, and each harness applying that one policy. No Spark."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from snapcut import (
    ChannelClosedError,
    ConfigError,
    GraphError,
    ObjectStoreError,
    SnapshotError,
    StorageError,
    TaskError,
)
from snapcut.chaos import fan_out
from snapcut.chaos import local as chaos
from snapcut.chaos.core import (
    ChaosError,
    Check,
    Outcome,
    Summary,
    fails_the_run,
    restart_until_done,
    run_campaign,
)
from snapcut.jobs import local_fan_out

#: Errors a run may raise that fail the run: the job misbehaved, or snapcut
#: failed running it or reading what it committed.
RUN_FAILURES: list[Exception] = [
    ChaosError("the child exited with 1"),
    TaskError("operator 'agg' failed"),
    SnapshotError("manifest missing"),
    StorageError("disk read failed"),
    ObjectStoreError("bucket refused"),
    GraphError("malformed graph"),
    ChannelClosedError("closed"),
]

#: Errors that are the harness's own (or its options'): raised, never counted.
HARNESS_ERRORS: list[Exception] = [
    ConfigError("runs must be an int >= 1"),
    TypeError("a harness bug"),
    KeyError("restarts"),
    ValueError("not JSON"),
    OSError(28, "No space left on device"),
    FileNotFoundError("java"),
    AssertionError("unreachable"),
    pa.ArrowInvalid("not an Arrow file"),
]


def ids(errors: list[Exception]) -> list[str]:
    return [type(e).__name__ for e in errors]


@pytest.mark.parametrize("error", RUN_FAILURES, ids=ids(RUN_FAILURES))
def test_these_errors_fail_the_run(error: Exception) -> None:
    assert fails_the_run(error)


@pytest.mark.parametrize("error", HARNESS_ERRORS, ids=ids(HARNESS_ERRORS))
def test_these_errors_are_harness_errors(error: Exception) -> None:
    assert not fails_the_run(error)


def fail_on(run: int, error: BaseException, calls: list[int]) -> Callable[[int, Path], Check]:
    """A harness's run_one: makes its directory, raises `error` on `run`."""

    def run_one(n: int, run_dir: Path) -> Check:
        calls.append(n)
        run_dir.mkdir(parents=True)
        if n == run:
            raise error
        return Check()

    return run_one


def campaign(tmp_path: Path, run_one: Callable[[int, Path], Check], logs: list[str]) -> Summary:
    return run_campaign(
        Summary(protocol="p"),
        3,
        run_one,
        name="p",
        workdir=str(tmp_path),
        keep=False,
        log=logs.append,
    )


@pytest.mark.parametrize("error", RUN_FAILURES, ids=ids(RUN_FAILURES))
def test_a_failed_run_is_counted_kept_and_the_next_run_starts(
    tmp_path: Path, error: Exception
) -> None:
    calls: list[int] = []
    logs: list[str] = []
    s = campaign(tmp_path, fail_on(1, error, calls), logs)
    assert calls == [0, 1, 2]
    assert (s.runs, s.errors, s.failed_runs, s.ok) == (2, 1, [1], False), s
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p-run-0001"]  # clean runs removed
    assert logs[1] == f"run 1: ERROR {error} (kept in {tmp_path / 'p-run-0001'})", logs


@pytest.mark.parametrize("error", HARNESS_ERRORS, ids=ids(HARNESS_ERRORS))
def test_a_harness_error_stops_the_campaign(tmp_path: Path, error: Exception) -> None:
    calls: list[int] = []
    summary = Summary(protocol="p")
    with pytest.raises(type(error)) as raised:
        run_campaign(
            summary,
            3,
            fail_on(1, error, calls),
            name="p",
            workdir=str(tmp_path),
            keep=False,
            log=lambda _: None,
        )
    assert raised.value is error
    assert calls == [0, 1] and summary.errors == 0 and summary.failed_runs == []


def test_an_interrupt_is_never_counted(tmp_path: Path) -> None:
    calls: list[int] = []
    with pytest.raises(KeyboardInterrupt):
        campaign(tmp_path, fail_on(0, KeyboardInterrupt(), calls), [])
    assert calls == [0]


def scripted(outcomes: list[Outcome], calls: list[int]) -> Callable[[int], Outcome]:
    """An attempt callback ending attempt after attempt as `outcomes` say."""
    script = iter(outcomes)

    def attempt(n: int) -> Outcome:
        calls.append(n)
        return next(script)

    return attempt


def test_a_killed_job_is_restarted_until_it_finishes() -> None:
    calls: list[int] = []
    s = Summary(protocol="p")
    outcomes = [Outcome.KILLED, Outcome.KILLED, Outcome.FINISHED]
    assert restart_until_done(scripted(outcomes, calls), s, planned=2, spare=1) == 3
    assert calls == [0, 1, 2] and s.recoveries == 2


def test_a_job_that_never_finishes_fails_the_run() -> None:
    calls: list[int] = []
    s = Summary(protocol="p")
    with pytest.raises(ChaosError, match="the query did not finish after 4 attempts") as raised:
        restart_until_done(
            scripted([Outcome.KILLED] * 10, calls), s, planned=1, spare=2, what="query"
        )
    assert calls == [0, 1, 2, 3] and s.recoveries == 3
    assert fails_the_run(raised.value)


def test_an_error_in_an_attempt_is_not_a_recovery() -> None:
    def attempt(n: int) -> Outcome:
        if n == 1:
            raise ChaosError("the child exited with 1")
        return Outcome.KILLED

    s = Summary(protocol="p")
    with pytest.raises(ChaosError):
        restart_until_done(attempt, s, planned=1, spare=3)
    assert s.recoveries == 0


def test_a_missed_kill_ends_the_run_unless_it_is_to_be_redone() -> None:
    calls: list[int] = []
    s = Summary(protocol="p")
    assert restart_until_done(scripted([Outcome.MISSED], calls), s, planned=1, spare=0) == 1
    assert calls == [0] and s.recoveries == 0

    calls.clear()
    redos: list[int] = []
    outcomes = [Outcome.MISSED, Outcome.MISSED, Outcome.KILLED, Outcome.FINISHED]
    n = restart_until_done(
        scripted(outcomes, calls), s, planned=1, spare=0, on_missed=lambda: redos.append(1)
    )
    assert n == 2 and calls == [0, 0, 0, 1] and len(redos) == 2 and s.recoveries == 1


def test_a_redo_can_give_up() -> None:
    def give_up() -> None:
        raise ChaosError("4 planned kills missed")

    with pytest.raises(ChaosError, match="planned kills missed"):
        restart_until_done(
            scripted([Outcome.MISSED], []), Summary("p"), planned=1, spare=0, on_missed=give_up
        )


# --- each harness applies the one policy ------------------------------------------


def test_local_counts_a_failed_job_and_raises_a_harness_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def child(error: Exception) -> Callable[..., Any]:
        def run_child(*_: Any) -> Any:
            raise error

        return run_child

    opts = chaos.Options(runs=2, records=200, users=5, workdir=str(tmp_path / "a"))
    monkeypatch.setattr(chaos, "run_child", child(TaskError("the job failed")))
    s = chaos.run_chaos(opts)
    assert (s.errors, s.failed_runs, s.runs) == (2, [0, 1], 0), s

    opts.workdir = str(tmp_path / "b")
    monkeypatch.setattr(chaos, "run_child", child(KeyError("restored_from")))
    with pytest.raises(KeyError):
        chaos.run_chaos(opts)


@pytest.mark.parametrize(
    ("error", "counted"), [(TaskError("sink failed twice"), True), (KeyError("restarts"), False)]
)
def test_fan_out_counts_a_failed_job_and_raises_a_harness_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, counted: bool
) -> None:
    def run(*_: Any, **__: Any) -> dict[str, Any]:
        raise error

    monkeypatch.setattr(local_fan_out, "run", run)
    opts = fan_out.FanOutOptions(runs=2, records=200, users=5, workdir=str(tmp_path))
    if not counted:  # the fan-out harness used to count every exception as a failed run
        with pytest.raises(type(error)):
            fan_out.run_fan_out_chaos(opts)
        return
    s = fan_out.run_fan_out_chaos(opts)
    assert (s.errors, s.failed_runs, s.runs) == (2, [0, 1], 0), s


@pytest.mark.parametrize(
    ("returncode", "counted"), [(1, True), (-9, True), (None, False)], ids=["exit", "kill", "bug"]
)
def test_spark_counts_a_failed_query_and_raises_a_harness_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, returncode: int | None, counted: bool
) -> None:
    pytest.importorskip("pandas")
    from snapcut.chaos import spark

    def run_attempt(
        cmd: list[str], env: dict[str, str], kill: Any, chk: Path, stderr: Path, timeout: float
    ) -> spark.Attempt:
        stderr.write_text("Py4JJavaError: ...\n")
        if returncode is None:
            raise TypeError("a harness bug")
        return spark.Attempt(returncode, None, [], 0.1)

    monkeypatch.setattr(spark, "run_attempt", run_attempt)
    opts = spark.SparkOptions(runs=2, files=2, records=20, users=5, workdir=str(tmp_path))
    if not counted:
        with pytest.raises(TypeError, match="a harness bug"):
            spark.run_spark_chaos(opts)
        return
    s = spark.run_spark_chaos(opts)
    assert (s.errors, s.failed_runs, s.runs, s.attempts) == (2, [0, 1], 0, 2), s


def test_a_torn_spark_offset_log_fails_the_run(tmp_path: Path) -> None:
    pytest.importorskip("pandas")
    from snapcut.chaos import spark

    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text("v1\n")
    with pytest.raises(SnapshotError, match="not a Spark offset log entry") as raised:
        spark.read_plan(tmp_path, ["part-00000.parquet"])
    assert fails_the_run(raised.value)
    (tmp_path / "offsets" / "0").write_text('v1\n{"batchWatermarkMs": 0}\n-\n{"logOffset": 0}')
    with pytest.raises(ChaosError, match=r"expected one file source offset, got \[None, "):
        spark.read_plan(tmp_path, ["part-00000.parquet"])
