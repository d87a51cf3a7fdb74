"""The report's tables of effects: every overhead cell with its 95 %
interval, its verdict and the paper's claim; then sync's claimed trends."""

from __future__ import annotations

from snapcut.experiments.effects import WHOLE_RUNS, Effect
from snapcut.experiments.verdicts import TARGET_WIDTH, claim, resolved, trends, width

HOW_TO_READ = (
    "**Overhead with a 95 % interval (the windowed method).** Each overhead cell ran "
    "once more as one long run with checkpoints switched on and off in alternating "
    "windows (the first checkpoint of an on window a guard after its start, then one "
    "every interval). Per window, records/s at the last stage after the guard, from the "
    "runtime's 50 ms timeline; an on window's overhead is (mean records/s of the off "
    "windows either side) / (its records/s) - 1, so the machine's drift cancels. The "
    "table gives the median over on windows and its bootstrap 95 % interval (runs "
    "resampled, then windows within them). *Resolved*: the interval excludes 0. *Width* "
    f"over {100 * TARGET_WIDTH:g} points does not decide the cell. *CPU/record*: the "
    "same ratio for the process's CPU seconds per record (extra work); *idle on / off*: "
    "the machine's idle share (stalls show as idle CPU). A *runaway* cell (sync whose "
    "full-state write would last half its interval or more, so that it runs on into the "
    "next off window) is not windowed: its row comes from the whole runs above (runtime "
    "over the same round's `none`, bootstrap over rounds: few rounds, a wide interval "
    "unless the effect dwarfs them). Paper's claim: ABS near the baseline (≤ +10 %); "
    "sync above ABS at the same cell, and rising as the interval shrinks and the state "
    "grows. Raw windows: `windows.csv`; every effect: `effects.csv`.\n"
)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def effects_table(effects: list[Effect], all_effects: list[Effect]) -> str:
    head = (
        "| protocol | interval | keys | tasks/op | method | on windows (runs) "
        "| overhead | 95 % interval | width | verdict | paper's claim | CPU/record "
        "| idle on / off | off M rec/s | checkpoints (skipped) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for e in effects:
        c = e.cell
        proto = f"{c.protocol} ({c.scenario})" if c.scenario else c.protocol
        # Experiment 7's "paired batches" (and any later method) is named as measured.
        method = "whole runs (runaway)" if e.method == WHOLE_RUNS else e.method
        samples = f"{e.samples} rounds" if e.method == WHOLE_RUNS else f"{e.samples} ({e.runs})"
        idle = (
            "-"
            if e.idle_on is None or e.idle_off is None
            else f"{e.idle_on:.0%} / {e.idle_off:.0%}"
        )
        base = "-" if e.baseline_rps is None else f"{e.baseline_rps / 1e6:.2f}"
        lines.append(
            f"| {proto} | {'-' if c.interval_s is None else f'{c.interval_s:g} s'} "
            f"| {c.keys:,} | {c.parallelism} | {method} | {samples} "
            f"| **{_pct(e.overhead)}** | [{_pct(e.low)}, {_pct(e.high)}] | {width(e)} "
            f"| {resolved(e)} | {claim(e, all_effects)} | {_pct(e.cpu_overhead)} | {idle} "
            f"| {base} | {e.checkpoints} ({e.skipped}) |"
        )
    return head + "\n".join(lines) + "\n"


def trends_text(effects: list[Effect]) -> str:
    """Sync's trends (shorter interval, more state: more cost), each decided
    by whether the two ends' intervals are disjoint."""
    ts = trends(effects)
    if not ts:
        return ""
    lines = ["Sync's trends (the paper: its cost rises as the interval shrinks and state grows):\n"]
    for t in ts:
        lines.append(
            f"- {t.what}: **{t.verdict()}** — {_pct(t.small.overhead)} "
            f"[{_pct(t.small.low)}, {_pct(t.small.high)}] against {_pct(t.large.overhead)} "
            f"[{_pct(t.large.low)}, {_pct(t.large.high)}]"
        )
    return "\n".join(lines) + "\n"


def widest(effects: list[Effect]) -> str:
    """The cells whose interval is wider than the target, named."""
    wide = [e for e in effects if e.width > TARGET_WIDTH]
    if not wide:
        return (
            f"Every overhead cell's interval is at most {100 * TARGET_WIDTH:g} points wide.\n"
            if effects
            else ""
        )
    names = ", ".join(f"{e.cell.label()} ({100 * e.width:.0f} pts)" for e in wide)
    return (
        f"{len(wide)} of {len(effects)} cells have an interval wider than "
        f"{100 * TARGET_WIDTH:g} points: {names}.\n"
    )
