#!/usr/bin/env bash
# Creates ./.venv (or $SNAPCUT_VENV) and installs snapcut built in release mode
# with the extras named by the first argument (default "test,spark": what
# scripts/test.sh needs; scripts/demo.sh asks for "spark" only). pyspark 4.x:
# pip builds its wheel from the sdist once, a few minutes; Java 17 must be on
# PATH. Safe to run again: it reuses what is there. Prints a line per step;
# pip's and maturin's output goes to a log, shown only if a step fails.
# ziglang (zig from PyPI) is the linker for the manylinux_2_28 wheel (`maturin build --zig`).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-test,spark}
venv=${SNAPCUT_VENV:-.venv}
python=${PYTHON:-python3}
log=${SNAPCUT_SETUP_LOG:-$venv/setup.log}
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv"
  "$python" -m venv "$venv"
fi
: >"$log"
run() {
  local what=$1
  shift
  local started=$SECONDS
  printf 'setup: %s ... ' "$what"
  if "$@" >>"$log" 2>&1; then
    echo "done ($((SECONDS - started)) s)"
  else
    echo "FAILED; the last lines of $log:"
    tail -n 40 "$log"
    exit 1
  fi
}
# shellcheck disable=SC1091
. "$venv/bin/activate"
run "pip and the build tools (maturin, zig)" \
  python -m pip install -q --upgrade pip "maturin>=1.9,<2" "ziglang==0.17.1"
run "snapcut (Rust, release) with extras [$extras]" \
  maturin develop --release -q -E "$extras"
