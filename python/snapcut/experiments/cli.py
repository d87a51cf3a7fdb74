"""`snapcut experiment` / `python -m snapcut.experiments`: run a grid (whole
runs, then a windowed run per overhead cell of experiments 1, 2, 4, 5: its
overhead with a 95 % interval), write results.csv, timeline.csv,
windows.csv, effects.csv, report.md and PNG plots to --out.

  --tiny   seconds (CI keeps the command working)
  --quick  a few minutes on 2 cores (the default)
  --full   the real grid; says how long it will take before it starts

Experiments: interval (1), timeline (3), state-size (2), parallelism (5),
backpressure (4), scaling-sim (6, a calibrated simulation of 5 to 1,000 nodes),
spark (7, background vs sync state writes on Spark; --quick and --full only);
--experiments picks some (names or numbers, comma-separated).
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from snapcut._core import SnapcutError
from snapcut.experiments import resolve
from snapcut.experiments.grid import check_protocols, preset
from snapcut.experiments.job import run_cell
from snapcut.experiments.machine import Machine
from snapcut.experiments.report import write_all
from snapcut.experiments.runner import Plan, calibrate, describe, execute, save_partial


def configure(p: argparse.ArgumentParser) -> None:
    size = p.add_mutually_exclusive_group()
    for name, what in (
        ("tiny", "a grid that runs in seconds (CI)"),
        ("quick", "a grid that runs in a few minutes on 2 cores (default)"),
        ("full", "the full grid (prints how long it will take first)"),
    ):
        size.add_argument(f"--{name}", dest="preset", action="store_const", const=name, help=what)
    p.set_defaults(preset="quick")
    p.add_argument(
        "--experiments",
        action="append",
        metavar="NAMES",
        help="which experiments: interval,timeline,state-size,parallelism,backpressure,"
        "scaling-sim,spark (or 1,3,2,5,4,6,7; spark needs pyspark and Java 17); "
        "default all",
    )
    p.add_argument(
        "--protocols",
        help="comma-separated protocols to run instead of each experiment's own "
        "(none is the baseline overheads are computed against)",
    )
    p.add_argument("--repetitions", type=int, help="runs per cell (default: the preset's)")
    p.add_argument("--out", type=Path, default=Path("experiment-results"), help="output directory")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots (no matplotlib)")
    p.add_argument(
        "--dry-run", action="store_true", help="print the plan and the time estimate only"
    )


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "experiment",
        help="run the ABS-vs-sync experiment grid; write CSV, a markdown report and plots",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    configure(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    console = Console()
    err = Console(stderr=True)
    try:
        experiments = resolve(args.experiments)
        chosen = preset(args.preset)
        protocols = (
            check_protocols([x.strip() for x in args.protocols.split(",") if x.strip()])
            if args.protocols
            else None
        )
        cells = [c for e in experiments for c in e.cells(chosen, protocols)]
        reps = chosen.repetitions if args.repetitions is None else args.repetitions
        plan = Plan(experiments, chosen, reps, cells)
        plan.runs  # noqa: B018 - validates repetitions
        if not args.no_plots:
            from snapcut.experiments.plots import pyplot

            pyplot()  # fail before hours of runs, not after
        machine = Machine()
        if chosen.name != "tiny":
            console.print("calibrating (one short run without checkpoints)…")
            calibrate(plan, run_cell, args.out)
        console.print(describe(plan))
        if args.dry_run:
            return 0
        args.out.mkdir(parents=True, exist_ok=True)
        outcome = execute(plan, console, on_row=save_partial(args.out))
        machine.finish()
        files = write_all(
            outcome,
            experiments,
            chosen,
            machine,
            _command(args),
            args.out,
            make_plots=not args.no_plots,
        )
    except SnapcutError as e:
        err.print(f"snapcut experiment: error: {e}", markup=False, highlight=False)
        return 2
    console.print(f"wrote {len(files)} files to {args.out}:")
    for f in files:
        console.print(f"  {f}", markup=False, highlight=False)
    return 0


def _command(args: argparse.Namespace) -> str:
    parts = ["snapcut", "experiment", f"--{args.preset}"]
    for e in args.experiments or []:
        parts += ["--experiments", e]
    if args.protocols:
        parts += ["--protocols", args.protocols]
    if args.repetitions is not None:
        parts += ["--repetitions", str(args.repetitions)]
    parts += ["--out", str(args.out)]
    if args.no_plots:
        parts.append("--no-plots")
    return shlex.join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m snapcut.experiments",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    configure(parser)
    return run(parser.parse_args(argv))
