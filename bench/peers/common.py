"""What every peer job shares: the CLI, the input generator, the JSON line.

Standard library only (numpy optional): each job runs in its own virtualenv
(snapcut's, the PyFlink one, the bytewax one), and every one of them imports
this file from the script's directory.

The dwell events are snapcut's generator (`rust/core/src/runtime/ops/generator.rs`):
record i of seed s is ``h = splitmix64(s ^ (i * 0xd1b54a32d192ed03))``,
``user = (h * users) >> 64``, ``dwell_ms = (h mod 2**32) mod 10000``.
`dwell_batch` reproduces it bit for bit with numpy, so snapcut and bytewax
read the same records; Flink's datagen and Spark's rate source draw from the
same distribution (uniform users, uniform dwell_ms in 0..9999), not the same
bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

JOBS = ("dwell", "three-shuffle")
CHECKPOINTING = ("off", "1s", "100ms")
INTERVAL_S = {"off": None, "1s": 1.0, "100ms": 0.1}
SEED = 7

_M64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def dwell_record(seed: int, i: int, users: int) -> tuple[int, int]:
    """Record `i` of the stream, exactly as snapcut's Rust generator makes it."""
    h = splitmix64(seed ^ ((i * 0xD1B54A32D192ED03) & _M64))
    return (h * users) >> 64, (h & 0xFFFFFFFF) % 10_000


def dwell_batch(seed: int, start: int, stop: int, users: int) -> tuple[list[int], list[int]]:
    """Records start..stop as two Python lists (numpy-vectorised, same values
    as `dwell_record`)."""
    import numpy as np

    with np.errstate(over="ignore"):
        i = np.arange(start, stop, dtype=np.uint64)
        x = np.uint64(seed) ^ (i * np.uint64(0xD1B54A32D192ED03))
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        h = x ^ (x >> np.uint64(31))
        # (h * users) >> 64 without 128-bit integers (users < 2**32).
        u = np.uint64(users)
        hi = (h >> np.uint64(32)) * u
        lo = ((h & np.uint64(0xFFFFFFFF)) * u) >> np.uint64(32)
        user = (hi + lo) >> np.uint64(32)
        dwell = (h & np.uint64(0xFFFFFFFF)) % np.uint64(10_000)
    return user.astype(np.int64).tolist(), dwell.astype(np.int64).tolist()


def parser(system: str, modes: tuple[str, ...], default_mode: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"bench/peers/{system}_job.py",
        description=f"Runs ONE configuration of the peers benchmark on {system} and "
        "prints one JSON line.",
    )
    p.add_argument("--job", choices=JOBS, default="dwell")
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--checkpointing", choices=CHECKPOINTING, default="off")
    p.add_argument("--mode", choices=modes, default=default_mode)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="scratch directory for checkpoints (default: a temporary one, removed after)",
    )
    return p


class DirWatcher:
    """Polls a checkpoint directory while a job runs: the largest total size
    seen and the highest checkpoint number seen (`pattern` group 1), for
    systems that delete their checkpoints when the job finishes (Flink)."""

    def __init__(self, root: Path, pattern: str | None = None, period_s: float = 0.05) -> None:
        self.root = root
        self.pattern = re.compile(pattern) if pattern else None
        self.period_s = period_s
        self.max_bytes = 0
        self.max_id = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> DirWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.poll()

    def poll(self) -> None:
        total = 0
        for dirpath, dirnames, filenames in os.walk(self.root):
            if self.pattern is not None:
                for d in dirnames:
                    m = self.pattern.fullmatch(d)
                    if m:
                        self.max_id = max(self.max_id, int(m.group(1)))
            for f in filenames:
                with contextlib.suppress(OSError):
                    total += os.path.getsize(os.path.join(dirpath, f))
        self.max_bytes = max(self.max_bytes, total)


def dir_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(root):
        for f in filenames:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(dirpath, f))
    return total


def emit(args: argparse.Namespace, system: str, **fields: Any) -> None:
    """Prints the configuration's one JSON line on stdout."""
    seconds = float(fields["seconds"])
    line = {
        "system": system,
        "job": args.job,
        "keys": args.keys,
        "records": fields.pop("records", args.records),
        "checkpointing": args.checkpointing,
        "mode": args.mode,
        "parallelism": args.parallelism,
        "records_per_s": fields.pop("records_per_s", None)
        or (args.records / seconds if seconds > 0 else None),
        "python": platform.python_version(),
        "unix_time": time.time(),
        **fields,
    }
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def fail(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")
    raise SystemExit(2)
