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
alternate inside one query; instead a round runs the three queries at once,
each over a directory of its own, and feeds them **one micro-batch at a
time, in turn**: file i is linked into one query's directory, that query's
batch is awaited, then the next query's (the order rotated by batch and by
round), so batch i of each variant runs within seconds of the others, in the
same speed mode of the guest (whole queries one after another were minutes
apart: 3 rounds of them gave intervals 30 to 79 points wide). Batch i of a
variant is paired with batch i of the same round's ``none``. A cell's
overhead is the median of ``t(variant) / t(none) - 1`` over those pairs,
with a 95 % bootstrap interval clustered by query round
(`windowed.clustered_median_ci`). The time of a batch is Spark's
``durationMs.addBatch``: the stateful stage and the sink's commit, which
waits for every state partition's acknowledgement (so a background write
has ended before the next query's batch starts).

The grid runner asks for one cell at a time; the first cell of a size in a
grid round runs that size's query rounds (the preset's ``spark_rounds``:
more at small sizes, where a round is cheap) and keeps the other two
variants' measurements for their cells' turns. One unmeasured round at the
smallest size warms the session up first.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import statistics
import time
from dataclasses import dataclass
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
BATCH_TIMEOUT_S = 600.0
"""Seconds one fed micro-batch may take to show in its query's progress
before the round is abandoned (a 10M-key batch takes about 6 s here)."""
TRIGGER = "100 milliseconds"
"""How often an idle query looks for its next file (not part of a batch's time)."""
POLL_S = 0.05


def cells(p: Preset, _protocols: tuple[str, ...] | None) -> list[Cell]:
    """Its variants are state-write modes, not protocols: ``--protocols``
    does not apply."""
    for keys in p.spark_keys:
        rounds(p, keys)  # a preset with wrong rounds fails before the grid starts
    return [
        Cell(NAME, v, None, keys, PARTITIONS, p.spark_records * p.spark_batches)
        for keys in p.spark_keys
        for v in VARIANTS
    ]


def rounds(p: Preset, keys: int) -> int:
    """Query rounds per grid round at `keys` (the preset's ``spark_rounds``)."""
    if not p.spark_rounds:
        return 1
    if len(p.spark_rounds) != len(p.spark_keys) or min(p.spark_rounds) < 1:
        raise ConfigError(
            f"experiment {NAME}: spark_rounds {p.spark_rounds} must give a count >= 1 for "
            f"each of spark_keys {p.spark_keys} (or be empty: one round each)"
        )
    if keys not in p.spark_keys:
        raise ConfigError(f"experiment {NAME}: {keys} keys is not one of {p.spark_keys}")
    return p.spark_rounds[p.spark_keys.index(keys)]


def estimate(cell: Cell, p: Preset) -> float:
    """Seconds one variant's queries of `cell` take in a grid round: fitted
    to the full grid's rounds on this machine (a query ~3 s to start, feed
    and stop, building 1M keys ~1.5 s, 1M measured rows ~1.2 s), times its
    rounds."""
    return (3.0 + 1.5e-6 * cell.keys + 1.2e-6 * cell.records) * rounds(p, cell.keys)


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


@dataclass
class _Query:
    variant: str
    tag: str
    src: Path
    handle: Any


def start_query(spark: Any, variant: str, work: Path, tag: str) -> _Query:
    """`variant`'s query over a directory of its own (empty: the round feeds
    it), running until stopped."""
    from snapcut.experiments.spark_memory_state import in_memory
    from snapcut.spark import ArrowSnapshotSink, keyed_state

    src = work / "src" / tag
    src.mkdir(parents=True)
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
    handle = (
        out.writeStream.foreachBatch(sink)
        .outputMode("update")
        .option("checkpointLocation", chk)
        .trigger(processingTime=TRIGGER)
        .start()
    )
    return _Query(variant, tag, src, handle)


def data_batches(handle: Any) -> list[Any]:
    """The query's progress reports of batches that read rows, by batch id
    (idle reports left out)."""
    seen = {p.batchId: p for p in handle.recentProgress if p.numInputRows > 0}
    return [seen[b] for b in sorted(seen)]


def feed(q: _Query, file: Path, n: int, timeout: float = BATCH_TIMEOUT_S) -> float:
    """Links `file` into `q`'s directory (it appears whole) and waits for the
    query's `n`-th batch with rows; its seconds (``durationMs.addBatch``)."""
    os.link(file, q.src / file.name)
    deadline = time.monotonic() + timeout
    while True:
        done = data_batches(q.handle)
        if len(done) >= n:
            return float(done[n - 1]["durationMs"]["addBatch"]) / 1000
        failure = q.handle.exception()
        if failure is not None or not q.handle.isActive:
            raise RuntimeError(
                f"experiment {NAME}: query {q.tag} stopped before its batch {n}: {failure}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"experiment {NAME}: query {q.tag} did not finish its batch {n} within "
                f"{timeout:.0f} s of {file.name} appearing; the machine is too slow or "
                "the query hangs (see the Spark UI or the driver log)"
            )
        time.sleep(POLL_S)


@dataclass
class _Variant:
    tag: str
    times: list[float]
    wall_s: float
    """Seconds from feeding each of its files to its batch's end."""
    fed: list[float]
    """When each of its files was fed (``time.perf_counter``), the state-building one first."""


