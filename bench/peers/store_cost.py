"""What a 100 ms checkpoint costs snapcut, split into the protocol and the
durable store: each snapcut peer cell every 100 ms with checkpoints in memory
(no checkpoint_dir), on disk (Arrow IPC + manifest, fsynced) and on disk
without fsync (`run(fsync=False)`, what Flink does on a local directory),
against the same round's run without checkpoints.

    python bench/peers/store_cost.py --rounds 8 --out bench/results/store_cost/memory-vs-disk
    python bench/peers/store_cost.py --rounds 8 --stores disk disk-nofsync
    python bench/peers/store_cost.py --rounds 8 --modes aligned --stores disk disk-syncfs

A round runs every variant of a cell back to back, in an order rotated from
round to round (the blocked schedule of run.py). Writes store_cost.json and
store_cost.md (median overhead over rounds [range], in wall time and in CPU
time, and the median checkpoint and alignment times).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _harness() -> Any:
    spec = importlib.util.spec_from_file_location("peers_run", HERE / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["peers_run"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


run = _harness()

STORES = ("memory", "disk", "disk-perfile", "disk-syncfs", "disk-nofsync")


MODES = ("aligned", "unaligned")


def variants(
    stores: tuple[str, ...] | list[str], modes: tuple[str, ...] | list[str] = MODES
) -> list[tuple[str, str, str | None]]:
    """(label, protocol, store) of each run of a cell; the first is the baseline."""
    return [("off", "aligned", None)] + [
        (f"{mode}, {store}", mode, store)
        for mode in MODES
        if mode in modes
        for store in STORES
        if store in stores
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--jobs", nargs="+", choices=run.JOBS, default=list(run.JOBS))
    p.add_argument("--keys", nargs="+", type=int, default=list(run.KEYS))
    p.add_argument("--records-scale", type=float, default=1.0, help="x run.py's record counts")
    p.add_argument("--stores", nargs="+", choices=STORES, default=list(STORES))
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--out", type=Path, default=run.REPO / "bench" / "out" / "store-cost")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(run.REPO / "python"))
    from snapcut.experiments.machine import Machine

    machine = Machine()
    started = time.time()
    runs: list[dict[str, Any]] = []
    cells = [(job, keys) for job in args.jobs for keys in args.keys]
    plan = variants(args.stores, args.modes)
    with tempfile.TemporaryDirectory(prefix="store-cost-") as work:
        for r in range(args.rounds):
            for job, keys in run._rotated(cells, r):
                records = int(run.RECORDS[("snapcut", job)][0] * args.records_scale)
                for label, mode, store in run._rotated(plan, r):
                    cfg = run.Config(
                        "snapcut", job, keys, "off" if store is None else "100ms", mode, 2, records
                    )
                    extra = () if store is None else ("--store", store)
                    res = run.run_one(cfg, Path(sys.executable), Path(work), 1800.0, extra)
                    runs.append({"round": r, "job": job, "keys": keys, "variant": label, **res})
                    rate = res.get("records_per_s")
                    shown = f"{rate / 1e6:.1f}M/s" if rate else res.get("error", "?")
                    print(f"r{r} {job} {keys:,} {label}: {shown}", flush=True)
    machine.finish()
    rows = summarize(runs, cells, plan)
    data = {
        "command": " ".join(["python", *sys.argv]),
        "wall_s": time.time() - started,
        "machine_md": machine.markdown(),
        "rounds": args.rounds,
        "runs": runs,
        "summary": rows,
    }
    (args.out / "store_cost.json").write_text(json.dumps(data, indent=1, default=str))
    (args.out / "store_cost.md").write_text(report(data))
    print(f"wrote {args.out / 'store_cost.md'}")
    return 0


def summarize(
    runs: list[dict[str, Any]],
    cells: list[tuple[str, int]],
    plan: list[tuple[str, str, str | None]],
) -> list[dict[str, Any]]:
    """Per cell and variant: overheads against the same round's `off` run."""
    ok = [r for r in runs if "error" not in r]
    base = {(r["round"], r["job"], r["keys"]): r for r in ok if r["variant"] == "off"}
    rows = []
    for job, keys in cells:
        for label, _, _ in plan[1:]:
            mine = [r for r in ok if (r["job"], r["keys"], r["variant"]) == (job, keys, label)]
            pairs = [
                (m, base[(m["round"], job, keys)]) for m in mine if (m["round"], job, keys) in base
            ]
            wall = [b["records_per_s"] / m["records_per_s"] - 1 for m, b in pairs]
            cpu = [run._cpu_per_record(m) / run._cpu_per_record(b) - 1 for m, b in pairs]
            rows.append(
                {
                    "job": job,
                    "keys": keys,
                    "variant": label,
                    "rounds": len(pairs),
                    **run._spread("overhead", wall),
                    **run._spread("cpu_overhead", cpu),
                    "checkpoints": run._median(m.get("checkpoints") for m in mine),
                    "checkpoint_ms": run._median(m.get("checkpoint_ms") for m in mine),
                    "alignment_ms": run._median(m.get("alignment_ms") for m in mine),
                }
            )
    return rows


def report(data: dict[str, Any]) -> str:
    lines = [
        "# A 100 ms checkpoint in snapcut: the protocol (memory) and the durable store "
        "(disk, fsynced or not)",
        "",
        data["machine_md"],
        "",
        f"Command: `{data['command']}`  ",
        f"Rounds: {data['rounds']} (each round every variant of a cell back to back, order "
        f"rotated); wall time {data['wall_s'] / 60:.1f} min. Overhead: per round against the "
        "same round's run without checkpoints, median [range]. Wall: records/s; CPU: CPU "
        "seconds per record of the whole process.",
        "",
        "| job | keys | every 100 ms | rounds | wall overhead | CPU overhead | checkpoints "
        "| checkpoint ms | alignment ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for r in data["summary"]:
        lines.append(
            f"| {r['job']} | {r['keys']:,} | {r['variant']} | {r['rounds']} | "
            f"{run._pct_range(r['overhead'], r['overhead_min'], r['overhead_max'])} | "
            f"{run._pct_range(r['cpu_overhead'], r['cpu_overhead_min'], r['cpu_overhead_max'])} | "
            f"{num(r['checkpoints'], '.0f')} | {num(r['checkpoint_ms'], '.1f')} | "
            f"{num(r['alignment_ms'], '.2f')} |"
        )
    errors = [r for r in data["runs"] if "error" in r]
    if errors:
        lines += ["", f"{len(errors)} run(s) failed:", ""]
        lines += [
            f"- r{e['round']} {e['job']} {e['keys']:,} {e['variant']}: {e['error']}" for e in errors
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
