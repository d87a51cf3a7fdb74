"""The options of ``spark.read.format("snapcut")``, checked at planning.

Spark's options are strings and case-insensitive; each is parsed here once,
and every bad option (unknown, mistyped, used with the wrong kind of root or
without the option it needs) is a :class:`~snapcut.ConfigError` naming the
option and the fix. Names follow Spark's state data source (``batchId``,
``readChangeFeed``, ``changeStartBatchId``, ``changeEndBatchId``,
``readRegisteredTimers``, ``partitionId``; ``stateVarName`` is accepted for
``variable``). A stream (``spark.readStream``, sink roots only) takes
``path`` and the :data:`STREAM_ONLY` options, nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from snapcut._core import ConfigError

__all__ = ["COLUMNS", "FORMAT", "KNOWN", "STREAM_ONLY", "ReadOptions", "parse"]

FORMAT = "snapcut"
"""The data source's name: ``spark.read.format(FORMAT)``."""

STATE_ONLY = (
    "variable",
    "readRegisteredTimers",
    "partitionId",
    "readChangeFeed",
    "changeStartBatchId",
    "changeEndBatchId",
    "columns",
)
"""Options that only a state root takes (a sink root refuses them)."""
STREAM_ONLY = ("maxBatchesPerTrigger", "startingBatchId")
"""Options of ``spark.readStream`` on a sink root (snapcut.spark.source.stream):
at most so many of the root's committed batches per micro-batch; the first
batch a new query reads."""
KNOWN = ("path", "batchId", "stateVarName", *STATE_ONLY, *STREAM_ONLY)
COLUMNS = ("spark", "flat")
"""``columns=spark`` (default): Spark's ``key``/``value``/``partition_id``
structs; ``flat``: key and state columns side by side, as ``read_state``
returns them."""
_CANONICAL = {name.lower(): name for name in KNOWN}


@dataclass(frozen=True)
class ReadOptions:
    """The parsed options of one read."""

    path: str
    batch_id: int | None = None
    variable: str | None = None
    timers: bool = False
    partition_id: int | None = None
    change_feed: bool = False
    change_start: int | None = None
    change_end: int | None = None
    columns: str = "spark"
    max_batches: int | None = None
    """``maxBatchesPerTrigger`` (streams)."""
    starting_batch: int | None = None
    """``startingBatchId`` (streams)."""
    given: tuple[str, ...] = ()
    """The options given (canonical names), to refuse the ones a root kind
    does not take."""

    def refuse_state_options(self, root: str) -> None:
        """A sink root takes ``path`` and ``batchId`` only."""
        for name in self.given:
            if name in STATE_ONLY or name == "stateVarName":
                raise ConfigError(
                    f"option {name!r} reads a state root, but {root} is a sink root (output): "
                    "leave it out, or load the query's state root (keyed_state(root=...)) instead"
                )

    def refuse_stream_options(self, root: str) -> None:
        """A batch read (``spark.read``) takes no stream option."""
        for name in self.given:
            if name in STREAM_ONLY:
                raise ConfigError(
                    f"option {name!r} applies to spark.readStream on a sink root, not to "
                    f"spark.read of {root}: leave it out, or read the root as a stream"
                )

    def refuse_batch_options(self, root: str) -> None:
        """A stream takes ``path`` and the stream options only: the others
        choose what one batch read returns, which a stream does not do."""
        for name in self.given:
            if name != "path" and name not in STREAM_ONLY:
                raise ConfigError(
                    f"option {name!r} does not apply to spark.readStream on sink root {root} "
                    f"(a stream reads every committed batch once; its options are "
                    f"{', '.join(STREAM_ONLY)}): leave it out, or read with spark.read"
                )


def _int(options: Mapping[str, str], name: str, minimum: int = 0) -> int | None:
    raw = options.get(name)
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(
            f"option {name!r} must be an integer, got {raw!r}: pass e.g. .option({name!r}, 3)"
        ) from None
    if value < minimum:
        raise ConfigError(f"option {name!r} must be at least {minimum}, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str) -> bool:
    raw = options.get(name)
    if raw is None:
        return False
    text = str(raw).strip().lower()
    if text not in ("true", "false"):
        raise ConfigError(f"option {name!r} must be true or false, got {raw!r}")
    return text == "true"


def parse(raw: Mapping[str, str]) -> ReadOptions:
    """`raw` (Spark's case-insensitive options) checked and typed."""
    options: dict[str, str] = {}
    for name, value in raw.items():
        canonical = _CANONICAL.get(str(name).lower())
        if canonical is None:
            raise ConfigError(
                f"unknown option {name!r} for format 'snapcut': the options are "
                f"{', '.join(KNOWN)} (see docs/spark.md, 'Reading state and output')"
            )
        options[canonical] = value
    path = options.get("path")
    if not path:
        raise ConfigError(
            "format 'snapcut' needs the root to read: spark.read.format('snapcut').load(ROOT) "
            "(a keyed_state state root or an ArrowSnapshotSink root)"
        )
    variable = options.get("variable")
    alias = options.get("stateVarName")
    if variable is not None and alias is not None and alias != variable:
        raise ConfigError(
            f"options 'variable' ({variable!r}) and 'stateVarName' ({alias!r}) name different "
            "state variables: give one of them"
        )
    variable = variable if variable is not None else alias
    timers = _bool(options, "readRegisteredTimers")
    if timers and variable is not None:
        raise ConfigError(
            "option 'readRegisteredTimers' reads the timers, not state variable "
            f"{variable!r}: give one of 'readRegisteredTimers' and 'variable'"
        )
    columns = str(options.get("columns", "spark")).strip().lower()
    if columns not in COLUMNS:
        raise ConfigError(
            f"option 'columns' must be one of {', '.join(COLUMNS)}, got {options['columns']!r}"
        )
    change_feed = _bool(options, "readChangeFeed")
    start = _int(options, "changeStartBatchId")
    end = _int(options, "changeEndBatchId")
    batch = _int(options, "batchId")
    if change_feed:
        if start is None:
            raise ConfigError(
                "option 'readChangeFeed' needs 'changeStartBatchId' (the first batch whose "
                "changes to read): add .option('changeStartBatchId', N)"
            )
        if batch is not None:
            raise ConfigError(
                "option 'batchId' reads one version, 'readChangeFeed' a range of batches: use "
                "'changeStartBatchId' / 'changeEndBatchId' with the change feed"
            )
        if end is not None and start > end:
            raise ConfigError(
                f"option 'changeStartBatchId' ({start}) is after 'changeEndBatchId' ({end}): "
                "the start must be at most the end"
            )
        if columns != "spark":
            raise ConfigError("option 'columns' does not apply to the change feed: leave it out")
    else:
        for name in ("changeStartBatchId", "changeEndBatchId"):
            if name in options:
                raise ConfigError(
                    f"option {name!r} applies to the change feed: add "
                    ".option('readChangeFeed', 'true') or leave it out"
                )
    return ReadOptions(
        path=str(path),
        batch_id=batch,
        variable=variable,
        timers=timers,
        partition_id=_int(options, "partitionId"),
        change_feed=change_feed,
        change_start=start,
        change_end=end,
        columns=columns,
        max_batches=_int(options, "maxBatchesPerTrigger", minimum=1),
        starting_batch=_int(options, "startingBatchId"),
        given=tuple(options),
    )
