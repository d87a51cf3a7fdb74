"""Experiment 7 (`spark`): the ABS question on Spark. What does writing a
micro-batch's state snapshot asynchronously buy over stopping for it?

Every cell is one streaming query over the same parquet files: a
`keyed_state` level-1 aggregate per user (count, total of ``dwell_ms``),
two state partitions, into an `ArrowSnapshotSink` in update mode. Its
variants (the cell's `protocol`):

- ``none``: snapshots off: the state lives only in the Python workers'
  memory (`spark_memory_state`) and the sink has no ``state=``;
- ``background``: ``state_writes="background"``: version N is written on a
  thread while the task's output flows on (the asynchronous phase);
- ``sync``: ``state_writes="sync"``: the task writes version N before it
  returns its output (the stop-and-write baseline).

The first file holds every key once (it builds the state, and is not
measured); each later one (the preset's ``spark_batches``) holds an equal
share of the cell's ``records`` over uniform keys (one file per
micro-batch). `state_writes` is fixed per query, so the variants cannot
alternate inside one query: each round runs the three as interleaved
queries (the order rotated by round), and micro-batch i of a variant is
paired with micro-batch i of the same round's ``none``. A cell's overhead is
the median of ``t(variant) / t(none) - 1`` over those pairs, with a 95 %
bootstrap interval clustered by round (`windowed.clustered_median_ci`). The
time of a batch is Spark's ``durationMs.addBatch``: the stateful stage and
the sink's commit, which waits for every state partition's acknowledgement.
"""

from __future__ import annotations

import json
import statistics
import time
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from snapcut._core import ConfigError
from snapcut.experiments.analysis import Summary
from snapcut.experiments.base import Experiment, Timelines
from snapcut.experiments.effects import Effect
from snapcut.experiments.grid import Cell, Preset
from snapcut.experiments.measurement import Measurement
from snapcut.experiments.windowed import clustered_median_ci

NAME = "spark"
VARIANTS = ("none", "background", "sync")
PARTITIONS = 2
PAIRED_BATCHES = "paired batches"
SCHEMA = "user long, dwell_ms long"
SESSION_START_S = 20.0
"""About how long the experiment's Spark session takes to start (estimates)."""


def cells(p: Preset, _protocols: tuple[str, ...] | None) -> list[Cell]:
    """Its variants are state-write modes, not protocols: ``--protocols``
    does not apply."""
    return [
        Cell(NAME, v, None, keys, PARTITIONS, p.spark_records * p.spark_batches)
        for keys in p.spark_keys
        for v in VARIANTS
    ]


def estimate(cell: Cell) -> float:
    """Seconds one query of `cell` takes: a guess from this machine's Spark
    benches (a query ~4 s, building 1M keys ~2 s, 1M measured rows ~1.5 s)."""
    return 4.0 + 2e-6 * cell.keys + 1.5e-6 * cell.records


@cache
def _session() -> Any:
    from snapcut.jobs.spark_session import build_session

    return build_session(
        "snapcut-experiment-spark",
        master=f"local[{PARTITIONS}]",
        conf={"spark.sql.shuffle.partitions": str(PARTITIONS), "spark.driver.memory": "4g"},
    )


def write_inputs(directory: Path, keys: int, records: int, batches: int) -> Path:
    """File 0: every key once; files 1..`batches`: `records` rows each (per
    batch) over uniform keys (seeded). Written once per size; returns the
    directory."""
    done = directory / "_written"
    if done.exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    users = [np.arange(keys, dtype=np.int64)]
    users += [rng.integers(0, keys, records, dtype=np.int64) for _ in range(batches)]
    for i, u in enumerate(users):
        dwell = rng.integers(1, 10_000, len(u), dtype=np.int64)
        pq.write_table(
            pa.table({"user": u, "dwell_ms": dwell}), directory / f"part-{i:05d}.parquet"
        )
    done.write_text("")
    return directory


