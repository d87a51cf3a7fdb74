"""Side by side with the peers (issue 10 §3): the whole grid in ONE run.

Every configuration runs in its own subprocess with its system's Python
(snapcut and Spark: the Python running this script; PyFlink and bytewax:
their own virtualenvs, made by `bash bench/peers/setup.sh`), prints one
JSON line, and is repeated for R rounds. A round runs each configuration
once, next to the run without checkpoints it is compared with (see
`schedule`), in an order rotated from round to round.
Figures are medians over rounds; the overhead of checkpointing is computed
per round against the same round's run without checkpoints, then the median.

    python bench/peers/run.py --dry-run          # the grid and its estimated time
    python bench/peers/run.py --quick            # small sizes, into bench/out/peers
    python bench/peers/run.py                    # the real run, into bench/results/peers
    python bench/peers/run.py --systems snapcut bytewax --rounds 1

Writes peers.json (every run + the summary), peers.md and two PNG plots.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SYSTEMS = ("snapcut", "flink", "bytewax", "spark")
JOBS = ("dwell", "three-shuffle")
KEYS = (1000, 100_000)
INTERVALS = ("1s", "100ms")
VENV = {"flink": ".venv-flink", "bytewax": ".venv-bytewax"}

# Records per run, (system, job or Spark API) -> (default, quick). Defaults
# aim at >= ~5 s of steady work per configuration on a quiet 2-core machine.
RECORDS: dict[tuple[str, str], tuple[int, int]] = {
    ("snapcut", "dwell"): (400_000_000, 4_000_000),
    ("snapcut", "three-shuffle"): (150_000_000, 1_000_000),
    ("flink", "dwell"): (8_000_000, 200_000),
    ("flink", "three-shuffle"): (3_000_000, 100_000),
    ("bytewax", "dwell"): (2_000_000, 50_000),
    ("bytewax", "three-shuffle"): (600_000, 20_000),
    ("spark", "native"): (4_000_000, 100_000),
    ("spark", "snapcut"): (4_000_000, 100_000),
    ("spark", "pandas"): (600_000, 30_000),
}
# Rough records/s without checkpoints (for the time estimate only), start-up
# seconds per run, and slowdown with checkpoints at 100 ms.
RATE: dict[tuple[str, str], float] = {
    ("snapcut", "dwell"): 60e6,
    ("snapcut", "three-shuffle"): 20e6,
    ("flink", "dwell"): 0.8e6,
    ("flink", "three-shuffle"): 0.3e6,
    ("bytewax", "dwell"): 0.3e6,
    ("bytewax", "three-shuffle"): 0.1e6,
    ("spark", "native"): 0.5e6,
    ("spark", "snapcut"): 0.5e6,
    ("spark", "pandas"): 0.1e6,
}
STARTUP_S = {"snapcut": 1.5, "flink": 20.0, "bytewax": 1.0, "spark": 40.0}
SPARK_BATCH_FLOOR_S = 0.25
PANDAS_S_PER_KEY = 1.3e-3
"""applyInPandasWithState: Python per key and batch (bench/results/spark_state/README.md)."""


@dataclass(frozen=True)
class Config:
    system: str
    job: str
    keys: int
    checkpointing: str
    mode: str
    parallelism: int
    records: int

    @property
    def variant(self) -> str:
        """A row of the table: the system with its mode/API and parallelism."""
        name = {
            ("snapcut", "aligned"): "snapcut aligned",
            ("snapcut", "unaligned"): "snapcut unaligned",
            ("flink", "aligned"): "PyFlink SQL aligned",
            ("flink", "unaligned"): "PyFlink SQL unaligned",
            ("flink", "aligned-minibatch"): "PyFlink SQL mini-batch, aligned",
            ("bytewax", "recovery"): "bytewax",
            ("spark", "native"): "Spark native groupBy().agg()",
            ("spark", "pandas"): "Spark applyInPandasWithState",
            ("spark", "snapcut"): "Spark + snapcut keyed_state level 1",
        }[(self.system, self.mode)]
        return f"{name} (p={self.parallelism})" if self.system == "bytewax" else name

    def label(self) -> str:
        return (
            f"{self.system} {self.job} {self.keys:,} keys ckpt={self.checkpointing} "
            f"{self.mode} p={self.parallelism}"
        )

    def key(self) -> tuple[Any, ...]:
        return (self.system, self.job, self.keys, self.checkpointing, self.mode, self.parallelism)

    def baseline_key(self) -> tuple[Any, ...]:
        """Key of the run without checkpoints this one is compared with (its
        own key when it is that run)."""
        return (self.system, self.job, self.keys, "off", _off_mode(self), self.parallelism)

    def size_key(self) -> tuple[str, str]:
        return (self.system, self.mode if self.system == "spark" else self.job)

    def argv(self, workdir: Path) -> list[str]:
        script = HERE / f"{self.system}_job.py"
        return [
            str(script),
            "--job",
            self.job,
            "--keys",
            str(self.keys),
            "--records",
            str(self.records),
            "--checkpointing",
            self.checkpointing,
            "--mode",
            self.mode,
            "--parallelism",
            str(self.parallelism),
            "--workdir",
            str(workdir),
        ]

    def estimate_s(self) -> float:
        rate = RATE[self.size_key()]
        slow = 1.0
        if self.checkpointing == "1s":
            slow = 1.2
        elif self.checkpointing == "100ms":
            slow = 1.5
            if self.system == "bytewax":
                slow = 18.0 if self.keys >= 100_000 else 3.0
        run = self.records / rate * slow
        if self.system == "spark":
            interval = {"1s": 1.0, "100ms": 0.1}.get(self.checkpointing)
            if interval is not None:
                # micro-batches of rate x interval rows, each >= ~0.25 s
                floor = SPARK_BATCH_FLOOR_S
                if self.mode == "pandas":
                    floor += self.keys * PANDAS_S_PER_KEY  # every batch touches ~every key
                run = max(run, self.records / (rate * interval) * floor)
            run += 2 * (self.records / 5) / rate  # the warm-up query
        return STARTUP_S[self.system] + run


def grid(
    systems: tuple[str, ...], jobs: tuple[str, ...], keys: tuple[int, ...], quick: bool
) -> list[Config]:
    """Every configuration once, in a fixed order."""
    out: list[Config] = []

    def add(system: str, job: str, k: int, mode: str, p: int = 2, intervals: bool = True) -> None:
        size = RECORDS[(system, mode if system == "spark" else job)][1 if quick else 0]
        for ck in ("off", *INTERVALS) if intervals else INTERVALS:
            out.append(Config(system, job, k, ck, mode, p, size))

    for job in jobs:
        for k in keys:
            if "snapcut" in systems:
                add("snapcut", job, k, "aligned")
                add("snapcut", job, k, "unaligned", intervals=False)
            if "flink" in systems:
                add("flink", job, k, "aligned")
                add("flink", job, k, "unaligned", intervals=False)
                if job == "dwell" and not quick:
                    add("flink", job, k, "aligned-minibatch")
            if "bytewax" in systems:
                add("bytewax", job, k, "recovery", p=2)
                if job == "dwell" and not quick:
                    add("bytewax", job, k, "recovery", p=1)
            if "spark" in systems and job == "dwell":
                add("spark", job, k, "native")
                add("spark", job, k, "snapcut")
                # applyInPandasWithState calls Python once per key and batch:
                # ~1.3 ms a key (bench/results/spark_state/README.md), so at 100k keys
                # one micro-batch takes minutes; only 1k keys.
                if k <= 10_000 and not quick:
                    add("spark", job, k, "pandas")
    return out


def schedule(configs: list[Config], rounds: int) -> list[tuple[int, Config]]:
    """(round, config) in run order. A round runs every config once, in blocks:
    each run without checkpoints next to the runs compared with it, so a pair
    is minutes closer than across a whole round (this guest changes speed
    from one minute to the next). Round r rotates the blocks' order and the
    order inside each block by r, so no config always runs first or last."""
    blocks: dict[tuple[Any, ...], list[Config]] = {}
    for c in configs:
        blocks.setdefault(c.baseline_key(), []).append(c)
    cells = list(blocks.values())
    order: list[tuple[int, Config]] = []
    for r in range(rounds):
        for block in _rotated(cells, r):
            order.extend((r, c) for c in _rotated(block, r))
    return order


def _rotated(items: list[Any], r: int) -> list[Any]:
    k = r % len(items) if items else 0
    return items[k:] + items[:k]


def python_for(system: str, venv_dir: Path) -> Path:
    if system in VENV:
        return venv_dir / VENV[system] / "bin" / "python"
    return Path(sys.executable)


def check_venvs(systems: tuple[str, ...], venv_dir: Path) -> list[str]:
    """One clear message per selected peer whose virtualenv is missing."""
    problems = []
    for s in systems:
        if s in VENV:
            py = python_for(s, venv_dir)
            if not py.exists():
                problems.append(
                    f"{s}: {py} not found. Create the peers' virtualenvs with "
                    f"`bash bench/peers/setup.sh` (or `bash bench/peers/setup.sh {s}`), "
                    f"or leave {s} out with --systems."
                )
    return problems


def run_one(
    cfg: Config, python: Path, workdir: Path, timeout: float, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Runs `cfg` (plus the job's `extra` arguments) in a subprocess: its JSON
    line, with the process's wall and CPU seconds, or {"error": ...}."""
    env = dict(os.environ)
    if cfg.system in ("snapcut", "spark"):
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO / "python"), env.get("PYTHONPATH", "")) if p
        )
        env.setdefault("PYSPARK_PYTHON", str(python))
    else:
        env.pop("PYTHONPATH", None)  # the peers' venvs must not see snapcut's
    started = time.time()
    load1 = os.getloadavg()[0]
    # CPU seconds of the run's process tree (every thread; descendants once
    # reaped): steadier than wall time when the guest lends a core away.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        proc = subprocess.run(
            [str(python), *cfg.argv(workdir), *extra],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=REPO,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "load1_before": load1}
    elapsed = time.time() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
        return {"error": f"exit {proc.returncode}: " + "\n".join(tail), "load1_before": load1}
    out: dict[str, Any] = json.loads(line)
    out["process_s"] = elapsed
    out["process_cpu_s"] = cpu_s
    out["load1_before"] = load1
    return out


