"""Sums the chunk summaries `bench/chaos_all.sh` (and `bench/chaos_spark.sh`,
rows "spark", for its --remote chunks "spark-connect", and for its --step tws
chunks "spark-tws", for its --state-memory chunks "spark-spill" (folder
`chaos_spark_spill`; "spark-tws-spill" with --step tws too, "spark-l2-spill"
with --step map_batches, "spark-l3-spill" with apply_in_pandas_with_state, and
their "-sessions" rows with --session-gap, "-sessions-cluster" for those on
local-cluster, `SNAPCUT_CHAOS_OUT`), for its
--state-root s3 chunks "spark-s3" (folder `chaos_spark_s3`), for its chunks
with merges mid-run (`SNAPCUT_CHAOS_OUT`) "spark-compaction" (folder
`chaos_spark_compaction`; "spark-s3-compaction" there for their --state-root s3 chunks);
`bench/chaos_spark_tables.sh`, rows "spark-delta",
"spark-iceberg" and their "-cluster" chunks, with the tables' commit counts)
wrote into one row per protocol. Arguments: the results root, and the folder
of the local runtime's chunks (default `chaos`; `chaos_compaction` for the
kills inside compaction, `CHAOS_OUT=chaos_compaction bash bench/chaos_all.sh`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

KEYS = ("runs", "kills", "recoveries", "lost", "duplicated", "mismatched")
TABLE_KEYS = ("table_commits", "table_double_commits", "table_missing_batches")
TABLES = ("spark-delta", "spark-delta-cluster", "spark-iceberg", "spark-iceberg-cluster")
EXTRA = ("timer_kills", "failpoint_kills", "restored", "errors", "corrupt_files", "seconds")
#: Columns of a campaign whose keyed state spilled (`--state-memory`), when any chunk has them.
SPILL = ("spill_flushes", "spill_merges")
#: Columns of a Spark campaign whose workers' compactors merged, when any chunk has them.
COMPACTION = ("compactions_merged", "compactions_adopted")
#: Columns of a Spark campaign that counted its cold opens (and the stored time index they read).
COLD = ("cold_loads", "times_stored")


def main(
    root: str = str(Path(__file__).resolve().parent / "results"), local: str = "chaos"
) -> None:
    rows: list[tuple[str, list[dict[str, Any]]]] = []
    for p in (
        "aligned",
        "unaligned",
        "chandy-lamport",
        "sync",
        "spark",
        "spark-connect",
        "spark-tws",
        "spark-spill",
        "spark-tws-spill",
        "spark-l2-spill",
        "spark-l3-spill",
        "spark-l2-spill-sessions",
        "spark-l3-spill-sessions",
        "spark-l2-spill-sessions-cluster",
        "spark-l3-spill-sessions-cluster",
        "spark-s3",
        "spark-compaction",
        "spark-s3-compaction",
        *TABLES,
    ):
        folder = "chaos_spark" if p.startswith("spark") else local
        folder = "chaos_spark_tables" if p in TABLES else folder
        folder = "chaos_spark_spill" if "-spill" in p else folder
        folder = "chaos_spark_s3" if p == "spark-s3" else folder
        folder = "chaos_spark_compaction" if p.endswith("-compaction") else folder
        path = Path(root) / folder / f"chaos-{p}.jsonl"
        if path.exists():
            rows.append((p, [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]))
    extra = EXTRA
    for optional in (SPILL, COMPACTION, COLD):
        if any(k in c for _, chunks in rows for c in chunks for k in optional):
            extra += optional
    print("| protocol | " + " | ".join(KEYS + extra) + " | failpoint kills by point |")
    print("|" + "---|" * (len(KEYS) + len(extra) + 2))
    for p, chunks in rows:
        tot = {k: sum(c.get(k, 0) for c in chunks) for k in KEYS + extra}
        points: dict[str, int] = {}
        for c in chunks:
            for name, n in c.get("failpoints", {}).items():
                points[name] = points.get(name, 0) + n
        cells = [str(round(tot[k], 1)) for k in KEYS + extra]
        fp = ", ".join(f"{k} {v}" for k, v in sorted(points.items()))
        kinds: dict[str, int] = {}
        for c in chunks:
            for name, n in c.get("kill_kinds", {}).items():
                kinds[name] = kinds.get(name, 0) + n
        if kinds:  # Spark: kills by kind (driver tree, crash points, executors)
            fp += "; by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
        if p in TABLES:  # one commit per batch: the doubles and missing must be 0
            table = {k: sum(c.get(k, 0) for c in chunks) for k in TABLE_KEYS}
            fp += "; table: " + ", ".join(f"{k} {v}" for k, v in table.items())
        print(f"| {p} | " + " | ".join(cells) + f" | {fp} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
