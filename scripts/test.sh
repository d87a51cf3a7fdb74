#!/usr/bin/env bash
# Sets everything up (see setup.sh) and runs every check and test: Rust format,
# lints, unit/property/stress tests, loom model checks, Python lints, types, pytest.
#   bash scripts/test.sh          everything (what CI runs), against the manylinux_2_28
#                                 abi3 wheel installed into the venv (what users install):
#                                 the extension is built once, as that wheel
#   bash scripts/test.sh --fast   the inner loop: Python lints and types, the Rust core's
#                                 unit tests, pytest without Spark (-m "not spark"),
#                                 against this checkout's python/ (`maturin develop`)
# The full run leaves the wheel installed in the venv: edits to python/ show only after
# `bash scripts/setup.sh` (or --fast) puts the editable install back.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
case "${1:-}" in
  "") ;;
  --fast) fast=1 ;;
  *) echo "usage: bash scripts/test.sh [--fast]" >&2; exit 2 ;;
esac
# Each step's start, in seconds since the script began (where CI's time goes).
step() { printf '\n== [%4d s] %s\n' "$SECONDS" "$*"; }

wheel_dir=target/wheels-ci
if [ "$fast" = 0 ]; then
  # The Rust checks' builds (clippy, the test binaries, loom: none needs the
  # venv) start now, in the background at nice 19: they take the CPU the
  # wheel's build, pip and then the tests leave idle. Their tests run after
  # pytest, built. Their own target directory: cargo locks a build directory
  # (host artifacts included), so in the wheel's they would wait on each other.
  mkdir -p target
  rust_target="$PWD/target/ci-rust"
  rust_log=target/ci-rust-build.log
  (
    set -e
    export CARGO_TARGET_DIR="$rust_target"
    started=$SECONDS
    nice -n 19 cargo clippy --workspace --all-targets -q -- -D warnings
    nice -n 19 cargo test -p snapcut-channel -p snapcut-core --profile ci-test --no-run
    nice -n 19 cargo test -p snapcut-channel --profile ci-test --features loom --test loom --no-run
    echo "rust builds: done after $((SECONDS - started)) s"
  ) >"$rust_log" 2>&1 &
  rust_pid=$!
fi
if [ "$fast" = 1 ]; then
  step "setup: the editable install (maturin develop --release)"
  bash scripts/setup.sh
else
  step "setup: the wheel, built once (maturin build --release --zig), installed with [test,spark,delta,iceberg]"
  bash scripts/setup.sh --wheel "$wheel_dir"
fi
# shellcheck disable=SC1091
. "${SNAPCUT_VENV:-.venv}/bin/activate"

if [ "$fast" = 1 ]; then
  step "ruff"
  ruff check python tests bench scripts
  ruff format --check python tests bench scripts
  step "mypy"
  mypy python/
  step "cargo test snapcut-core --lib (unit tests; the integration suites run in the full run)"
  cargo test -p snapcut-channel -p snapcut-core --release --lib -q
  step "pytest without Spark"
  export PYSPARK_PYTHON="$(command -v python)"
  python -m pytest -q -m "not spark" tests
  exit 0
fi

step "the wheel (setup.sh built it: the run's one release build): tag, glibc, the venv imports it; alone in another venv"
wheels=("$wheel_dir"/snapcut-*.whl)
[ "${#wheels[@]}" -eq 1 ] || { echo "expected one wheel, got: ${wheels[*]}"; exit 1; }
wheel=${wheels[0]}
python - "$wheel" <<'PY'
"""The wheel's tag is cp311-abi3-manylinux_2_28_x86_64 (stable ABI, CPython >= 3.11) and
its extension asks for no glibc symbol version newer than 2.28 (what auditwheel checks).
The venv's snapcut is that wheel installed, not this checkout's python/."""
import re
import sys
import sysconfig
import zipfile
from pathlib import Path

want = "cp311-abi3-manylinux_2_28_x86_64"
path = sys.argv[1]
assert path.endswith(f"-{want}.whl"), f"{path}: not a {want} wheel"
with zipfile.ZipFile(path) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))
    tags = [v.strip() for k, _, v in
            (line.partition(":") for line in z.read(meta).decode().splitlines()) if k == "Tag"]
    assert tags == [want], f"{meta}: Tag {tags}, want [{want!r}]"
    libs = [n for n in z.namelist() if n.endswith(".so")]
    assert libs == ["snapcut/_core.abi3.so"], f"extension modules: {libs}"
    needed = {tuple(map(int, m)) for m in re.findall(rb"GLIBC_(\d+)\.(\d+)", z.read(libs[0]))}
    core = z.read(libs[0])
