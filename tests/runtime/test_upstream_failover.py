"""failover="upstream" through the Python API: a failed sink restarts with its
upstream only, the job's other sinks keep running, and every sink's output
equals a failure-free run; an upstream that is the whole job falls back to
the region and says so; bad failure specifications are refused by name."""

from __future__ import annotations

import collections
from pathlib import Path

import pyarrow as pa
import pytest

from snapcut import Checkpointing, ConfigError, Dataflow, TaskFailure
from snapcut.chaos.fan_out import check_output, reference
from snapcut.jobs import local_fan_out as job

RECORDS, USERS, SEED = 8_000, 40, 5


def params(out: Path) -> job.Params:
    return job.Params(RECORDS, USERS, SEED, batch_size=100, throttle_ms=1.0, output_dir=str(out))


def checkpointing(failover: str = "upstream", protocol: str = "aligned") -> Checkpointing:
    return Checkpointing(
        protocol=protocol,
        interval=0.01,
        retained=2,
        restart_attempts=1,
        restart_delay=0,
        failover=failover,
    )


@pytest.mark.parametrize(
    ("protocol", "failure"),
    [
        ("aligned", TaskFailure("arrow-sink", 0, "process", 20)),
        ("unaligned", TaskFailure("collect-memory", 1, "checkpoint", 2)),
        ("chandy-lamport", TaskFailure("idempotent-sink", 0, "commit", 2)),
    ],
)
def test_a_failed_sink_restarts_with_its_upstream_and_every_sink_is_exact(
    tmp_path: Path, protocol: str, failure: TaskFailure
) -> None:
    done = job.run(
        params(tmp_path / "out"),
        checkpointing(protocol=protocol),
        str(tmp_path / "chk"),
        failure=failure,
    )
    (restart,) = done["restarts"]
    failed = f"{failure.operator}-{failure.subtask}"
    assert restart["scope"] == "upstream" and restart["failed"] == failed, restart
    assert restart["fallback"] is None
    assert restart["downtime_s"] is not None and restart["downtime_s"] >= 0
    # The failed sink, the stage subtask feeding it, the throttle, the source.
    assert sorted(restart["tasks"]) == sorted(
        [failed, f"stage-{failure.subtask}", "throttle-0", "events-0"]
    )
    check = check_output(tmp_path / "out", reference(RECORDS, USERS, SEED), check_memory=True)
    assert check.problems == [], check
    dropped = done["replayed_dropped"]
    assert all(dropped[t] == 0 for t in restart["tasks"]), dropped


def test_region_failover_restarts_the_healthy_sinks_too(tmp_path: Path) -> None:
    done = job.run(
        params(tmp_path / "out"),
        checkpointing(failover="region"),
        str(tmp_path / "chk"),
        failure=TaskFailure("arrow-sink", 1, "process", 20),
    )
    (restart,) = done["restarts"]
    assert restart["scope"] == "region"
    sinks = {t.rsplit("-", 1)[0] for t in restart["tasks"]} & set(job.SINKS)
    assert sinks == set(job.SINKS), restart["tasks"]
    check = check_output(tmp_path / "out", reference(RECORDS, USERS, SEED), check_memory=True)
    assert check.problems == [], check


def test_an_upstream_that_is_the_whole_job_restarts_the_region_and_says_why() -> None:
    flow = Dataflow(parallelism=1)
    events = flow.generate_dwell_events(users=10, count=4_000, seed=1, batch_size=100)
    events.map(job.throttle(1.0), name="slow").collect("out")
    report = flow.run(
        checkpointing(),
        inject_failure=TaskFailure("collect-out", 0, "process", 20),
    )
    (restart,) = report.restarts
    assert restart.scope == "region" and restart.region is not None
    assert restart.failed == "collect-out-0"
    assert restart.fallback is not None and "whole job" in restart.fallback
    assert report.results["out"].num_rows == 4_000


def test_a_checker_that_can_fail(tmp_path: Path) -> None:
    out = tmp_path / "out"
    job.run(params(out), checkpointing(), str(tmp_path / "chk"))
    ref = reference(RECORDS, USERS, SEED)
    assert check_output(out, ref, check_memory=True).problems == []
    # A duplicated committed file and a changed idempotent row are caught.
    arrow = sorted((out / "arrow").glob("*.arrow"))[0]
    (out / "arrow" / "copy.arrow").write_bytes(arrow.read_bytes())
    idem = sorted((out / "idempotent").glob("*.arrow"))[0]
    with pa.ipc.open_file(idem) as f:
        t = f.read_all()
    t = t.set_column(t.schema.get_field_index("dwell_ms"), "dwell_ms", pa.array([-1] * len(t)))
    with pa.ipc.new_file(idem, t.schema) as w:
        w.write_table(t)
    c = check_output(out, ref, check_memory=True)
    assert c.duplicated > 0 and c.mismatched == t.num_rows, c


@pytest.mark.parametrize(
    ("failure", "message"),
    [
        (TaskFailure("nope", 0, "process", 1), "no such operator"),
        (TaskFailure("collect-out", 3, "process", 1), "it has 1 subtasks"),
        (TaskFailure("collect-out", 0, "somewhere", 1), "TaskFailure.at must be one of"),
        (TaskFailure("collect-out", 0, "commit", 0), "TaskFailure.nth must be an int >= 1"),
        (TaskFailure("src", 0, "process", 1), "only operators and sinks"),
    ],
)
def test_bad_failures_are_refused_by_name(failure: TaskFailure, message: str) -> None:
    flow = Dataflow(parallelism=1)
    flow.generate_dwell_events(users=3, count=10, seed=1, name="src").collect("out")
    with pytest.raises(ConfigError, match=message):
        flow.run(checkpointing(), inject_failure=failure)


def test_an_unknown_failover_names_the_three() -> None:
    with pytest.raises(ConfigError, match="'region', 'full', 'upstream'"):
        Checkpointing(failover="regional")


def test_the_healthy_tasks_drop_the_replay_and_count_it(tmp_path: Path) -> None:
    # No checkpoint completes before the failure (a 5 s interval): the
    # upstream restarts from the beginning and replays everything it sent.
    cfg = Checkpointing(
        protocol="aligned", interval=5.0, restart_attempts=1, restart_delay=0, failover="upstream"
    )
    done = job.run(
        params(tmp_path / "out"),
        cfg,
        str(tmp_path / "chk"),
        failure=TaskFailure("arrow-sink", 0, "process", 30),
    )
    (restart,) = done["restarts"]
    assert restart["restored_from"] is None and restart["scope"] == "upstream"
    per_vertex = collections.Counter[str]()
    for task, n in done["replayed_dropped"].items():
        per_vertex[task.rsplit("-", 1)[0]] += n
    # stage-1 drops the throttle's replay; the other sinks of stage-0 and
    # the counts drop stage-0's.
    assert {v for v, n in per_vertex.items() if n > 0} == {
        "stage",
        "idempotent-sink",
        "collect-memory",
        "counts",
    }, per_vertex
    check = check_output(tmp_path / "out", reference(RECORDS, USERS, SEED), check_memory=True)
    assert check.problems == [], check
