"""Cells, presets and the run order of an experiment grid.

A *cell* is one configuration (experiment, protocol, interval, keys,
parallelism, records); each is run `repetitions` times. Round r runs every
cell once, the order rotated by r, so that no cell always runs first (cold
caches) or last (a machine that got busier).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from snapcut._core import ConfigError
from snapcut.checkpointing import PROTOCOLS

ABS_AND_SYNC = ("none", "aligned", "unaligned", "chandy-lamport", "sync")
ALIGNED_TIMEOUT = "aligned-timeout"
"""Not a protocol of its own: `unaligned` starting aligned, switching after
`ALIGNMENT_TIMEOUT_S` (Flink's aligned-checkpoint timeout)."""
ALIGNMENT_TIMEOUT_S = 0.01
VARIANTS = (ALIGNED_TIMEOUT,)


@dataclass(frozen=True, order=True)
class Cell:
    """One configuration of one experiment. `interval_s` is None for `none`."""

    experiment: str
    protocol: str
    interval_s: float | None
    keys: int
    parallelism: int
    records: int
    scenario: str = ""
    """A variant of the job (experiment 4: "slow-operator", "hot-key"); "" = the paper's."""
    timeline: bool = field(default=False, compare=False)
    """Keep this cell's throughput timeline (not part of its identity)."""

    def group(self) -> tuple[str, str, int, int, int]:
        """Cells sharing a `none` baseline: same experiment, scenario, keys,
        parallelism, records."""
        return (self.experiment, self.scenario, self.keys, self.parallelism, self.records)

    def label(self) -> str:
        iv = "-" if self.interval_s is None else f"{self.interval_s:g} s"
        scenario = f" · {self.scenario}" if self.scenario else ""
        return (
            f"{self.experiment}{scenario} · {self.protocol} @ {iv} · {self.keys:,} keys · "
            f"p{self.parallelism} · {self.records:,} rec"
        )


@dataclass(frozen=True)
class Preset:
    """Sizes of every experiment's grid."""

    name: str
    repetitions: int
    records: int
    keys: int
    parallelism: int
    intervals: tuple[float, ...]
    timeline_interval: float
    timeline_records: int
    state_keys: tuple[int, ...]
    state_intervals: tuple[float, ...]
    state_records: int
    parallelisms: tuple[int, ...]
    parallel_interval: float
    parallel_records: int
    backpressure_records: int = 1_000_000
    backpressure_interval: float = 0.1
    slow_ms_per_batch: float = 2.0
    sim_nodes: tuple[int, ...] = (1, 4, 16)
    sim_interval: float = 0.1
    sim_records_per_node: int = 4_000_000
    sim_keys_per_node: int = 10_000
    window_span_s: float = 0.1
    """Measured part of a window (the windowed method, `windows.py`): at
    least one interval, a whole number of them."""
    window_guard_s: float = 0.05
    """Unmeasured start of a window (the last checkpoint finishing)."""
    window_warmup_s: float = 0.2
    on_windows: int = 3
    """On windows per windowed run (fewer for long windows: `window_cell_s`)."""
    window_cell_s: float = 2.5
    """About how long one windowed run may take; long windows get fewer on
    windows to fit (never fewer than `MIN_ON_WINDOWS`)."""
    window_cell_s_of: tuple[tuple[str, float], ...] = ()
    """`window_cell_s` for some experiments (name, seconds): longer where
    long intervals leave few windows, shorter where windows agree."""
    window_runs: int = 1
    spark_keys: tuple[int, ...] = ()
    """Experiment 7 (Spark): state sizes; none: the experiment has no cells
    (--tiny: CI's grid starts no Spark; tests/spark runs experiment 7)."""
    spark_records: int = 0
    """Experiment 7: rows per measured micro-batch."""
    spark_batches: int = 0
    """Experiment 7: measured micro-batches per query."""
    spark_rounds: tuple[int, ...] = ()
    """Experiment 7: query rounds per grid round, one entry per `spark_keys`
    size (empty: one each). A round's three queries build their state
    first, so rounds at small sizes are cheap and the interval, clustered
    by round, narrows with them."""
    windowed_experiments: tuple[str, ...] | None = None
    """Experiments whose overhead cells run windowed (None: every one that
    can; --tiny keeps CI short with experiment 1 alone)."""
    """Windowed runs per cell (their windows pooled, the interval clustered by run)."""
    smoke: bool = field(default=True)
    """Figures from this preset are a smoke test, not results."""

    def window_cell_seconds(self, experiment: str) -> float:
        """About how long one windowed run of `experiment` may take."""
        return dict(self.window_cell_s_of).get(experiment, self.window_cell_s)


PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        name="tiny",
        repetitions=2,
        records=4_000_000,
        keys=1_000,
        parallelism=2,
        intervals=(0.02, 0.2),
        timeline_interval=0.05,
        timeline_records=8_000_000,
        state_keys=(1_000, 10_000),
        state_intervals=(0.1,),
        state_records=200_000,
        parallelisms=(1, 2),
        parallel_interval=0.1,
        parallel_records=200_000,
        backpressure_records=200_000,
        backpressure_interval=0.02,
        slow_ms_per_batch=0.5,
        windowed_experiments=("interval",),
    ),
    "quick": Preset(
        name="quick",
        repetitions=3,
        records=8_000_000,
        keys=10_000,
        parallelism=2,
        intervals=(0.05, 0.2, 1.0),
        timeline_interval=0.25,
        timeline_records=16_000_000,
        # Not 1M keys: sync's full write then outlasts a 100 ms interval and
        # the run becomes back-to-back checkpoints (minutes; --full has it).
        state_keys=(10_000, 100_000, 300_000),
        state_intervals=(1.0, 0.1),
        state_records=4_000_000,
        parallelisms=(1, 2, 4),
        parallel_interval=0.5,
        parallel_records=4_000_000,
        backpressure_records=2_000_000,
        sim_nodes=(5, 10, 20, 40, 100),
        sim_interval=1.0,
        sim_records_per_node=100_000_000,
        sim_keys_per_node=100_000,
        window_span_s=0.5,
        window_guard_s=0.1,
        window_warmup_s=0.5,
        on_windows=6,
        window_cell_s=8.0,
        spark_keys=(10_000, 100_000),
        spark_records=100_000,
        spark_batches=4,
    ),
    "full": Preset(
        name="full",
        # Sized for an hour on 2 vCPUs (issue 39): whole runs of a few
        # seconds (a second view, paired by round), then a windowed run of
        # about 30 s per overhead cell, which is what decides it.
        repetitions=3,
        records=60_000_000,
        keys=10_000,
        parallelism=2,
        intervals=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
        timeline_interval=1.0,
        timeline_records=100_000_000,
        state_keys=(10_000, 100_000, 1_000_000, 10_000_000),
        state_intervals=(1.0, 0.1),
        state_records=20_000_000,
        parallelisms=(1, 2, 4, 8),
        parallel_interval=3.0,
        parallel_records=40_000_000,
        backpressure_records=10_000_000,
        backpressure_interval=1.0,
        sim_nodes=(5, 10, 20, 40, 100, 1000),
        sim_interval=3.0,
        sim_records_per_node=600_000_000,
        sim_keys_per_node=1_000_000,
        window_span_s=1.0,
        window_guard_s=0.2,
        window_warmup_s=1.0,
        on_windows=12,
        window_cell_s=33.0,
        # Experiment 4's windows agreed within 1.5 points at 12 on windows:
        # its minutes go to experiment 7's rounds.
        window_cell_s_of=(("backpressure", 16.0),),
        spark_keys=(10_000, 1_000_000, 10_000_000),
        spark_records=500_000,
        spark_batches=6,
        spark_rounds=(3, 2, 1),
        smoke=False,
    ),
}


def preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; use one of: {', '.join(PRESETS)}") from None


def check_protocols(names: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Validates protocol names (typed error naming the choices)."""
    for n in names:
        if n not in PROTOCOLS and n not in VARIANTS:
            raise ConfigError(
                f"unknown protocol {n!r}; use one of: {', '.join(PROTOCOLS + VARIANTS)}"
            )
    return tuple(names)


def sweep(
    experiment: str,
    protocols: tuple[str, ...],
    intervals: tuple[float, ...],
    *,
    keys: int,
    parallelism: int,
    records: int,
    timeline: bool = False,
    scenario: str = "",
) -> list[Cell]:
    """`none` once (no interval) plus every other protocol at every interval."""
    cells: list[Cell] = []
    if "none" in protocols:
        cells.append(Cell(experiment, "none", None, keys, parallelism, records, scenario, timeline))
    for p in protocols:
        if p == "none":
            continue
        cells.extend(
            Cell(experiment, p, iv, keys, parallelism, records, scenario, timeline)
            for iv in intervals
        )
    return cells


def schedule(cells: list[Cell], repetitions: int) -> list[tuple[int, Cell]]:
    """(repetition, cell) in run order: round r is every cell, rotated by r."""
    if repetitions < 1:
        raise ConfigError(f"repetitions must be at least 1, got {repetitions}")
    order: list[tuple[int, Cell]] = []
    n = len(cells)
    for r in range(repetitions):
        k = (r * max(1, n // repetitions)) % n if n else 0
        order.extend((r, c) for c in cells[k:] + cells[:k])
    return order
