"""Sums the chunk summaries `bench/chaos_all.sh` (and `bench/chaos_spark.sh`,
rows "spark", for its --remote chunks "spark-connect", and for its --step tws
chunks "spark-tws") wrote into one row per protocol."""

from __future__ import annotations

import json
import sys
from pathlib import Path

KEYS = ("runs", "kills", "recoveries", "lost", "duplicated", "mismatched")
EXTRA = ("timer_kills", "failpoint_kills", "restored", "errors", "corrupt_files", "seconds")


def main(root: str = str(Path(__file__).resolve().parent / "results")) -> None:
    print("| protocol | " + " | ".join(KEYS + EXTRA) + " | failpoint kills by point |")
    print("|" + "---|" * (len(KEYS) + len(EXTRA) + 2))
    for p in (
        "aligned",
        "unaligned",
        "chandy-lamport",
        "sync",
        "spark",
        "spark-connect",
        "spark-tws",
    ):
        folder = "chaos_spark" if p.startswith("spark") else "chaos"
        path = Path(root) / folder / f"chaos-{p}.jsonl"
        if not path.exists():
            continue
        chunks = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
        tot = {k: sum(c.get(k, 0) for c in chunks) for k in KEYS + EXTRA}
        points: dict[str, int] = {}
        for c in chunks:
            for name, n in c.get("failpoints", {}).items():
                points[name] = points.get(name, 0) + n
        cells = [str(round(tot[k], 1)) for k in KEYS + EXTRA]
        fp = ", ".join(f"{k} {v}" for k, v in sorted(points.items()))
        kinds: dict[str, int] = {}
        for c in chunks:
            for name, n in c.get("kill_kinds", {}).items():
                kinds[name] = kinds.get(name, 0) + n
        if kinds:  # Spark: kills by kind (driver tree, crash points, executors)
            fp += "; by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
        print(f"| {p} | " + " | ".join(cells) + f" | {fp} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
