"""Two builds of snapcut side by side on the runtime's hot path: the
dwell-time job (generated events, parallelism 2, keyed count + sum,
collect) without checkpoints and with aligned and unaligned checkpoints
every 100 ms into memory, records/s per run: the records over the job's
own wall time (`RunReport.duration_s`, tasks started to tasks ended; what
`flow.run` does around the job is not counted). Each round runs every case
under build A then build B (B then A every other round), in child
processes whose ``PYTHONPATH`` selects the build (empty: the installed
one), so load drifts hit both alike.

    python bench/runtime_ab.py --a /tmp/old/site --b "" --rounds 5 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = """
import json, sys
from snapcut import Checkpointing, Dataflow
records, protocol = int(sys.argv[1]), sys.argv[2]
flow = Dataflow(parallelism=2)
ev = flow.generate_dwell_events(users=1000, count=records, seed=1)
ev.key_by("user").aggregate(n="count", total=("sum", "dwell_ms")).collect("out")
cp = Checkpointing(protocol=protocol, interval=None if protocol == "none" else 0.1)
report = flow.run(cp)
assert sum(report.results["out"]["n"].to_pylist()) == records
print(json.dumps({"records_per_s": records / report.duration_s}))
"""


def run(pythonpath: str, records: int, protocol: str) -> float:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(records), protocol],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(json.loads(out.strip().splitlines()[-1])["records_per_s"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--a", required=True, help="PYTHONPATH of build A ('' = installed)")
    p.add_argument("--b", required=True, help="PYTHONPATH of build B")
    p.add_argument("--records", type=int, default=100_000_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--protocols", nargs="+", default=["none", "aligned", "unaligned"])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    res: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for proto in args.protocols:
            for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
                v = run(getattr(args, side), args.records, proto)
                res.setdefault(f"{proto}|{side}", []).append(v)
                print(f"round {r} {proto:10s} {side} {v / 1e6:.2f} M records/s", flush=True)
    rows = []
    for proto in args.protocols:
        a, b = res[f"{proto}|a"], res[f"{proto}|b"]
        rows.append(
            {
                "protocol": proto,
                "a_median": statistics.median(a),
                "b_median": statistics.median(b),
                "b_over_a": statistics.median(b) / statistics.median(a),
                "a": a,
                "b": b,
            }
        )
        print(
            f"{proto:10s} A {statistics.median(a) / 1e6:.2f} [{min(a) / 1e6:.2f}, "
            f"{max(a) / 1e6:.2f}]  B {statistics.median(b) / 1e6:.2f} [{min(b) / 1e6:.2f}, "
            f"{max(b) / 1e6:.2f}] M records/s  B/A {rows[-1]['b_over_a']:.3f}"
        )
    if args.out:
        meta = {"args": vars(args), "load": os.getloadavg(), "cpus": os.cpu_count()}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
