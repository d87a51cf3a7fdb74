"""`snapcut chaos`: the command line of the chaos harnesses
(:mod:`snapcut.chaos.local`, :mod:`snapcut.chaos.fan_out`,
:mod:`snapcut.chaos.spark`, :mod:`snapcut.chaos.spark_chain`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from snapcut._core import ConfigError
from snapcut.chaos import local
from snapcut.chaos.core import Summary
from snapcut.chaos.fan_out import FanOutOptions, run_fan_out_chaos
from snapcut.chaos.local import (
    DEFAULT_JOB_SECONDS,
    DEFAULT_MAX_KILLS,
    DEFAULT_RECORDS,
    FAILPOINTS,
    KILL_MODES,
    PROTOCOLS,
    Options,
    run_chaos,
)
from snapcut.checkpointing import FAILOVER_STRATEGIES
from snapcut.jobs.spark_dwell import STEPS

if TYPE_CHECKING:
    from snapcut.chaos.spark import SparkOptions
    from snapcut.chaos.spark_chain import ChainOptions

ENGINES = ("local", "spark")
TOPOLOGIES = ("dwell", "fan-out", "chain")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "chaos",
        help="kill the dwell-time job at random moments and crash points; check exactly-once",
        description=local.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--engine",
        default="local",
        choices=ENGINES,
        help="the local runtime (default) or Spark (snapcut.spark.chaos)",
    )
    p.add_argument(
        "--protocol", default=None, help=f"local: one of {', '.join(PROTOCOLS)} (default aligned)"
    )
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--records",
        type=int,
        default=None,
        help=f"events per run (default: local {DEFAULT_RECORDS}, spark 10000 over --files files)",
    )
    p.add_argument("--users", type=int, default=200)
    p.add_argument(
        "--job-seconds",
        type=float,
        default=None,
        help=f"local: throttle each job to about this long (default {DEFAULT_JOB_SECONDS})",
    )
    p.add_argument(
        "--max-kills",
        type=int,
        default=None,
        help=f"kills per run: 1..N from the seed (default: local {DEFAULT_MAX_KILLS}, spark 2)",
    )
    p.add_argument("--workdir", default=None, help="where runs write (default: a temp dir)")
    p.add_argument(
        "--failpoints",
        default=None,
        help="comma-separated crash points to choose from (default: every one of the engine)",
    )
    p.add_argument(
        "--kill-mode",
        default="mixed",
        choices=(*KILL_MODES, "executor"),
        help="random moments, crash points, or a seeded mix of both (default); spark: "
        "'executor' kills executor JVMs (needs --master local-cluster[...])",
    )
    p.add_argument("--keep", action="store_true", help="keep every run's directory")
    p.add_argument(
        "--unsafe-sink",
        action="store_true",
        help="local: write events non-transactionally (shows the checker catching duplicates)",
    )
    p.add_argument(
        "--no-fsync",
        action="store_true",
        help="local: checkpoints are not fsynced (they survive kills, not an OS crash)",
    )
    p.add_argument(
        "--full-every",
        type=int,
        default=None,
        help="local dwell: the job's Checkpointing.full_every (its store compacts a task's "
        "runs once this many diffs sit on its full; default 10); with more --users than an "
        "interval touches and --failpoints "
        "compaction.sorted_copy,compaction.before_rename,compaction.adopted, "
        "kills land inside compactions",
    )
    p.add_argument(
        "--state-memory",
        default=None,
        help="the dwell job's memory budget for its state (e.g. 1MB; default: none): local, "
        "its Checkpointing.state_memory; Spark, keyed_state(state_memory=), each Python "
        "worker's (at least 2MB). With many --users the state spills and merges runs "
        "mid-run, and the crash points spill.after_run,spill.merged kill inside them (on "
        "Spark they join the default points, with input.part_sent: a batch past a quarter "
        "of the budget applied in parts, one part's output sent)",
    )
    p.add_argument(
        "--keyed-state",
        default=None,
        choices=("aggregate", "process"),
        help="local dwell: what keeps the per-user state, the built-in keyed aggregate "
        "(default) or a Python keyed process (key_by().process(fn), its running rows "
        "checked: each user's largest count row must be its failure-free count/total/mean, "
        "none repeated); with --state-memory its pickles spill",
    )
    p.add_argument(
        "--state-root",
        default=None,
        metavar="local|s3",
        help="spark: where the query's state root lives: the run's directory (local, the "
        "default) or a bucket of moto's S3 server on 127.0.0.1 that the harness starts "
        "(s3; needs moto[server], in snapcut[test]): no renames, manifests last, and a cold "
        "task reads through the run cache",
    )
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.add_argument(
        "--topology",
        default="dwell",
        choices=TOPOLOGIES,
        help="local: the dwell-time job killed whole (default), or one source fanning out to "
        "four sinks with one sink task failing per run (snapcut.chaos.fan_out); spark: the "
        "dwell query (default), or 'chain': the dwell query A and a query B reading A's sink "
        "root as a stream, in one driver killed whole (snapcut.chaos.spark_chain)",
    )
    p.add_argument(
        "--failover",
        default=None,
        choices=FAILOVER_STRATEGIES,
        help="local: which tasks a task failure restarts (default: dwell region, fan-out upstream)",
    )
    p.add_argument(
        "--process-kills",
        action="store_true",
        help="fan-out: also SIGKILL the job's process once per run (per --kill-mode) and "
        "resume it from its checkpoint",
    )
    spark = p.add_argument_group("--engine spark")
    spark.add_argument("--files", type=int, default=None, help="input parquet files (default 5)")
    spark.add_argument(
        "--files-per-batch", type=int, default=None, help="maxFilesPerTrigger (default 1)"
    )
    spark.add_argument("--partitions", type=int, default=None, help="state partitions (default 3)")
    spark.add_argument(
        "--master",
        default=None,
        help="Spark master (default local[2,4]); local-cluster[2,1,1024] adds executor kills",
    )
    spark.add_argument(
        "--remote",
        default=None,
        metavar="local[N,F]",
        help="run the job on Spark Connect: a local Connect server in the job's process tree "
        "(killed with it), instead of a classic driver on --master; e.g. local[2,4]",
    )
    spark.add_argument(
        "--step",
        choices=STEPS,
        default=None,
        help="the job's stateful step: snapcut's aggregate (default), a StatefulProcessor "
        "with value, list and map state through transform_with_state_in_pandas (tws), a "
        "level-2 function (map_batches) or a level-3 one (apply_in_pandas_with_state)",
    )
    spark.add_argument(
        "--session-gap",
        type=int,
        default=None,
        metavar="SECONDS",
        help="with --step map_batches or apply_in_pandas_with_state: the function sets an "
        "event-time timeout, and a user's totals close (emitted once more, state removed) "
        "once the watermark passes its last event by this many seconds; the calls for "
        "timed-out keys are then checked too (summary: keys_timed_out)",
    )
    spark.add_argument(
        "--output",
        default=None,
        metavar="arrow|delta|iceberg",
        help="where the sink's rows go: its root (arrow, default), or merged by user into a "
        "Delta table or an Iceberg table (SQLite catalog) under the run's directory; the "
        "summary adds the table's commits per batch",
    )
    p.set_defaults(handler=main)


def cli_log(args: argparse.Namespace) -> Callable[[str], None]:
    """Progress lines on stdout, or nothing with ``--quiet``."""
    return (lambda _: None) if args.quiet else (lambda m: print(m, flush=True))


def finish(summary: Summary) -> int:
    """Prints the summary as the last line of stdout; the exit code."""
    print(summary.to_json(), flush=True)
    return 0 if summary.ok else 1


def main(args: argparse.Namespace) -> int:
    summary: Summary
    try:
        if args.topology == "chain":
            from snapcut.chaos import spark_chain

            summary = spark_chain.run_chain_chaos(chain_options(args), cli_log(args))
        elif args.engine == "spark":
            # Spark's harness imports pyspark and pandas (the `spark` extra): only when asked.
            from snapcut.chaos import spark as spark_chaos

            summary = spark_chaos.run_spark_chaos(spark_options(args), cli_log(args))
        elif args.topology == "fan-out":
            summary = run_fan_out_chaos(fan_out_options(args), cli_log(args))
        else:
            summary = run_chaos(local_options(args), cli_log(args))
    except ConfigError as e:
        print(f"snapcut chaos: {e}", file=sys.stderr)
        return 2
    return finish(summary)


def refuse_spark_flags(args: argparse.Namespace) -> None:
    spark_flags = (
        "files",
        "files_per_batch",
        "partitions",
        "master",
        "remote",
        "step",
        "session_gap",
        "output",
        "state_root",
    )
    for flag in spark_flags:
        if getattr(args, flag) is not None:
            raise ConfigError(f"--{flag.replace('_', '-')} applies to --engine spark only")
    if args.kill_mode not in KILL_MODES:
        raise ConfigError(f"--kill-mode {args.kill_mode} applies to --engine spark only")


def fan_out_options(args: argparse.Namespace) -> FanOutOptions:
    """The fan-out topology's options; flags of the other jobs are refused."""
    refuse_spark_flags(args)
    for flag, given in (
        ("--max-kills", args.max_kills is not None),
        ("--failpoints", args.failpoints is not None),
        ("--unsafe-sink", args.unsafe_sink),
        ("--no-fsync", args.no_fsync),
        ("--full-every", args.full_every is not None),
        ("--state-memory", args.state_memory is not None),
        ("--keyed-state", args.keyed_state is not None),
    ):
        if given:
            raise ConfigError(f"{flag} applies to --topology dwell only")
    return FanOutOptions(
        protocol=args.protocol or "aligned",
        failover=args.failover or "upstream",
        runs=args.runs,
        seed=args.seed,
        records=DEFAULT_RECORDS if args.records is None else args.records,
        users=args.users,
        job_seconds=DEFAULT_JOB_SECONDS if args.job_seconds is None else args.job_seconds,
        process_kills=args.process_kills,
        kill_mode=args.kill_mode,
        workdir=args.workdir,
        keep=args.keep,
    )


