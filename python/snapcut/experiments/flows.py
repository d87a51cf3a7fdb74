"""The jobs the experiments run on snapcut's runtime (built with the
`Dataflow` API).

The ABS paper's job (:func:`build`): a generated source of `(user, dwell_ms)`
events, then three keyed stateful stages, each behind a hash shuffle, each
keeping per-key aggregates that every checkpoint captures:

    source ─hash(user)→ stage1 ─hash(dwell_ms)→ stage2 ─hash(user)→ stage3 → collect

stage1 and stage2 pass every record on after folding it into their state
(`aggregate(forward=True)`); stage3 emits one row per user at the end.
The keys change between shuffles, so every shuffle really moves records
between subtasks. The paper's job has six operators and three shuffles;
this one has four operators after the source (three keyed stages and the
sink) and the same three shuffles, with keyed state at each stage.

The backpressure scenarios (:func:`build_scenario`, experiment 4): a slow
operator, and a hot key feeding it:

    source ─hash(user)→ stage1 ─forward→ slow (sleeps per batch) ─hash(user)→ stage3 → collect
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from snapcut._core import ConfigError
from snapcut.dataflow import DEFAULT_CHANNEL_CAPACITY, Dataflow
from snapcut.experiments.grid import Cell

SOURCE = "source"


LAST_STAGE = "stage3"


def build(
    records: int,
    keys: int,
    parallelism: int,
    seed: int = 7,
    channel_capacity: int = DEFAULT_CHANNEL_CAPACITY,
) -> Dataflow:
    flow = Dataflow(parallelism=parallelism, channel_capacity=channel_capacity)
    src = flow.generate_dwell_events(users=keys, count=records, seed=seed, name=SOURCE)
    s1 = src.key_by("user").aggregate(
        name="stage1", forward=True, count="count", total=("sum", "dwell_ms")
    )
    s2 = s1.key_by("dwell_ms").aggregate(
        name="stage2", forward=True, count="count", last_user=("max", "user")
    )
    s3 = s2.key_by("user").aggregate(name=LAST_STAGE, count="count", avg=("mean", "dwell_ms"))
    s3.collect("result")
    return flow


SCENARIOS = ("slow-operator", "hot-key")


BATCH = 4096


HOT_FRACTION = 0.5


def scenario_name(kind: str, slow_ms: float) -> str:
    return f"{kind}@{slow_ms:g}ms"


def parse_scenario(name: str) -> tuple[str, float]:
    kind, _, ms = name.partition("@")
    if kind not in SCENARIOS or not ms.endswith("ms"):
        raise ConfigError(f"unknown scenario {name!r}; use slow-operator@<ms>ms or hot-key@<ms>ms")
    return kind, float(ms[:-2])


def skewed_events(records: int, keys: int, seed: int = 7) -> pa.Table:
    """`(user, dwell_ms)` with HOT_FRACTION of the records on user 0."""
    rng = np.random.default_rng(seed)
    hot = rng.random(records) < HOT_FRACTION
    user = np.where(hot, 0, rng.integers(1, max(keys, 2), size=records))
    dwell = rng.integers(0, 10_000, size=records)
    return pa.table({"user": user.astype(np.int64), "dwell_ms": dwell.astype(np.int64)})


def build_scenario(cell: Cell, extra_s: Callable[[], float] | None = None) -> Dataflow:
    """`extra_s`: more seconds the slow operator sleeps per batch, asked at
    every batch (an injected slowdown switched on and off: tests)."""
    kind, slow_ms = parse_scenario(cell.scenario)
    flow = Dataflow(parallelism=cell.parallelism)
    if kind == "hot-key":
        table = skewed_events(cell.records, cell.keys)
        src = flow.from_batches(table.to_batches(max_chunksize=BATCH), name=SOURCE)
    else:
        src = flow.generate_dwell_events(
            users=cell.keys, count=cell.records, seed=7, batch_size=BATCH, name=SOURCE
        )
    delay = slow_ms / 1e3

    def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(delay + (extra_s() if extra_s is not None else 0.0))
        return batch

    s1 = src.key_by("user").aggregate(name="stage1", forward=True, count="count")
    s2 = s1.map(slow, name="slow")
    s3 = s2.key_by("user").aggregate(name=LAST_STAGE, count="count", avg=("mean", "dwell_ms"))
    s3.collect("result")
    return flow
