"""ABS at large state with the checkpoint's files written with direct I/O,
freed pages kept a while and chains ended by a full, against each off and
against an earlier build (issue 37).

The job of the issue's headline table (`snapcut.experiments.flows.build`:
RECORDS records over KEYS keys, 2 tasks per operator), without checkpoints
(`none`) and with durable aligned checkpoints every INTERVAL s, in four
cases per round, each in the opposite order to the last round's:

- `none`: no checkpoints;
- `buffered`: the files through the page cache (``run(direct_io=False)``)
  and mimalloc purging freed pages after 10 ms (``MIMALLOC_PURGE_DELAY=10``,
  its v2 default): what the runtime did before;
- `direct`: direct I/O, purging after 10 ms;
- `default`: direct I/O and the bindings' purge delay (1 s): what it does now;
- `baseline` (with ``--baseline PATH``, a build's ``python/`` directory with
  its extension): that build as it is, e.g. the one before all three.

The chain rule (an in-memory aggregate's capture is full once its chain's
diffs would hold as many rows as the table) is in every case of this build.

Each run is a child process, which reports the job's time, its
checkpoints (count, median and longest), and the CPU seconds of its
threads by name (task threads `snapcut-stage…`, the store's writer
`snapcut-store-w…`, its compactor `snapcut-compact…`), with the process's
user and system time. Writes ``<out>/runs.jsonl`` and prints a Markdown
table: overhead over `none` of the same round, median [min, max].

    python bench/state_store_direct_io.py --keys 10000000 --records 100000000 \\
        --rounds 3 --out bench/results/state_store/direct_io

``--cases none,default`` runs a subset (``none`` always: the overheads are
over it).
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

from children import child_env, run_json_child, spread

CHILD = r"""
import collections, json, os, re, shutil, statistics, sys, tempfile, threading, time
from snapcut.checkpointing import Checkpointing
from snapcut.experiments.flows import build

keys, records, interval, case = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
tick = os.sysconf("SC_CLK_TCK")
threads = {}
stop = threading.Event()

def sample():
    # A thread's CPU as last seen: the runtime's threads end with the job.
    while not stop.wait(0.1):
        for tid in os.listdir("/proc/self/task"):
            try:
                stat = open(f"/proc/self/task/{tid}/stat").read()
            except OSError:
                continue
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            threads[tid] = (name, (int(fields[11]) + int(fields[12])) / tick)

sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
flow = build(records=records, keys=keys, parallelism=2)
root = tempfile.mkdtemp(prefix="direct-io-", dir=os.environ.get("BENCH_ROOT_DIR"))
before = os.times()
if case == "none":
    report = flow.run(checkpointing=Checkpointing(protocol="none"))
else:
    # `baseline` and `default` run with their build's defaults.
    extra = {"direct_io": case == "direct"} if case in ("buffered", "direct") else {}
    report = flow.run(
        checkpointing=Checkpointing(protocol="aligned", interval=interval),
        checkpoint_dir=root,
        **extra,
    )
after = os.times()
stop.set()
sampler.join()
shutil.rmtree(root, ignore_errors=True)
cpu = collections.Counter()
for name, seconds in threads.values():
    cpu[re.sub(r"[-_]?\d+$", "", name)] += seconds
done = [c.duration_s for c in report.completed_checkpoints if not c.is_final]
print(json.dumps({
    "job_s": round(report.duration_s, 3),
    "checkpoints": len(done),
    "checkpoint_median_s": round(statistics.median(done), 3) if done else None,
    "checkpoint_max_s": round(max(done), 3) if done else None,
    "user_s": round(after.user - before.user, 2),
    "sys_s": round(after.system - before.system, 2),
    "tasks_cpu_s": round(sum(v for k, v in cpu.items() if k.startswith("snapcut-stage")), 2),
    "writer_cpu_s": round(sum(v for k, v in cpu.items() if k.startswith("snapcut-store")), 2),
    "compactor_cpu_s": round(sum(v for k, v in cpu.items() if k.startswith("snapcut-compact")), 2),
}))
"""

CASES = ("none", "buffered", "direct", "default")


def child(args: argparse.Namespace, case: str) -> dict[str, Any]:
    extra = {"MIMALLOC_PURGE_DELAY": "10"} if case in ("buffered", "direct") else {}
    env = child_env(args.baseline if case == "baseline" else "", **extra)
    if case not in ("buffered", "direct"):
        env.pop("MIMALLOC_PURGE_DELAY", None)
    cmd = [sys.executable, "-c", CHILD, str(args.keys), str(args.records), str(args.interval), case]
    return run_json_child(cmd, env, args.timeout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--keys", type=int, default=10_000_000)
    p.add_argument("--records", type=int, default=100_000_000)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--baseline", default="", help="another build's python/ directory")
    p.add_argument("--cases", default=",".join(CASES), help="which of " + ", ".join(CASES))
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    chosen = tuple(c for c in args.cases.split(",") if c)
    unknown = set(chosen) - set(CASES)
    if unknown or "none" not in chosen:
        p.error(f"--cases takes 'none' and any of {', '.join(CASES)}; got {args.cases!r}")
    cases = chosen + (("baseline",) if args.baseline else ())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with open(out / "runs.jsonl", "w") as f:
        f.write(json.dumps({"args": vars(args)}) + "\n")
        for rnd in range(args.rounds):
            for case in cases if rnd % 2 == 0 else cases[::-1]:
                load = os.getloadavg()[0]
                row = child(args, case) | {"case": case, "round": rnd, "load_1m": round(load, 2)}
                print(json.dumps(row), flush=True)
                f.write(json.dumps(row) + "\n")
                f.flush()
                rows.append(row)
                time.sleep(2)
    none = {r["round"]: r for r in rows if r["case"] == "none"}
    print()
    print(
        "| case | job, s | overhead over `none` | checkpoints | checkpoint median / max, s "
        "| longest / median | user + sys CPU, s | tasks / writer / compactor CPU, s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for case in cases:
        runs = [r for r in rows if r["case"] == case]
        cells = [spread([r["job_s"] for r in runs], ".3g")]
        if case == "none":
            cells += ["", "", "", ""]
        else:
            over = [100 * (r["job_s"] / none[r["round"]]["job_s"] - 1) for r in runs]
            cells += [
                spread(over, "+.1f") + " %",
                spread([r["checkpoints"] for r in runs], ".0f"),
                spread([r["checkpoint_median_s"] for r in runs], ".2f")
                + " / "
                + spread([r["checkpoint_max_s"] for r in runs], ".2f"),
                spread([r["checkpoint_max_s"] / r["checkpoint_median_s"] for r in runs], ".1f"),
            ]
        cells += [
            spread([r["user_s"] + r["sys_s"] for r in runs], ".1f"),
            " / ".join(
                f"{statistics.median([r[k] for r in runs]):.1f}"
                for k in ("tasks_cpu_s", "writer_cpu_s", "compactor_cpu_s")
            ),
        ]
        print(f"| {case} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
