"""What the benches that measure in child processes share: running a child
and reading the JSON line it ends with, and, inside a child, its memory
peaks as ``/proc/self/status`` gives them (Linux).

A child imports this module from the bench directory, which
:func:`child_env` puts on its ``PYTHONPATH`` after the build's own path."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import threading
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent


def child_env(pythonpath: str, **extra: str) -> dict[str, str]:
    """This process's environment with ``PYTHONPATH`` = `pythonpath` (a
    build's site; empty: the installed one) then the bench directory."""
    path = os.pathsep.join(p for p in (pythonpath, str(BENCH_DIR)) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)


def run_json_child(cmd: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Runs `cmd`; its last line of output, a JSON object. A failed child
    ends the bench with the tail of its stderr."""
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def status_bytes(field: str) -> int:
    """A ``/proc/self/status`` field given in kB, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise SystemExit(f"/proc/self/status has no {field}")


class MemoryPeaks:
    """Samples RssAnon every `every_s` seconds from creation to :meth:`stop`,
    which returns ``{"vm_hwm_mb", "rss_anon_peak_mb"}``: the kernel's
    high-water mark of resident pages (mapped files' touched pages
    included) and the largest anonymous (heap) resident size seen."""

    def __init__(self, every_s: float = 0.02) -> None:
        self._peak = 0
        self._stop = threading.Event()
        self._every = every_s
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self._stop.wait(self._every):
            self._peak = max(self._peak, status_bytes("RssAnon"))

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._peak = max(self._peak, status_bytes("RssAnon"))
        return {
            "vm_hwm_mb": round(status_bytes("VmHWM") / 2**20),
            "rss_anon_peak_mb": round(self._peak / 2**20),
        }


class ProcessPeaks:
    """Samples, every `every_s` seconds from creation to :meth:`stop`, the
    RssAnon and RssFile of every process whose command line has `pattern`
    (Spark's Python workers: ``pyspark.daemon``). :meth:`stop` returns the
    largest of each seen in one process, MB: ``{"anon_peak_mb",
    "file_peak_mb"}``, the heap and the touched pages of mapped files that
    VmHWM adds up (a sample can miss a peak shorter than `every_s`)."""

    def __init__(self, pattern: str, every_s: float = 0.05) -> None:
        self._pattern = pattern
        self._peaks = {"RssAnon": 0, "RssFile": 0}
        self._stop = threading.Event()
        self._every = every_s
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self._every):
            for status in Path("/proc").glob("[0-9]*/status"):
                try:
                    if self._pattern not in status.with_name("cmdline").read_text():
                        continue
                    for line in status.read_text().splitlines():
                        field, _, rest = line.partition(":")
                        if field in self._peaks:
                            self._peaks[field] = max(self._peaks[field], int(rest.split()[0]))
                except (OSError, ValueError, IndexError):
                    pass  # the process ended between the listing and the read

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        return {
            "anon_peak_mb": self._peaks["RssAnon"] // 1024,
            "file_peak_mb": self._peaks["RssFile"] // 1024,
        }


def spread(values: list[float], fmt: str = "g") -> str:
    """The median and range of `values`: "median [min, max]", each as `fmt`."""
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"


def write_results(out: Path, runs: list[dict[str, Any]], lines: list[str]) -> None:
    """A bench's record in `out`: its runs, a JSON line each (runs.jsonl), and
    the report it printed (output.txt)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "runs.jsonl").write_text("".join(json.dumps(x) + "\n" for x in runs))
    (out / "output.txt").write_text("\n".join(lines) + "\n")