def run_round(spark: Any, src: Path, batches: int, work: Path, turn: int) -> dict[str, _Variant]:
    """The three variants' queries at once, fed file by file in turn (the
    order rotated by `turn` and by batch); per variant, the seconds of each
    batch after the state-building one."""
    files = sorted(src.glob("part-*.parquet"))
    if len(files) != batches + 1:
        raise ConfigError(
            f"experiment {NAME}: {src} holds {len(files)} input files, expected {batches + 1}"
        )
    stamp = time.monotonic_ns()
    queries = [start_query(spark, v, work, f"{v}-{stamp}") for v in VARIANTS]
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    spent: dict[str, float] = dict.fromkeys(VARIANTS, 0.0)
    fed: dict[str, list[float]] = {v: [] for v in VARIANTS}
    try:
        for i, file in enumerate(files):
            k = (turn + i) % len(queries)
            for q in queries[k:] + queries[:k]:
                t0 = time.perf_counter()
                fed[q.variant].append(t0)
                seconds = feed(q, file, i + 1)
                spent[q.variant] += time.perf_counter() - t0
                if i > 0:
                    times[q.variant].append(seconds)
    finally:
        for q in queries:
            q.handle.stop()
    return {
        q.variant: _Variant(q.tag, times[q.variant], spent[q.variant], fed[q.variant])
        for q in queries
    }


def state_writes(root: Path) -> tuple[list[float], int]:
    """Per committed version after the first: the state write's ms (the
    manifests' ``spark.write_ms``); and the most state bytes a version
    wrote (``spark.state_bytes``), read from the same manifests once."""
    manifests = [json.loads(m.read_text()) for m in sorted(root.glob("chk-*/manifest.json"))]
    if not manifests:
        raise ConfigError(f"experiment {NAME}: no committed state version under {root}")
    written = max(int(m["spark"]["state_bytes"]) for m in manifests)
    return [float(m["spark"]["write_ms"]) for m in manifests[1:]], written


#: Per grid run and input (its work directory, keys, rows per batch,
#: batches): the measurements of the current round that their cells have not
#: taken yet (keyed by the directory, so another grid run never takes them).
_PENDING: dict[tuple[Path, int, int, int], dict[str, Measurement]] = {}
_TURNS = itertools.count()
_WARMED: set[Path] = set()
"""Work directories whose session has run its unmeasured warm-up round."""


def simulate(cell: Cell, _rows: list[Any], preset: Preset, workdir: Path) -> Measurement:
    """`cell`'s measurement in this grid round (the grid's hook for a cell
    that is not a job of the local runtime): the first cell of a size in a
    grid round runs that size's query rounds, the other two take what it
    kept. The grid run's first round is preceded by one unmeasured round at
    the smallest size: the session's first queries are slower (JIT, Python
    workers starting), which would read as an effect of whichever variant
    ran first."""
    if cell.protocol not in VARIANTS:
        raise ConfigError(f"experiment {NAME}: variant {cell.protocol!r} is not one of {VARIANTS}")
    batches = preset.spark_batches
    if batches < 1:
        raise ConfigError(
            f"experiment {NAME}: spark_batches is {batches}; a query needs "
            "the state-building batch and at least one measured one (spark_batches >= 1)"
        )
    per_batch = cell.records // batches
    work = workdir / NAME
    key = (work, cell.keys, per_batch, batches)
    pending = _PENDING.get(key, {})
    if cell.protocol not in pending:
        count = rounds(preset, cell.keys)
        if work not in _WARMED:
            smallest = min(preset.spark_keys, default=cell.keys)
            warm = write_inputs(
                work / f"input-{smallest}-{per_batch}-{batches}", smallest, per_batch, batches
            )
            run_round(_session(), warm, batches, work, next(_TURNS))
            _WARMED.add(work)
        src = write_inputs(work / f"input-{cell.keys}-{per_batch}-{batches}", *key[1:])
        played = [run_round(_session(), src, batches, work, next(_TURNS)) for _ in range(count)]
        pending = _PENDING[key] = {
            v: measured(v, [r[v] for r in played], per_batch, work / "state") for v in VARIANTS
        }
    return pending.pop(cell.protocol)


def measured(variant: str, played: list[_Variant], per_batch: int, states: Path) -> Measurement:
    """One variant's measurement over its query rounds of a grid round."""
    writes: list[float] = []
    state_bytes = 0
    if variant != "none":
        for r in played:
            w, b = state_writes(states / r.tag)
            writes += w
            state_bytes = max(state_bytes, b)
    times = [t for r in played for t in r.times]
    runtime = sum(times)
    return Measurement(
        runtime_s=runtime,
        wall_s=sum(r.wall_s for r in played),
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
        batch_s=tuple(tuple(r.times) for r in played),
    )


def paired_effects(batches: dict[tuple[Cell, int], tuple[tuple[float, ...], ...]]) -> list[Effect]:
    """Per cell other than ``none``: micro-batch i of a query round against
    batch i of the same query round's ``none`` of the same size; the median
    ratio - 1 and its interval clustered by query round."""
    out = []
    for cell in sorted({c for c, _ in batches if c.protocol != "none"}):
        base = Cell(cell.experiment, "none", None, cell.keys, cell.parallelism, cell.records)
        per_round = []
        for (c, rnd), played in sorted(batches.items(), key=lambda kv: kv[0][1]):
            off = batches.get((base, rnd))
            if c != cell or off is None:
                continue
            for times, off_times in zip(played, off, strict=True):
                per_round.append(
                    [t / o - 1 for t, o in zip(times, off_times, strict=False) if o > 0]
                )
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


def write_batches_csv(
    batches: dict[tuple[Cell, int], tuple[tuple[float, ...], ...]], path: Path
) -> None:
    """batches.csv: one line per measured micro-batch (the pairs' raw data)."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["experiment", "protocol", "keys", "round", "query_round", "batch", "seconds"])
        for (cell, rnd), played in sorted(batches.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            for q, times in enumerate(played):
                for b, t in enumerate(times):
                    w.writerow([cell.experiment, cell.protocol, cell.keys, rnd, q, b + 1, t])


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
