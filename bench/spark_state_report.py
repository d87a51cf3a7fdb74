"""Renders bench/spark_state.py's JSON as the markdown tables of
bench/results/spark_state/README.md (the prose around them is written by hand).

    python bench/spark_state_report.py bench/results/spark_state/spark_state.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

NATIVE = "spark native groupBy().agg()"
L1 = "snapcut level 1 aggregate"
L1_OFF = "snapcut level 1, snapshots off"
L1_SYNC = "snapcut level 1, sync state writes"
L2 = "snapcut level 2 map_batches"
L3 = "snapcut level 3 apply_in_pandas_with_state"
AIPWS = "spark applyInPandasWithState"


def table(runs: dict[str, Any]) -> str:
    keys = sorted({int(k.split("|")[0]) for k in runs})
    names = list(dict.fromkeys(k.split("|", 1)[1] for k in runs))
    head = "| variant | " + " | ".join(f"{k:,} keys" for k in keys) + " |"
    lines = [head, "|---" * (len(keys) + 1) + "|"]
    for n in names:
        cells = []
        for k in keys:
            r = runs.get(f"{k}|{n}")
            cells.append(
                "—"
                if r is None
                else f"{r['batch_s']:.3f} ({r['batch_min_s']:.2f} to {r['batch_max_s']:.2f})"
            )
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratios(runs: dict[str, Any]) -> str:
    keys = sorted({int(k.split("|")[0]) for k in runs})
    pairs = [
        ("level 1 / native", L1, NATIVE),
        ("level 2 / native", L2, NATIVE),
        ("applyInPandasWithState / level 1", AIPWS, L1),
        ("applyInPandasWithState / level 2", AIPWS, L2),
        ("applyInPandasWithState / level 3", AIPWS, L3),
        ("level 1 background writes / snapshots off", L1, L1_OFF),
        ("level 1 sync writes / snapshots off", L1_SYNC, L1_OFF),
    ]
    lines = ["| ratio | " + " | ".join(f"{k:,} keys" for k in keys) + " |"]
    lines.append("|---" * (len(keys) + 1) + "|")
    for label, a, b in pairs:
        cells = []
        for k in keys:
            ra, rb = runs.get(f"{k}|{a}"), runs.get(f"{k}|{b}")
            missing = ra is None or rb is None
            cells.append("—" if missing else f"{ra['batch_s'] / rb['batch_s']:.2f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def state_bytes(runs: dict[str, Any]) -> str:
    lines = ["| keys | variant | state write ms (median, slowest partition) | bytes per batch |"]
    lines.append("|---|---|---|---|")
    for k, r in runs.items():
        if "bytes" not in r:
            continue
        keys, name = k.split("|", 1)
        per = ", ".join(f"{kind} {b / 1024:,.0f} KiB" for kind, b in r["bytes"])
        lines.append(f"| {int(keys):,} | {name} | {r['write_ms']:.0f} | {per} |")
    return "\n".join(lines)


def main() -> int:
    with open(sys.argv[1]) as f:
        data = json.load(f)
    runs = data["runs"]
    print(f"Machine: {data['machine']}; load after: {data['load_after']}\n")
    print("Seconds per micro-batch (median of later batches; range):\n")
    print(table(runs), "\n")
    print(ratios(runs), "\n")
    print(state_bytes(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
