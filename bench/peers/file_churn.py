"""What a checkpoint's files cost the kernel: per file, and per MB written.

A store that keeps one checkpoint (the peers' runs: retention 1) creates a
directory and its files at every checkpoint and removes the previous one. At
100 ms that is ten directories a second. This script does exactly that
without snapcut: per round it makes a directory, writes `files` files of
`mb / files` MB each, and removes the previous round's directory; it reports
the process's kernel and user CPU per round (getrusage) for a grid of file
counts and sizes, each without fsync and with an fsync per file, and derives
the CPU ms per file and per MB. CPU the kernel spends outside the process
(write-back threads, interrupts) is counted too.

    python bench/peers/file_churn.py --out bench/results/file_churn
    python bench/peers/file_churn.py --dir /mnt/other-disk --rounds 300

Writes file_churn.json and file_churn.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: (files, MB) per round: the unaligned three-shuffle checkpoint at 100k keys
#: writes about 21 files and 12 MB, an aligned one about 9 files and 6 MB.
GRID = ((2, 0.0), (20, 0.0), (2, 12.0), (8, 12.0), (20, 12.0), (20, 6.0))


def write_file(path: Path, data: bytes, fsync: bool) -> None:
    with path.open("wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def churn(root: Path, files: int, mb: float, rounds: int, fsync: bool) -> dict[str, Any]:
    """CPU ms per round of mkdir + `files` writes (each fsynced if `fsync`) +
    removing the round before: this process's kernel and user time, and the
    machine's busy time outside this process (write-back threads, interrupts);
    medians over 5 blocks of `rounds` / 5 rounds."""
    from snapcut.experiments.machine import busy_seconds, cpu_ticks

    data = os.urandom(int(mb * 2**20 / files))
    blocks: list[tuple[float, float, float, float]] = []
    prev: Path | None = None
    per_block = max(rounds // 5, 1)
    for b in range(5):
        r0, t0, m0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), cpu_ticks()
        for i in range(per_block):
            d = root / f"chk-{files}-{mb:g}-{fsync}-{b}-{i}"
            d.mkdir()
            for f in range(files):
                write_file(d / f"part-{f}.arrow", data, fsync)
            if prev is not None:
                shutil.rmtree(prev)
            prev = d
        r1, t1, m1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), cpu_ticks()
        own = (r1.ru_stime - r0.ru_stime) + (r1.ru_utime - r0.ru_utime)
        busy = busy_seconds(m0, m1) if m0 and m1 else own
        blocks.append(
            (
                (r1.ru_stime - r0.ru_stime) * 1e3 / per_block,
                (r1.ru_utime - r0.ru_utime) * 1e3 / per_block,
                max(busy - own, 0.0) * 1e3 / per_block,
                (t1 - t0) * 1e3 / per_block,
            )
        )
    if prev is not None:
        shutil.rmtree(prev)
    kernel, user, outside, wall = (statistics.median(c) for c in zip(*blocks, strict=True))
    return {
        "files": files,
        "mb": mb,
        "fsync": fsync,
        "bytes_per_round": files * len(data),
        "kernel_ms": kernel,
        "user_ms": user,
        "outside_ms": outside,
        "wall_ms": wall,
    }


def fit(rows: list[dict[str, Any]], fsync: bool) -> tuple[float, float]:
    """(CPU ms per file, CPU ms per MB), kernel and outside the process
    together: the first from the rounds of empty files (20 against 2), the
    second from 20 files of 12 MB against 20 empty ones."""
    k = {
        (r["files"], r["mb"]): r["kernel_ms"] + r["outside_ms"] for r in rows if r["fsync"] == fsync
    }
    return (k[(20, 0.0)] - k[(2, 0.0)]) / 18, (k[(20, 12.0)] - k[(20, 0.0)]) / 12


def report(data: dict[str, Any]) -> str:
    lines = [
        "# What a checkpoint's files cost the kernel",
        "",
        data["machine_md"],
        "",
        f"Command: `{data['command']}`  ",
        f"Directory: {data['filesystem']}. Per round: mkdir, write the files (fsynced one by "
        "one, or not), remove the previous round's directory (retention 1); "
        f"{data['rounds']} rounds a row, the median of 5 blocks. Kernel and user: this "
        "process's; outside: the machine's busy CPU that was not this process's (write-back "
        "threads, interrupts).",
        "",
        "| fsync | files | MB | kernel ms / round | user ms / round | outside ms / round "
        "| wall ms / round |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        lines.append(
            f"| {'yes' if r['fsync'] else 'no'} | {r['files']} | {r['mb']:g} "
            f"| {r['kernel_ms']:.2f} | {r['user_ms']:.2f} | {r['outside_ms']:.2f} "
            f"| {r['wall_ms']:.2f} |"
        )
    lines.append("")
    for fsync, (a, b) in zip((False, True), data["fit"], strict=True):
        lines.append(
            f"- {'With' if fsync else 'Without'} fsync, kernel and outside CPU: {a:.3f} ms "
            f"per file created and removed (20 empty files against 2), {b:.3f} ms per MB "
            "written and removed (20 files of 12 MB against 20 empty). At ten checkpoints a "
            f"second, each file a checkpoint costs {a:.1f} % of one CPU and each MB {b:.1f} %."
        )
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=150, help="rounds per row (5 blocks)")
    p.add_argument(
        "--dir", type=Path, default=None, help="where to churn (default: the temp directory)"
    )
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.rounds < 5:
        p.error("--rounds must be at least 5 (five blocks of at least one round)")
    if args.dir is not None and not args.dir.is_dir():
        p.error(f"--dir {args.dir} is not a directory; create it or pick another")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from snapcut.experiments.machine import Machine

    machine = Machine()
    root = Path(tempfile.mkdtemp(prefix="file-churn-", dir=args.dir))
    try:
        rows = [churn(root, f, mb, args.rounds, sync) for sync in (False, True) for f, mb in GRID]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    machine.finish()
    data = {
        "command": " ".join(["python", *sys.argv]),
        "machine_md": machine.markdown(),
        "filesystem": f"{root.parent} ({filesystem(root.parent)})",
        "rounds": args.rounds,
        "rows": rows,
        "fit": [fit(rows, False), fit(rows, True)],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "file_churn.json").write_text(json.dumps(data, indent=1))
    (args.out / "file_churn.md").write_text(report(data))
    print(f"wrote {args.out / 'file_churn.md'}")
    return 0


def filesystem(path: Path) -> str:
    """The filesystem type of the mount holding `path`, from /proc/mounts."""
    best, kind = "", "unknown"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    resolved = str(path.resolve())
    for line in mounts:
        fields = line.split()
        mount = fields[1] if len(fields) > 2 else ""
        inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
        if mount and inside and len(mount) > len(best):
            best, kind = mount, fields[2]
    return kind


if __name__ == "__main__":
    raise SystemExit(main())
