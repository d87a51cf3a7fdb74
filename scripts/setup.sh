#!/usr/bin/env bash
# Creates ./.venv (or $SNAPCUT_VENV), installs snapcut built in release mode
# plus the test extra (the Spark extra comes with the Spark integration). Safe to run again: it reuses what is there.
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
python -m pip install -q "maturin>=1.9,<2"
maturin develop --release -q -E test
