r"""Ratios within each group of a pytest-benchmark JSON: every benchmark's
median over its group's baseline's median (the test that set
``extra_info["baseline"]``, else the group's first), with the IQR as a share
of the median, the rounds, and the load average around it. pytest-benchmark's
own table puts a ratio to the *fastest* of each column in parentheses; this
prints the ratio to the variant the comparison is about (queue.Queue, no
checkpoints, a full write, Spark's native aggregation).

Several files (e.g. two commits' autosaved runs) are printed side by side,
each file's ratios against its own baseline: compare ratios across runs, not
absolute times, on a noisy machine.

``--modes``: for a bimodal benchmark (the channel group on a 2-vCPU guest,
where producer and consumer threads sometimes share a core), also split its
rounds at the widest gap and print each mode's median and share of rounds.
Needs the rounds' data: ``--benchmark-json`` has it; an autosaved run only
with ``--benchmark-save-data``.

    python bench/compare.py bench/results/pytest_bench/pytest-bench.json [--group channel] [--modes]
    python bench/compare.py bench/results/benchmarks/*/0001_*.json \
        bench/results/benchmarks/*/0002_*.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def load(path: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data


def groups(data: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for b in data["benchmarks"]:
        out.setdefault(b["group"] or "(no group)", []).append(b)
    return out


def baseline(benches: list[dict[str, Any]]) -> dict[str, Any]:
    return next((b for b in benches if b["extra_info"].get("baseline")), benches[0])


def modes(data: list[float], min_share: float = 0.15, min_gap: float = 1.5) -> str | None:
    """Two modes if the sorted rounds (10 or more) have a gap of at least
    ``min_gap`` times with at least ``min_share`` of the rounds on each side,
    else None."""
    xs = sorted(data)
    n = len(xs)
    if n < 10:
        return None
    lo = max(1, int(n * min_share))
    best, at = 0.0, 0
    for i in range(lo, n - lo + 1):
        if xs[i - 1] > 0 and xs[i] / xs[i - 1] > best:
            best, at = xs[i] / xs[i - 1], i
    if best < min_gap:
        return None
    fast, slow = xs[:at], xs[at:]
    return (
        f"fast {human(statistics.median(fast))} ({len(fast)}/{n}), "
        f"slow {human(statistics.median(slow))} ({len(slow)}/{n})"
    )


def human(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def describe(path: str, data: dict[str, Any]) -> str:
    snap = data.get("snapcut", {})
    commit = data.get("commit_info", {})
    load = [f"{x:.2f}" for k in ("load_before", "load_after") for x in (snap.get(k) or [])[:1]]
    dirty = " (dirty)" if commit.get("dirty") else ""
    return (
        f"{path}: commit {str(commit.get('id', '?'))[:10]}{dirty}"
        f", {data.get('datetime', '?')}, cores {snap.get('usable', '?')}"
        f", load 1-min {' -> '.join(load) or '?'}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", nargs="+", help="pytest-benchmark JSON files")
    parser.add_argument("--group", help="only groups whose name contains this")
    parser.add_argument("--modes", action="store_true", help="print two modes where found")
    parser.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="KEY",
        help="also a numeric extra_info field and its ratio to the baseline's "
        "(e.g. addBatch_median_s, bytes); repeatable",
    )
    args = parser.parse_args()
    runs = [(p, load(p)) for p in args.json]
    for i, (p, d) in enumerate(runs):
        print(f"[{i}] {describe(p, d)}")
    names: dict[str, list[str]] = {}
    for _, d in runs:
        for g, benches in groups(d).items():
            for b in benches:
                if b["name"] not in names.setdefault(g, []):
                    names[g].append(b["name"])
    for g, tests in names.items():
        if args.group and args.group not in g:
            continue
        print(f"\n## {g}")
        head = ["test"]
        for i in range(len(runs)):
            head += [f"[{i}] median", f"[{i}] IQR/median", f"[{i}] rounds", f"[{i}] ratio"]
            for key in args.extra:
                head += [f"[{i}] {key}", f"[{i}] ratio"]
        rows = [head]
        notes = []
        for name in tests:
            row = [name]
            for i, (_, d) in enumerate(runs):
                benches = groups(d).get(g, [])
                b = next((x for x in benches if x["name"] == name), None)
                if b is None:
                    row += ["-"] * (4 + 2 * len(args.extra))
                    continue
                s, base = b["stats"], baseline(benches)["stats"]
                row += [
                    human(s["median"]),
                    f"{s['iqr'] / s['median']:.0%}",
                    str(s["rounds"]),
                    f"{s['median'] / base['median']:.2f}",
                ]
                if b is baseline(benches):
                    row[-1] += " (baseline)"
                for key in args.extra:
                    v, bv = b["extra_info"].get(key), baseline(benches)["extra_info"].get(key)
                    if isinstance(v, int | float):
                        ok = isinstance(bv, int | float) and bv
                        row += [f"{v:.4g}", f"{v / bv:.2f}" if ok else "-"]
                    else:
                        row += ["-", "-"]
                if args.modes and s.get("data"):
                    m = modes(s["data"])
                    if m:
                        notes.append(f"[{i}] {name}: two modes: {m}")
            rows.append(row)
        widths = [max(len(r[c]) for r in rows) for c in range(len(head))]
        for r in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
        for n in notes:
            print(n)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
