#!/usr/bin/env bash
# Sets everything up (see setup.sh) and runs every check and test: Rust format,
# lints, unit/property/stress tests, loom model checks, Python lints, types, pytest.
#   bash scripts/test.sh          everything (what CI runs)
#   bash scripts/test.sh --fast   the inner loop: Python lints and types, the Rust core's
#                                 unit tests, pytest without Spark (-m "not spark")
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
case "${1:-}" in
  "") ;;
  --fast) fast=1 ;;
  *) echo "usage: bash scripts/test.sh [--fast]" >&2; exit 2 ;;
esac
bash scripts/setup.sh
# shellcheck disable=SC1091
. "${SNAPCUT_VENV:-.venv}/bin/activate"

# Each step's start, in seconds since the script began (where CI's time goes).
step() { printf '\n== [%4d s] %s\n' "$SECONDS" "$*"; }

if [ "$fast" = 1 ]; then
  step "ruff"
  ruff check python tests bench
  ruff format --check python tests bench
  step "mypy"
  mypy python/
  step "cargo test snapcut-core --lib (unit tests; the integration suites run in the full run)"
  cargo test -p snapcut-core --release --lib -q
  step "pytest without Spark"
  export PYSPARK_PYTHON="$(command -v python)"
  python -m pytest -q -m "not spark" tests
  exit 0
fi

step "cargo fmt"
cargo fmt --all -- --check
step "cargo clippy"
cargo clippy --workspace --all-targets -q -- -D warnings
step "cargo test (release: includes the stress tests)"
cargo test -p snapcut-core --release
step "loom model checks"
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-2} \
  cargo test -p snapcut-core --release --target-dir target/loom --test 'loom_*'
step "ruff"
ruff check python tests bench
ruff format --check python tests bench
step "mypy"
mypy python/
step "manylinux_2_28 abi3 wheel (zig as the linker), installs into another venv"
rm -rf target/wheels-ci target/venv-wheel
started=$SECONDS
maturin build --release --zig --compatibility manylinux_2_28 -q -o target/wheels-ci
echo "wheel built in $((SECONDS - started)) s"
wheels=(target/wheels-ci/snapcut-*.whl)
[ "${#wheels[@]}" -eq 1 ] || { echo "expected one wheel, got: ${wheels[*]}"; exit 1; }
wheel=${wheels[0]}
python - "$wheel" <<'PY'
"""The wheel's tag is cp311-abi3-manylinux_2_28_x86_64 (stable ABI, CPython >= 3.11) and
its extension asks for no glibc symbol version newer than 2.28 (what auditwheel checks)."""
import re
import sys
import zipfile

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
assert needed and max(needed) <= (2, 28), f"needs glibc {max(needed)}"
print(f"{path}: Tag {tags[0]}, glibc symbol versions up to {'.'.join(map(str, max(needed)))}")
PY
python -m venv target/venv-wheel
target/venv-wheel/bin/python -m pip install -q "$wheel"
target/venv-wheel/bin/snapcut --version
target/venv-wheel/bin/python -c "import snapcut, snapcut._core as c; tx, rx = c.channel(2); tx.send(1); assert rx.recv() == 1"

step "pytest (Spark tests: local[2] and local-cluster[2,1,1024], one session per module)"
export PYSPARK_PYTHON="$(command -v python)"
# tests/test_spark_archives.py ships this wheel to executors in a packed venv (spark.archives).
export SNAPCUT_WHEEL="$PWD/$wheel"
python -m pytest -q --durations=15 tests

step "pytest bench (smoke: every benchmark runs once at a small size, as a test; no timings)"
# 54-58 s measured on the busy 2-vCPU machine (load 5), ~50 s of it Spark (session
# start ~17 s, the first query ~16 s, 8 more one-batch queries). If that grows,
# run the others only (~6 s): add -m "not spark" (bench/README.md).
python -m pytest bench --benchmark-disable -q -x
step "done"