def run_query(spark: Any, variant: str, src: Path, work: Path, tag: str) -> list[float]:
    """One query of `variant` over `src` to its end; the seconds of each
    micro-batch after the first (which builds the state)."""
    from snapcut.experiments.spark_memory_state import in_memory
    from snapcut.spark import ArrowSnapshotSink, keyed_state

    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(src))
    chk = str(work / "chk" / tag)
    if variant == "none":
        ks: Any = in_memory(df, "user", tag, PARTITIONS)
        state = None
    else:
        ks = keyed_state(df, "user", str(work / "state" / tag), PARTITIONS, state_writes=variant)
        state = ks
    sink = ArrowSnapshotSink(
        str(work / "out" / tag),
        output_mode="update",
        key="user",
        state=state,
        checkpoint_location=chk,
    )
    out = ks.aggregate(count="count", total=("sum", "dwell_ms"))
    q = (
        out.writeStream.foreachBatch(sink)
        .outputMode("update")
        .option("checkpointLocation", chk)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    progress = [p for p in q.recentProgress if p.numInputRows > 0]
    times = [p["durationMs"]["addBatch"] / 1000 for p in progress]
    if len(times) < 2:
        raise ConfigError(
            f"experiment {NAME}: query {tag} ran {len(times)} micro-batches with rows; it needs "
            "the state-building one and at least one measured one (spark_batches >= 1)"
        )
    return times[1:]


def state_writes(root: Path) -> tuple[list[float], int]:
    """Per committed version after the first: the state write's ms (the
    manifests' ``spark.write_ms``); and the most state bytes a version
    wrote (``spark.state_bytes``), read from the same manifests once."""
    manifests = [json.loads(m.read_text()) for m in sorted(root.glob("chk-*/manifest.json"))]
    if not manifests:
        raise ConfigError(f"experiment {NAME}: no committed state version under {root}")
    written = max(int(m["spark"]["state_bytes"]) for m in manifests)
    return [float(m["spark"]["write_ms"]) for m in manifests[1:]], written


def simulate(cell: Cell, _rows: list[Any], preset: Preset, workdir: Path) -> Measurement:
    """Runs `cell`'s query (the grid's hook for a cell that is not a job of
    the local runtime)."""
    if cell.protocol not in VARIANTS:
        raise ConfigError(f"experiment {NAME}: variant {cell.protocol!r} is not one of {VARIANTS}")
    batches = preset.spark_batches
    per_batch = cell.records // batches if batches > 0 else 0
    spark = _session()
    work = workdir / NAME
    src = write_inputs(
        work / f"input-{cell.keys}-{per_batch}-{batches}", cell.keys, per_batch, batches
    )
    tag = f"{cell.protocol}-{cell.keys}-{time.monotonic_ns()}"
    started = time.perf_counter()
    times = run_query(spark, cell.protocol, src, work, tag)
    wall = time.perf_counter() - started
    writes, state_bytes = ([], 0) if cell.protocol == "none" else state_writes(work / "state" / tag)
    runtime = sum(times)
    return Measurement(
        runtime_s=runtime,
        wall_s=wall,
        throughput_rps=per_batch * len(times) / runtime,
        checkpoints=len(writes),
        checkpoint_ms_median=statistics.median(writes) if writes else 0.0,
        checkpoint_ms_max=max(writes) if writes else 0.0,
        state_bytes_max=state_bytes,
        stall_s=0.0,
        alignment_ms_max=0.0,
        logged_records_max=0,
        bucket_s=0.0,
        source_timeline=[],
        last_stage_timeline=[],
        checkpoint_windows=[],
        batch_s=tuple(times),
    )


def paired_effects(batches: dict[tuple[Cell, int], tuple[float, ...]]) -> list[Effect]:
    """Per cell other than ``none``: micro-batch i of round r against batch i
    of round r's ``none`` of the same size; the median ratio - 1 and its
    interval clustered by round."""
    out = []
    for cell in sorted({c for c, _ in batches if c.protocol != "none"}):
        base = Cell(cell.experiment, "none", None, cell.keys, cell.parallelism, cell.records)
        per_round = []
        for (c, rnd), times in sorted(batches.items(), key=lambda kv: kv[0][1]):
            off = batches.get((base, rnd))
            if c != cell or off is None:
                continue
            per_round.append([t / o - 1 for t, o in zip(times, off, strict=False) if o > 0])
        pooled = [x for r in per_round for x in r]
        if not pooled:
            continue
        lo, hi = clustered_median_ci(per_round)
        out.append(
            Effect(
                cell=cell,
                method=PAIRED_BATCHES,
                overhead=statistics.median(pooled),
                low=lo,
                high=hi,
                samples=len(pooled),
                runs=len(per_round),
                checkpoints=len(pooled),
            )
        )
    return out


def plot(_summaries: list[Summary], _timelines: Timelines, _outdir: Path) -> list[Path]:
    """The effects table with intervals is the report of this experiment."""
    return []


EXPERIMENT = Experiment(
    name=NAME,
    number=7,
    title="ABS on Spark: background vs sync state writes",
    question="What does writing each micro-batch's state snapshot in the background "
    "buy over stopping to write it, against snapshots off?",
    cells=cells,
    plot=plot,
    simulate=simulate,
    estimate=estimate,
)
