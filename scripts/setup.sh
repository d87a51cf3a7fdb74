#!/usr/bin/env bash
# Creates ./.venv (or $SNAPCUT_VENV), installs snapcut built in release mode
# plus the test and spark extras (pyspark 4.x: pip builds its wheel from the sdist
# once, a few minutes; Java 17 must be on PATH). Safe to run again: it reuses what is there.
# ziglang (zig from PyPI) is the linker for the manylinux_2_28 wheel (`maturin build --zig`).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${SNAPCUT_VENV:-.venv}
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q "maturin>=1.9,<2" "ziglang==0.17.1"
maturin develop --release -q -E test,spark