def local_options(args: argparse.Namespace) -> Options:
    """The local engine's options; Spark-only flags are refused."""
    refuse_spark_flags(args)
    if args.process_kills:
        raise ConfigError("--process-kills applies to --topology fan-out (dwell always kills)")
    failpoints = FAILPOINTS if args.failpoints is None else args.failpoints.split(",")
    return Options(
        protocol=args.protocol or "aligned",
        runs=args.runs,
        seed=args.seed,
        records=DEFAULT_RECORDS if args.records is None else args.records,
        users=args.users,
        workdir=args.workdir,
        max_kills=DEFAULT_MAX_KILLS if args.max_kills is None else args.max_kills,
        job_seconds=DEFAULT_JOB_SECONDS if args.job_seconds is None else args.job_seconds,
        unsafe_sink=args.unsafe_sink,
        fsync=not args.no_fsync,
        keep=args.keep,
        kill_mode=args.kill_mode,
        failpoints=tuple(f.strip() for f in failpoints if f.strip()),
        failover=args.failover or "region",
        full_every=10 if args.full_every is None else args.full_every,
        state_memory=args.state_memory,
        keyed_state=args.keyed_state or "aggregate",
    )


def chain_options(args: argparse.Namespace) -> ChainOptions:
    """``--engine spark --topology chain``: timed kills of the driver only."""
    from snapcut.chaos.spark_chain import ChainOptions

    if args.engine != "spark":
        raise ConfigError("--topology chain runs on Spark: add --engine spark")
    for flag, given in (
        ("--protocol", args.protocol is not None),
        ("--failover", args.failover is not None),
        ("--process-kills", args.process_kills),
        ("--job-seconds", args.job_seconds is not None),
        ("--unsafe-sink", args.unsafe_sink),
        ("--no-fsync", args.no_fsync),
        ("--full-every", args.full_every is not None),
        ("--state-memory", args.state_memory is not None),
        ("--keyed-state", args.keyed_state is not None),
        ("--failpoints", args.failpoints is not None),
        ("--remote", args.remote is not None),
        ("--step", args.step is not None),
        ("--session-gap", args.session_gap is not None),
        ("--output", args.output is not None),
        ("--state-root", args.state_root is not None),
    ):
        if given:
            raise ConfigError(f"{flag} does not apply to --topology chain")
    if args.kill_mode not in ("mixed", "timer"):
        raise ConfigError(
            f"--topology chain kills the driver at random moments only: --kill-mode "
            f"{args.kill_mode} does not apply (leave it out)"
        )
    defaults = ChainOptions()

    def pick(value: Any, default: Any) -> Any:
        return default if value is None else value

    return ChainOptions(
        runs=args.runs,
        seed=args.seed,
        files=pick(args.files, defaults.files),
        records=pick(args.records, defaults.records),
        users=args.users,
        partitions=pick(args.partitions, defaults.partitions),
        files_per_batch=pick(args.files_per_batch, defaults.files_per_batch),
        master=pick(args.master, defaults.master),
        max_kills=pick(args.max_kills, defaults.max_kills),
        workdir=args.workdir,
        keep=args.keep,
    )