assert needed and max(needed) <= (2, 28), f"needs glibc {max(needed)}"
print(f"{path}: Tag {tags[0]}, glibc symbol versions up to {'.'.join(map(str, max(needed)))}")

import snapcut._core as c  # noqa: E402

site = Path(sysconfig.get_paths()["purelib"]).resolve()
installed = Path(c.__file__).resolve()
assert installed.is_relative_to(site), f"snapcut._core imports from {installed}, not {site}"
assert installed.read_bytes() == core, f"{installed} is not the wheel's {libs[0]}"
tx, rx = c.channel(2)
tx.send(1)
assert rx.recv() == 1
print(f"snapcut imports from {installed.parent}")
PY
# The wheel alone, with only its declared dependencies (no extras): the CLI starts.
rm -rf target/venv-wheel
python -m venv target/venv-wheel
target/venv-wheel/bin/python -m pip install -q "$wheel"
target/venv-wheel/bin/snapcut --version

step "cargo fmt, ruff, mypy"
cargo fmt --all -- --check
ruff check python tests bench scripts
ruff format --check python tests bench scripts
mypy python/

step "a class archive for the test JVMs (scripts/spark_class_archive.py): one Spark session's classes"
# Every JVM the tests and the bench smoke start (drivers, Connect servers, the
# harnesses' drivers; not local-cluster's executors, whose class path differs)
# maps the classes a Spark session loads from this archive instead of loading
# and verifying them from the jars: C1 only and the serial collector as in
# tests/conftest.py (both read tests/jvm-options), and the JVM's CDS messages
# off (a JVM that cannot use the archive falls back to the JDK's own,
# silently). Alone (2026-12-04): tests/spark/test_spark_rescale.py took 42-44
# CPU seconds without it, 34-35 with it. CI's pytest streams are CPU-bound (vmstat: no idle time).
jvm_options="$(cat tests/jvm-options) -Xlog:cds=off -Xlog:cds+dynamic=off"
jvm_archive="$PWD/target/spark-classes.jsa"
PYSPARK_PYTHON="$(command -v python)" JDK_JAVA_OPTIONS="$jvm_options" \
  python scripts/spark_class_archive.py "$jvm_archive" 2>target/spark-class-archive.log \
  || { tail -n 40 target/spark-class-archive.log; exit 1; }
export JDK_JAVA_OPTIONS="$jvm_options -XX:SharedArchiveFile=$jvm_archive"

# What runs next runs at once, by priority (nice): one priority stream (nice
# -5 where the user may raise priority, as root in CI; else 0) runs, one
# after another, the tests marked connect_server (they start a Connect
# server on port 15002), the other tests marked connect_port, the
# full_priority ones and the bench smoke; beside it the other tests on
# three xdist workers (nice 10) and the Rust builds (nice 19).
# Spark waits a fixed 10 s for some Python processes it starts to connect
# back (PythonWorkerFactory's simple workers: Connect's foreachBatch worker,
# the streaming data source's reader, Spark's own transformWithState's
# driver worker): those tests are marked connect_port (pyproject.toml). Two
# such streams side by side at nice 0 ran out of it on a slow guest (fresh25:
# 9 of the 41 connect_server tests; fresh26: several, some three times in a
# row despite the reruns of pyproject.toml's addopts), each stream's JVMs
# taking the CPU the other's new worker needed. One stream at a time, ahead
# of everything else (weight 3121 at nice -5 against 110 per thread at nice
# 10, and every child in this session: the chaos and demo harnesses start
# theirs in a new process group, not a new session, so they inherit it),
# gets a new worker its core when it asks; the others take what it leaves.
# The Rust builds (clippy, the test binaries, loom) take what both leave;
# their tests run after pytest, built.
# Measured alone on a quiet machine (2026-11-28, fast mode): connect_server
# 41 tests 458 s, the other connect_port 46 tests 715 s (the parity module
# 537 s), the rest 780 tests 729 s on 2 workers; in CPU seconds (the
# process trees) 235, 595 and 686: no stream keeps a core busy alone.
step "in parallel: pytest, 3 workers (nice 10) | the priority stream (nice -5): connect_server, the other connect_port, full_priority, the bench smoke | the Rust builds go on (nice 19)"
export PYSPARK_PYTHON="$(command -v python)"
# pytest and the bench import the venv's snapcut: the wheel (checked above), not python/.
# tests/test_spark_archives.py ships this wheel to executors in a packed venv (spark.archives).
export SNAPCUT_WHEEL="$PWD/$wheel"
pytest_log=target/ci-pytest.log
# Three xdist workers (tests/conftest.py keeps each Spark module on one worker and
# the local-cluster modules one at a time). With two (fresh12, 2026-11-28, the whole
# run 1,915 s): 1,415 s at nice 10, beside the connect_server stream (698 s, then
# the bench 35 s) and the other connect_port stream (555 s), then ~680 s alone,
# where two workers keep about one core busy (most of a small Spark query's
# time is latency): a third worker takes more of the CPU the others leave.
# With three (fresh13, the whole run 1,736 s): 1,247 s, beside 633 + 36 s and 498 s.
(
  started=$SECONDS
  rc=0
  nice -n 10 python -m pytest -q -n 3 --dist loadgroup -m "not connect_port and not full_priority" \
    --durations=40 \
    --junitxml=target/pytest-ci.xml tests || rc=$?
  echo "pytest (3 workers): exit $rc after $((SECONDS - started)) s"
  exit "$rc"
) >"$pytest_log" 2>&1 &
pytest_pid=$!
# The priority stream, in this shell. `nice -n -5` needs the right to raise
# priority; without it nice says so and runs the command at nice 0.
priority() { nice -n -5 "$@"; }
rc=0
started=$SECONDS
priority python -m pytest -q -m connect_server --durations=5 \
  --junitxml=target/pytest-ci-connect.xml tests || rc=$?