# ---------------------------------------------------------------- summary


def summarize(configs: list[Config], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration: median records/s, checkpoints, bytes, and the median
    over rounds of the overhead against the same round's run without checkpoints."""
    by_round: dict[tuple[Any, ...], dict[int, dict[str, Any]]] = {}
    for r in runs:
        if "error" not in r["result"]:
            by_round.setdefault(tuple(r["config_key"]), {})[r["round"]] = r["result"]
    rows = []
    for cfg in configs:
        mine = by_round.get(cfg.key(), {})
        rps = [m["records_per_s"] for m in mine.values()]
        base = by_round.get(cfg.baseline_key(), {})
        paired = (
            []
            if cfg.checkpointing == "off"
            else [(m, base[r]) for r, m in mine.items() if r in base]
        )
        overheads = [b["records_per_s"] / m["records_per_s"] - 1 for m, b in paired]
        # CPU time per record of the whole process (start-up included).
        cpu_overheads = [
            _cpu_per_record(m) / _cpu_per_record(b) - 1
            for m, b in paired
            if m.get("process_cpu_s") and b.get("process_cpu_s")
        ]
        errors = [
            r["result"]["error"]
            for r in runs
            if tuple(r["config_key"]) == cfg.key() and "error" in r["result"]
        ]
        rows.append(
            {
                **asdict(cfg),
                "variant": cfg.variant,
                "runs": len(rps),
                "errors": errors,
                "records_per_s": statistics.median(rps) if rps else None,
                "records_per_s_min": min(rps, default=None),
                "records_per_s_max": max(rps, default=None),
                **_spread("overhead", overheads),
                **_spread("cpu_overhead", cpu_overheads),
                "checkpoints": _median(m.get("checkpoints") for m in mine.values()),
                "checkpoint_bytes": _median(m.get("checkpoint_bytes") for m in mine.values()),
                "seconds": _median(m.get("seconds") for m in mine.values()),
                "effective_interval_s": _median(
                    m.get("effective_interval_s") for m in mine.values()
                ),
            }
        )
    return rows


def _spread(name: str, values: list[float]) -> dict[str, float | None]:
    """`name` (the median), `name_min` and `name_max` over rounds."""
    return {
        name: statistics.median(values) if values else None,
        f"{name}_min": min(values, default=None),
        f"{name}_max": max(values, default=None),
    }


def _cpu_per_record(result: dict[str, Any]) -> float:
    return float(result["process_cpu_s"]) / float(result["records"])


def _baseline_row(rows: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, Any] | None:
    """The summary row of the run without checkpoints that `row` is compared with."""
    key = _config_of(row).baseline_key()
    return next((r for r in rows if _config_of(r).key() == key), None)


def _config_of(row: dict[str, Any]) -> Config:
    return Config(**{f: row[f] for f in Config.__dataclass_fields__})


def _off_mode(cfg: Config) -> str:
    """The mode of the run without checkpoints that `cfg` is compared with."""
    if cfg.system == "snapcut":
        return "aligned"
    if cfg.system == "flink":
        return "aligned-minibatch" if cfg.mode == "aligned-minibatch" else "aligned"
    return cfg.mode


def _median(values: Any) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, from this run's medians."""

    def rps(system: str, job: str, keys: int, ck: str, pred: Any = None) -> list[dict[str, Any]]:
        return [
            r
            for r in rows
            if r["system"] == system
            and r["job"] == job
            and r["keys"] == keys
            and r["checkpointing"] == ck
            and r["records_per_s"]
            and (pred is None or pred(r))
        ]

    out = []
    jobs_keys = sorted({(r["job"], r["keys"]) for r in rows})
    for job, keys in jobs_keys:
        snap = rps("snapcut", job, keys, "1s", lambda r: r["mode"] == "aligned")
        if not snap:
            continue
        s = snap[0]["records_per_s"]
        for peer, name, need in (("flink", "PyFlink SQL", 40), ("bytewax", "bytewax", 100)):
            cands = rps(peer, job, keys, "1s")
            if not cands:
                continue
            best = max(cands, key=lambda r: r["records_per_s"])
            ratio = s / best["records_per_s"]
            out.append(
                {
                    "target": f"snapcut ≥ {need}x {name}, checkpoints every 1 s",
                    "job": job,
                    "keys": keys,
                    "value": f"{ratio:,.0f}x (snapcut aligned {_fmt_rps(s)} vs "
                    f"{best['variant']} {_fmt_rps(best['records_per_s'])})",
                    "met": ratio >= need,
                }
            )
        for r in rps("snapcut", job, keys, "100ms"):
            if r["overhead"] is None:
                continue
            out.append(
                {
                    "target": "snapcut's overhead at 100 ms ≤ 10%",
                    "job": job,
                    "keys": keys,
                    "value": f"{r['overhead']:+.1%} ({r['mode']})",
                    "met": r["overhead"] <= 0.10,
                }
            )
    return out


# ---------------------------------------------------------------- report

PRIOR: list[tuple[str, str, float, float]] = [
    # (figure, system, low, high): issue 10's figures, dwell job, records/s or slowdown
    ("PyFlink SQL records/s", "flink", 0.75e6, 1.4e6),
    ("bytewax records/s", "bytewax", 0.46e6, 0.46e6),
    ("snapcut runtime records/s", "snapcut", 50e6, 120e6),
    ("bytewax slowdown, 100 ms epochs, 100k keys", "bytewax-100ms", 18.0, 18.0),
]


def _confirm(rows: list[dict[str, Any]], figure: str, what: str, lo: float, hi: float) -> str:
    """One row: the figure before, this run's range, and whether they agree (within 25%)."""
    if what == "bytewax-100ms":
        vals = [
            1 + r["overhead"]
            for r in rows
            if r["system"] == "bytewax"
            and r["job"] == "dwell"
            and r["keys"] >= 100_000
            and r["checkpointing"] == "100ms"
            and r["overhead"] is not None
        ]
        fmt: Callable[[float], str] = "{:.1f}x".format
    else:
        vals = [
            r["records_per_s"]
            for r in rows
            if r["system"] == what
            and r["job"] == "dwell"
            and r["checkpointing"] == "off"
            and r["records_per_s"]
        ]
        fmt = _fmt_rps
    before = fmt(lo) if lo == hi else f"{fmt(lo)} to {fmt(hi)}"
    if not vals:
        return f"| {figure} | {before} | not measured | |"
    got_lo, got_hi = min(vals), max(vals)
    got = fmt(got_lo) if got_lo == got_hi else f"{fmt(got_lo)} to {fmt(got_hi)}"
    if got_hi < lo * 0.75:
        verdict = "**corrected: lower**"
    elif got_lo > hi * 1.25:
        verdict = "**corrected: higher**"
    else:
        verdict = "confirmed (overlap, ±25%)"
    return f"| {figure} | {before} | {got} | {verdict} |"


def _fmt_rps(v: float | None) -> str:
    if v is None:
        return "—"
    if v >= 1e6:
        return f"{v / 1e6:,.2f} M/s"
    return f"{v / 1e3:,.1f} k/s"


def _fmt_bytes(v: float | None) -> str:
    if v is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if v < 1024 or unit == "GiB":
            return f"{v:,.0f} {unit}" if unit == "B" else f"{v:,.1f} {unit}"
        v /= 1024
    return "—"


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "—"
    if r["records_per_s"] is None:
        return "failed" if r["errors"] else "—"
    text = _fmt_rps(r["records_per_s"])
    if r["overhead"] is not None:
        text += f" ({r['overhead']:+.0%})"
    return text


CHECKPOINT_MEANING = {
    "snapcut": "a consistent snapshot by the runtime's barrier protocol (aligned or "
    "unaligned ABS): changed keys (a full table every 10th) as Arrow IPC files, fsynced, "
    "plus a manifest by atomic rename, in a local checkpoint_dir; retained 1",
    "flink": "a Flink checkpoint (execution.checkpointing.interval; aligned barriers or "
    "unaligned), hashmap state backend, full snapshots to a local filesystem checkpoint "
    "dir; a bounded job also waits for a final checkpoint after its sources end",
    "bytewax": "an epoch with recovery on: every epoch (epoch_interval) each stateful "
    "step writes the keys it changed into SQLite recovery partitions, synchronously; "
    "off = recovery off (default 10 s epochs)",
    "spark": "a micro-batch: each commits its offsets and state (HDFS-backed state "
    "store; snapcut: Arrow state files in its root) to the checkpoint location; micro-"
    "batches of rate x interval rows with trigger(processingTime=interval); off = the "
    "whole input as one micro-batch (stateful streaming cannot run without a checkpoint)",
}


def _pct_range(mid: float | None, lo: float | None, hi: float | None) -> str:
    if mid is None:
        return "—"
    return f"{mid:+.1%} [{lo:+.0%}, {hi:+.0%}]"


def _overhead_spread(rows: list[dict[str, Any]]) -> list[str]:
    """Overhead per round in wall time and in CPU time: the median and the
    range over rounds. On a guest whose cores come and go, the spread says
    how far one round's figure can be trusted."""
    lines = [
        "",
        "## Overhead per round: wall time and CPU time",
        "",
        "Median over rounds [range]. Wall: records/s off / records/s with checkpoints "
        "- 1. CPU: CPU seconds per record of the whole process (every thread, start-up "
        "included) with checkpoints / off - 1.",
        "",
        "| job | keys | system | interval | rounds | wall overhead | CPU overhead |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["checkpointing"] == "off" or r["overhead"] is None:
            continue
        wall, cpu = (
            _pct_range(*(r.get(f"{n}{s}") for s in ("", "_min", "_max")))
            for n in ("overhead", "cpu_overhead")
        )
        lines.append(
            f"| {r['job']} | {r['keys']:,} | {r['variant']} | {r['checkpointing']} | "
            f"{r['runs']} | {wall} | {cpu} |"
        )
    return lines


SCHEDULES = {
    # Runs before the blocked schedule have no "schedule" in their JSON.
    None: "order rotated",
    "blocked": "each run without checkpoints next to the runs compared with it, order rotated",
}


def write_report(
    out: Path, data: dict[str, Any], rows: list[dict[str, Any]], tgts: list[dict[str, Any]]
) -> list[Path]:
    files = [out / "peers.json", out / "peers.md"]
    order = SCHEDULES[data.get("schedule")]
    lines = [
        "# snapcut side by side with PyFlink, bytewax and Spark",
        "",
        "Issue 10 §3. The same jobs — **dwell** (keyed count + sum of `dwell_ms` per "
        "user over generated `(user, dwell_ms)` events) and **three-shuffle** (the ABS "
        "paper's job of `snapcut experiment`: keyed stages by user, dwell_ms, user, each "
        "behind a hash shuffle) — with checkpoints off, every 1 s and every 100 ms, in one "
        "run on one machine. Parallelism 2 everywhere unless marked. See "
        "`bench/peers/README.md` for what each system's job is and what is not comparable.",
        "",
        "## Machine and run",
        "",
        data["machine_md"],
        "",
        *(
            [
                "**A `--quick` run: sizes that check the harness; these figures are not results.**",
                "",
            ]
            if data.get("quick")
            else []
        ),
        f"Command: `{data['command']}`  ",
        f"Rounds: {data['rounds']} (each round every configuration once, {order}); "
        f"figures are medians over rounds. Wall time of the run: {data['wall_s'] / 60:.1f} min.",
        "",
        "## Records per second (overhead of checkpointing vs the same round's run without)",
        "",
        "Records/s is records over the timed part of each run (per system: "
        "`bench/peers/README.md`). Overhead = (records/s off) / (records/s with "
        "checkpoints) - 1, per round, median.",
        "",
        "| job | keys | system | off | every 1 s | every 100 ms |",
        "|---|---|---|---|---|---|",
    ]
    index = {(r["job"], r["keys"], r["variant"], r["checkpointing"]): r for r in rows}
    seen = []
    for r in rows:
        k = (r["job"], r["keys"], r["variant"])
        if k not in seen:
            seen.append(k)
    for job, keys, variant in seen:
        cfg = next(r for r in rows if (r["job"], r["keys"], r["variant"]) == (job, keys, variant))
        off = _baseline_row(rows, cfg)
        lines.append(
            f"| {job} | {keys:,} | {variant} | {_cell(off)} | "
            f"{_cell(index.get((job, keys, variant, '1s')))} | "
            f"{_cell(index.get((job, keys, variant, '100ms')))} |"
        )
    lines += _overhead_spread(rows)
    lines += [
        "",
        "## Against the targets",
        "",
        "| target | job | keys | this run | |",
        "|---|---|---|---|---|",
    ]
    for t in tgts:
        lines.append(
            f"| {t['target']} | {t['job']} | {t['keys']:,} | {t['value']} | "
            f"{'met' if t['met'] else '**missed**'} |"
        )
    lines += [
        "",
        "## The figures measured before, confirmed or corrected",
        "",
        "Issue 10 quotes figures measured before on a machine like this one. This run's "
        "dwell job without checkpoints (median; range over 1k and 100k keys and the "
        "system's variants), and bytewax's slowdown at 100 ms epochs with 100k keys:",
        "",
        "| figure | before | this run | |",
        "|---|---|---|---|",
    ]
    lines += [_confirm(rows, *prior) for prior in PRIOR]
    lines += [
        "",
        "## Checkpoints taken and their size",
        "",
        "| job | keys | system | interval | checkpoints | checkpoint bytes | timed s | "
        "effective interval |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["checkpointing"] == "off" or r["records_per_s"] is None:
            continue
        eff = r["effective_interval_s"]
        if eff is None and r["checkpoints"]:
            eff = r["seconds"] / r["checkpoints"]
        lines.append(
            f"| {r['job']} | {r['keys']:,} | {r['variant']} | {r['checkpointing']} | "
            f"{r['checkpoints'] if r['checkpoints'] is not None else '—'} | "
            f"{_fmt_bytes(r['checkpoint_bytes'])} | {r['seconds']:.1f} | "
            f"{f'{eff:.2f} s' if eff else '—'} |"
        )
    lines += ["", "## What each system's checkpoint is", ""]
    lines += [f"- **{s}**: {m}" for s, m in CHECKPOINT_MEANING.items()]
    failed = [r for r in rows if r["errors"]]
    if failed:
        lines += ["", "## Failed runs", ""]
        for r in failed:
            first = r["errors"][0].splitlines()[-1] if r["errors"][0] else ""
            lines.append(
                f"- {r['variant']} {r['job']} {r['keys']:,} keys {r['checkpointing']}: "
                f"{len(r['errors'])} failed — `{first[:200]}`"
            )
    lines += ["", "## Plots", ""]
    plots = plot(out, rows)
    files += plots
    lines += [f"![{p.stem}]({p.name})" for p in plots]
    lines += ["", f"Versions: {json.dumps(data['versions'])}", ""]
    (out / "peers.md").write_text("\n".join(lines))
    return files


def plot(out: Path, rows: list[dict[str, Any]]) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    panels = sorted({(r["job"], r["keys"]) for r in rows})
    if not panels:
        return []
    files = []
    # 1. records/s per system (log scale), one panel per job and key count.
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3.2 * len(panels)), squeeze=False)
    for ax, (job, keys) in zip(axes[:, 0], panels, strict=True):
        variants = list(
            dict.fromkeys(r["variant"] for r in rows if (r["job"], r["keys"]) == (job, keys))
        )
        width = 0.27
        for j, ck in enumerate(("off", *INTERVALS)):
            vals = []
            for v in variants:
                r = next(
                    (
                        x
                        for x in rows
                        if (x["job"], x["keys"], x["variant"], x["checkpointing"])
                        == (job, keys, v, ck)
                    ),
                    None,
                )
                if r is None and ck == "off":
                    # unaligned/... share the off run of their family
                    r = _baseline_row(
                        rows,
                        next(
                            x for x in rows if (x["job"], x["keys"], x["variant"]) == (job, keys, v)
                        ),
                    )
                vals.append((r or {}).get("records_per_s") or 0)
            ys = [i + (j - 1) * width for i in range(len(variants))]
            ax.barh(ys, vals, height=width, label=f"checkpoints {ck}")
        ax.set_yticks(range(len(variants)), variants, fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("records/s (log)")
        ax.set_title(f"{job}, {keys:,} keys")
        ax.invert_yaxis()
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = out / "peers_throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    files.append(path)
    # 2. slowdown vs checkpoint interval.
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), squeeze=False)
    for ax, (job, keys) in zip(axes[0], panels, strict=True):
        for v in dict.fromkeys(r["variant"] for r in rows if (r["job"], r["keys"]) == (job, keys)):
            pts = [
                (1.0 if r["checkpointing"] == "1s" else 0.1, 1 + r["overhead"])
                for r in rows
                if (r["job"], r["keys"], r["variant"]) == (job, keys, v)
                and r["overhead"] is not None
            ]
            if pts:
                pts.sort()
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=v)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks([0.1, 1.0], ["100 ms", "1 s"])
        ax.axhline(1.1, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("checkpoint interval")
        ax.set_ylabel("time with checkpoints / without (log)")
        ax.set_title(f"{job}, {keys:,} keys", fontsize=9)
        ax.legend(fontsize=6)
    fig.tight_layout()
    path = out / "peers_overhead.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    files.append(path)
    return files


# ---------------------------------------------------------------- main


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/peers/run.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--jobs", nargs="+", choices=JOBS, default=list(JOBS))
    p.add_argument("--keys", nargs="+", type=int, default=None, help="default 1000 100000")
    p.add_argument("--rounds", type=int, default=None, help="default 3 (--quick: 1)")
    p.add_argument("--quick", action="store_true", help="small sizes, 1k keys: minutes")
    p.add_argument("--dry-run", action="store_true", help="list the grid and the time estimate")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="default bench/results/peers (--quick: bench/out/peers)",
    )
    p.add_argument(
        "--venv-dir",
        type=Path,
        default=HERE,
        help="where .venv-flink and .venv-bytewax are (default bench/peers)",
    )
    p.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="write the report again from an earlier run's peers.json (runs nothing)",
    )
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="scratch dir for checkpoints (default: the system temp dir)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    keys = tuple(args.keys) if args.keys else ((1000,) if args.quick else KEYS)
    rounds = args.rounds or (1 if args.quick else 3)
    systems = tuple(s for s in SYSTEMS if s in args.systems)
    configs = grid(systems, tuple(args.jobs), keys, args.quick)
    order = schedule(configs, rounds)
    total_est = sum(c.estimate_s() for _, c in order)
    out = args.out or (
        REPO / "bench" / "out" / "peers" if args.quick else REPO / "bench" / "results" / "peers"
    )
    problems = check_venvs(systems, args.venv_dir)

    if args.dry_run:
        print(
            f"{len(configs)} configurations x {rounds} rounds = {len(order)} runs, "
            f"estimated {total_est / 60:.0f} min on a quiet 2-core machine"
        )
        for c in configs:
            print(f"  {c.label():<70} records={c.records:>11,}  ~{c.estimate_s():6.0f} s")
        for msg in problems:
            print(f"warning: {msg}")
        print(f"results would go to {out}")
        return 0
    if args.from_json is not None:
        data = json.loads(args.from_json.read_text())
        configs = [Config(**c) for c in data["configs"]]
        rows = summarize(configs, data["runs"])
        data["summary"], data["targets"] = rows, targets(rows)
        out = args.out or args.from_json.parent
        out.mkdir(parents=True, exist_ok=True)
        (out / "peers.json").write_text(json.dumps(data, indent=1, default=str))
        for f in write_report(out, data, rows, data["targets"]):
            print(f"wrote {f}")
        return 0
    if problems:
        for msg in problems:
            print(f"error: {msg}", file=sys.stderr)
        return 2

    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    sys.path.insert(0, str(REPO / "python"))
    from snapcut.experiments.machine import Machine

    machine = Machine()
    out.mkdir(parents=True, exist_ok=True)
    workdir = args.workdir
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        import tempfile

        workdir = Path(tempfile.gettempdir())
    runs: list[dict[str, Any]] = []
    started = time.time()
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
    ) as progress:
        task = progress.add_task("peers", total=total_est)
        for i, (rnd, cfg) in enumerate(order):
            progress.update(task, description=f"[{i + 1}/{len(order)}] r{rnd} {cfg.label()}")
            result = run_one(cfg, python_for(cfg.system, args.venv_dir), workdir, args.timeout)
            if "error" in result:
                progress.console.print(
                    f"[red]failed[/] {cfg.label()}: {result['error'].splitlines()[-1][:200]}"
                )
            else:
                progress.console.print(
                    f"{cfg.label()}: {_fmt_rps(result['records_per_s'])}, "
                    f"{result.get('checkpoints', 0)} checkpoints"
                )
            runs.append({"round": rnd, "config_key": list(cfg.key()), "result": result})
            progress.advance(task, cfg.estimate_s())
    machine.finish()
    rows = summarize(configs, runs)
    tgts = targets(rows)
    versions: dict[str, str] = {}
    for r in runs:
        versions.update(r["result"].get("versions", {}))
    data = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "rounds": rounds,
        "schedule": "blocked",
        "quick": args.quick,
        "wall_s": time.time() - started,
        "machine": asdict(machine),
        "machine_md": machine.markdown(),
        "versions": versions,
        "configs": [asdict(c) for c in configs],
        "runs": runs,
        "summary": rows,
        "targets": tgts,
    }
    (out / "peers.json").write_text(json.dumps(data, indent=1, default=str))
    files = write_report(out, data, rows, tgts)
    for f in files:
        print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
