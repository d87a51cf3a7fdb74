"""PyFlink 2.3 SQL: one configuration, one JSON line (run with bench/peers/.venv-flink).

Input: the bundled `datagen` connector, bounded by `number-of-rows`, `random`
kind (a `sequence` field would store its remaining sequence in every
checkpoint), `rows-per-second` far above what the job can do (the default is
10 000 rows/s): `user` uniform in 0..keys-1, `dwell_ms` uniform in 0..9999 —
the distribution of snapcut's generator, not the same bytes.

dwell:         INSERT INTO blackhole SELECT user, COUNT(*), SUM(dwell_ms)
               FROM events GROUP BY user
three-shuffle: two OVER aggregations (PARTITION BY user, then BY dwell_ms;
               ROWS UNBOUNDED PRECEDING on processing time: keyed state,
               every record forwarded, one hash shuffle each) and a GROUP BY
               user — the three keyed stages and three shuffles of
               snapcut's paper job. The sink takes MAX of the OVER results
               so the planner cannot prune them.

Checkpointing: off = no interval; 1s / 100ms = execution.checkpointing.interval,
aligned (Flink's default) or unaligned (`--mode unaligned`), hashmap state
backend, filesystem checkpoint storage in a temporary directory. `--mode
aligned-minibatch` also turns on SQL mini-batch (2 s / 5000 rows) and
two-phase (local-global) aggregation: Flink's own throughput tuning.

Timed: `JobExecutionResult.getNetRuntime()` — the job from start to finish on
the local mini-cluster, excluding JVM start-up, planning and submission
(reported apart: `startup_s`, `wall_s`). With checkpoints, a bounded job
waits for one last checkpoint after its sources end (Flink 1.15+ default),
which is included.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

MODES = ("aligned", "unaligned", "aligned-minibatch")


def source_ddl(records: int, keys: int) -> str:
    return f"""
        CREATE TEMPORARY TABLE events (
            `user` BIGINT,
            dwell_ms BIGINT,
            proctime AS PROCTIME()
        ) WITH (
            'connector' = 'datagen',
            'number-of-rows' = '{records}',
            'rows-per-second' = '1000000000000',
            'fields.user.kind' = 'random',
            'fields.user.min' = '0',
            'fields.user.max' = '{keys - 1}',
            'fields.dwell_ms.kind' = 'random',
            'fields.dwell_ms.min' = '0',
            'fields.dwell_ms.max' = '9999'
        )"""


DWELL = (
    """
    CREATE TEMPORARY TABLE sink (`user` BIGINT, cnt BIGINT, total BIGINT)
    WITH ('connector' = 'blackhole')
""",
    """
    INSERT INTO sink SELECT `user`, COUNT(*), SUM(dwell_ms) FROM events GROUP BY `user`
""",
)

THREE_SHUFFLE = (
    """
    CREATE TEMPORARY TABLE sink (
        `user` BIGINT, cnt BIGINT, avg_dwell BIGINT, c1 BIGINT, c2 BIGINT
    ) WITH ('connector' = 'blackhole')
""",
    """
    INSERT INTO sink
    SELECT `user`, COUNT(*), AVG(dwell_ms), MAX(c1 + t1), MAX(c2 + u2)
    FROM (
        SELECT `user`, dwell_ms, c1, t1,
               COUNT(*) OVER w2 AS c2, MAX(`user`) OVER w2 AS u2
        FROM (
            SELECT `user`, dwell_ms, proctime,
                   COUNT(*) OVER w1 AS c1, SUM(dwell_ms) OVER w1 AS t1
            FROM events
            WINDOW w1 AS (PARTITION BY `user` ORDER BY proctime
                          ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
        )
        WINDOW w2 AS (PARTITION BY dwell_ms ORDER BY proctime
                      ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
    )
    GROUP BY `user`
""",
)


def main(argv: list[str] | None = None) -> None:
    args = common.parser("flink", MODES, "aligned").parse_args(argv)
    from importlib.metadata import version

    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    interval = common.INTERVAL_S[args.checkpointing]
    work = Path(tempfile.mkdtemp(prefix="peers-flink-", dir=args.workdir))
    chk = work / "checkpoints"
    chk.mkdir()
    conf = Configuration()
    conf.set_string("python.executable", sys.executable)
    conf.set_string("parallelism.default", str(args.parallelism))
    conf.set_string("table.exec.resource.default-parallelism", str(args.parallelism))
    conf.set_string("state.backend.type", "hashmap")
    conf.set_string("execution.checkpointing.dir", chk.as_uri())
    conf.set_string("taskmanager.memory.process.size", "2g")
    if interval is not None:
        conf.set_string("execution.checkpointing.interval", f"{int(interval * 1000)} ms")
        conf.set_string(
            "execution.checkpointing.unaligned.enabled", str(args.mode == "unaligned").lower()
        )
    if args.mode == "aligned-minibatch":
        conf.set_string("table.exec.mini-batch.enabled", "true")
        conf.set_string("table.exec.mini-batch.allow-latency", "2 s")
        conf.set_string("table.exec.mini-batch.size", "5000")
        conf.set_string("table.optimizer.agg-phase-strategy", "TWO_PHASE")

    t0 = time.perf_counter()
    try:
        env = TableEnvironment.create(
            EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(conf).build()
        )
        sink_ddl, insert = DWELL if args.job == "dwell" else THREE_SHUFFLE
        env.execute_sql(source_ddl(args.records, args.keys))
        env.execute_sql(sink_ddl)
        startup = time.perf_counter() - t0
        with common.DirWatcher(chk, r"chk-(\d+)") as watch:
            submitted = time.perf_counter()
            result = env.execute_sql(insert)
            client = result.get_job_client()
            assert client is not None
            done = client.get_job_execution_result().result()
            wall = time.perf_counter() - submitted
        net_s = done.get_net_runtime() / 1000.0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    common.emit(
        args,
        "flink",
        seconds=net_s,
        timed="JobExecutionResult.getNetRuntime(): job start to finish on the mini-cluster",
        wall_s=wall,
        startup_s=startup,
        checkpoints=watch.max_id,
        checkpoints_note="highest chk-N seen in the checkpoint dir (polled every 50 ms; "
        "includes the final checkpoint after the sources end)",
        checkpoint_bytes=watch.max_bytes,
        checkpoint_bytes_note="largest size of the checkpoint dir seen during the run "
        "(Flink deletes it when the job finishes)",
        versions={"apache-flink": version("apache-flink")},
    )


if __name__ == "__main__":
    main()