echo "pytest (connect_server tests): exit $rc after $((SECONDS - started)) s"
started=$SECONDS
priority python -m pytest -q -m "connect_port and not connect_server" --durations=5 \
  --junitxml=target/pytest-ci-connect-back.xml tests || rc=$?
echo "pytest (connect_port tests without a Connect server): exit $rc after $((SECONDS - started)) s"
# The Spark kill-and-restart harnesses (marked full_priority: the chaos ones and
# the two driver-SIGKILL tests): each attempt starts a driver and a JVM; at nice
# 10 beside two full-priority streams the aggregate chaos one took 520 s (47 s
# alone) and set the pool's length (fresh18: 1,354 s).
started=$SECONDS
priority python -m pytest -q -m "full_priority and not connect_port" --durations=5 \
  --junitxml=target/pytest-ci-full-priority.xml tests || rc=$?
echo "pytest (full_priority tests): exit $rc after $((SECONDS - started)) s"
step "pytest bench (smoke: every benchmark runs once at a small size, as a test; no timings)"
# ~55 s alone on the 2-vCPU machine, ~50 s of it Spark (session start, the first
# query, 8 more one-batch queries). If that grows, run the others only (~6 s):
# add -m "not spark" (bench/README.md). No timings here, so the test JVMs'
# options (JDK_JAVA_OPTIONS above) apply: C1 only, serial GC, the class archive.
priority python -m pytest bench --benchmark-disable -q -x || rc=$?
wait "$pytest_pid" || rc=$?
step "pytest (3 workers): its output"
cat "$pytest_log"
rust_rc=0
wait "$rust_pid" || rust_rc=$?
step "Rust builds (clippy, test binaries, loom): their output"
cat "$rust_log"
[ "$rust_rc" = 0 ] || { echo "a Rust build or clippy failed"; exit "$rust_rc"; }
step "cargo test (optimized, the ci-test profile of Cargo.toml: includes the stress tests; built above)"
CARGO_TARGET_DIR="$rust_target" cargo test -p snapcut-channel -p snapcut-core --profile ci-test
step "loom model checks (built above)"
# The channel is its own crate (rust/channel): this builds the ring and loom only.
LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-2} CARGO_TARGET_DIR="$rust_target" \
  cargo test -p snapcut-channel --profile ci-test --features loom --test loom
step "where pytest's time went"
python - target/pytest-ci.xml target/pytest-ci-connect.xml target/pytest-ci-connect-back.xml \
  target/pytest-ci-full-priority.xml <<'PY' || true
"""Where pytest's time went, by module (each test's setup, call and teardown): the 25 slowest."""
import collections
import sys
import xml.etree.ElementTree as ET

took: collections.Counter[str] = collections.Counter()
tests: collections.Counter[str] = collections.Counter()
cases = [c for path in sys.argv[1:] for c in ET.parse(path).iter("testcase")]
for case in cases:
    parts = case.get("classname", "?").split(".")
    module = ".".join(parts[:-1] if parts[-1][:1].isupper() else parts)
    took[module] += float(case.get("time", 0))
    tests[module] += 1
print(f"\nslowest modules (of {len(took)}, {sum(took.values()):.0f} s in all):")
for module, s in took.most_common(25):
    print(f"{s:8.1f} s  {tests[module]:4d} tests  {module}")
PY
[ "$rc" = 0 ] || exit "$rc"

step "done"