def spark_options(args: argparse.Namespace) -> SparkOptions:
    """The Spark engine's options; local-only flags are refused."""
    from snapcut.chaos.spark import SparkOptions
    from snapcut.spark.roots import PROTOCOL

    if args.protocol is not None:
        raise ConfigError(
            f"--protocol applies to --engine local; on Spark each micro-batch is the "
            f"snapshot ({PROTOCOL})"
        )
    if args.topology != "dwell" or args.failover is not None or args.process_kills:
        raise ConfigError("--topology, --failover and --process-kills apply to --engine local only")
    local_only = (args.job_seconds, args.full_every, args.keyed_state)
    if any(v is not None for v in local_only) or args.unsafe_sink or args.no_fsync:
        raise ConfigError(
            "--job-seconds, --unsafe-sink, --no-fsync, --full-every and --keyed-state apply "
            "to --engine local only"
        )
    defaults = SparkOptions()
    # None: every crash point the output reaches (SparkOptions.points).
    points = (
        None
        if args.failpoints is None
        else tuple(f.strip() for f in args.failpoints.split(",") if f.strip())
    )

    def pick(value: Any, default: Any) -> Any:
        return default if value is None else value

    return SparkOptions(
        runs=args.runs,
        seed=args.seed,
        files=pick(args.files, defaults.files),
        records=pick(args.records, defaults.records),
        users=args.users,
        partitions=pick(args.partitions, defaults.partitions),
        files_per_batch=pick(args.files_per_batch, defaults.files_per_batch),
        master=pick(args.master, defaults.master),
        remote=args.remote,
        max_kills=pick(args.max_kills, defaults.max_kills),
        kill_mode=args.kill_mode,
        failpoints=points,
        workdir=args.workdir,
        keep=args.keep,
        step=pick(args.step, defaults.step),
        session_gap=args.session_gap,
        output=pick(args.output, defaults.output),
        state_memory=args.state_memory,
        state_root=pick(args.state_root, defaults.state_root),
    )
