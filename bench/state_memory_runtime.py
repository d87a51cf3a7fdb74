"""The local runtime's keyed aggregates under a memory budget against the
same job in memory (issue 37): two builds side by side.

The experiments' three-shuffle job (`snapcut.experiments.flows.build`,
RECORDS generated events of KEYS users, 2 tasks per operator) with no
checkpoints (`protocol="none"`), run three ways per round: build A and
build B with `state_memory=BUDGET` (each keyed stage's subtasks spill past
it), and the installed build without a budget (the in-memory aggregate:
the floor the budgeted runs are compared with). Each run is a child process
whose ``PYTHONPATH`` selects the build (empty: the installed one); rounds
alternate the order (ABBA). Per run: the job's own time
(`RunReport.duration_s`) and, for the budgeted runs, the spill figures of
the stages that spilled (flushes, rows flushed, run probes and hits).

Writes ``<out>/runs.jsonl`` and prints a Markdown table of medians and
ranges, with each budgeted build's time over the in-memory run of its round.

    python bench/state_memory_runtime.py --a target/ab-old/site --b "" \\
        --keys 10000000 --records 100000000 --rounds 3 \\
        --out bench/results/state_store/budgeted_runtime
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from children import child_env, run_json_child

CHILD = r"""
import json, sys
from snapcut.checkpointing import Checkpointing
from snapcut.experiments.flows import build

keys, records, budget = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
flow = build(records=records, keys=keys, parallelism=2)
extra = {"state_memory": budget} if budget else {}
report = flow.run(checkpointing=Checkpointing(protocol="none", **extra))
spill = {t: s for t, s in (report.spill or {}).items() if s["flushes"]}
print(json.dumps({
    "job_s": round(report.duration_s, 3),
    "rows_out": report.results["result"].num_rows,
    "spilled_tasks": sorted(spill),
    "flushes": sum(s["flushes"] for s in spill.values()),
    "rows_flushed": sum(s["rows_flushed"] for s in spill.values()),
    "run_probes": sum(s["run_probes"] for s in spill.values()),
    "run_hits": sum(s["run_hits"] for s in spill.values()),
    "merges": sum(s["merges"] for s in spill.values()),
}))
"""


def child(pythonpath: str, args: argparse.Namespace, budget: str) -> dict[str, Any]:
    cmd = [sys.executable, "-c", CHILD, str(args.keys), str(args.records), budget]
    return run_json_child(cmd, child_env(pythonpath), args.timeout)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} [{min(values):.3g}, {max(values):.3g}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--a", required=True, help="PYTHONPATH of build A ('' = installed)")
    p.add_argument("--b", required=True, help="PYTHONPATH of build B")
    p.add_argument("--keys", type=int, default=10_000_000)
    p.add_argument("--records", type=int, default=100_000_000)
    p.add_argument("--budget", default="256MB")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if not args.budget:
        raise SystemExit("--budget must be a size (256MB): the bench compares budgeted runs")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = {"A": (args.a, args.budget), "B": (args.b, args.budget), "memory": ("", "")}
    rows: list[dict[str, Any]] = []
    with open(out / "runs.jsonl", "w") as f:
        f.write(json.dumps({"args": vars(args)}) + "\n")
        for rnd in range(args.rounds):
            order = ["A", "B", "memory"] if rnd % 2 == 0 else ["memory", "B", "A"]
            for i, case in enumerate(order):
                load = os.getloadavg()[0]
                pythonpath, budget = cases[case]
                row = child(pythonpath, args, budget)
                row |= {"case": case, "round": rnd, "order": i, "load_1m": round(load, 2)}
                print(json.dumps(row), flush=True)
                f.write(json.dumps(row) + "\n")
                f.flush()
                rows.append(row)
                time.sleep(2)
    memory = {r["round"]: r["job_s"] for r in rows if r["case"] == "memory"}
    outputs = {r["rows_out"] for r in rows}
    if len(outputs) != 1:
        raise SystemExit(f"the runs disagree on the output's rows: {sorted(outputs)}")
    print()
    print("| case | job, s | over in-memory (same round) | flushes | run probes |")
    print("|---|---|---|---|---|")
    for case in cases:
        mine = [r for r in rows if r["case"] == case]
        ratio = [r["job_s"] / memory[r["round"]] for r in mine]
        cells = [
            spread([r["job_s"] for r in mine]),
            spread(ratio),
            spread([r["flushes"] for r in mine]),
            spread([r["run_probes"] for r in mine]),
        ]
        print(f"| {case} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
