#!/usr/bin/env bash
# Sets everything up (see setup.sh) and runs every check and test: Rust format,
# lints, unit/property/stress tests, loom model checks, Python lints, types, pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. "${SNAPCUT_VENV:-.venv}/bin/activate"

step() { printf '\n== %s\n' "$*"; }

step "cargo fmt"
cargo fmt --all -- --check
step "cargo clippy"
cargo clippy --workspace --all-targets -q -- -D warnings
step "cargo test (release: includes the stress tests)"
cargo test -p snapcut-core --release
step "cargo test snapcut-py (binding helpers that run Python in-process)"
PYO3_PYTHON="$(command -v python)" cargo test -p snapcut-py --release --lib
step "loom model checks"
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-2} \
  cargo test -p snapcut-core --release --target-dir target/loom --test 'loom_*'
step "ruff"
ruff check python tests bench
ruff format --check python tests bench
step "mypy"
mypy python/
step "wheel installs into another venv"
rm -rf target/wheels-ci target/venv-wheel
maturin build --release -q -o target/wheels-ci
python -m venv target/venv-wheel
target/venv-wheel/bin/python -m pip install -q target/wheels-ci/snapcut-*.whl
target/venv-wheel/bin/snapcut --version
target/venv-wheel/bin/python -c "import snapcut, snapcut._core as c; tx, rx = c.channel(2); tx.send(1); assert rx.recv() == 1"

step "pytest (Spark tests: local[2] and local-cluster[2,1,1024], one session per module)"
export PYSPARK_PYTHON="$(command -v python)"
python -m pytest -q tests
