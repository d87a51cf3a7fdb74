#!/usr/bin/env bash
# Creates ./.venv (or $SNAPCUT_VENV) and installs snapcut built in release mode
# with the extras named by the last argument (default "test,spark,delta,iceberg": what
# scripts/test.sh needs; scripts/demo.sh asks for "spark" only).
#   bash scripts/setup.sh [EXTRAS]              editable: `maturin develop --release`
#                                               (python/ is the package; rebuild after a
#                                               Rust change with `maturin develop --release`)
#   bash scripts/setup.sh --wheel DIR [EXTRAS]  what users install: builds the
#                                               manylinux_2_28 abi3 wheel into DIR (its old
#                                               snapcut wheels removed first) and installs it,
#                                               not editable (CI: scripts/test.sh; the run's
#                                               one release build)
# pyspark 4.x: pip builds its wheel from the sdist once, a few minutes; Java 17
# must be on PATH. Safe to run again: it reuses what is there, and either way
# replaces the snapcut installed before. Prints a line per step; pip's and
# maturin's output goes to a log, shown only if a step fails.
# ziglang (zig from PyPI) is the linker for the manylinux_2_28 wheel (`maturin build --zig`).
set -euo pipefail
cd "$(dirname "$0")/.."
wheel_dir=
if [ "${1:-}" = --wheel ]; then
  [ -n "${2:-}" ] || { echo "usage: bash scripts/setup.sh [--wheel DIR] [EXTRAS]" >&2; exit 2; }
  wheel_dir=$2
  shift 2
fi
extras=${1:-test,spark,delta,iceberg}
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
if [ -z "$wheel_dir" ]; then
  run "snapcut (Rust, release) with extras [$extras]" \
    maturin develop --release -q -E "$extras"
  exit 0
fi

build_wheel() {
  mkdir -p "$wheel_dir"
  rm -f "$wheel_dir"/snapcut-*.whl
  maturin build --release --zig --compatibility manylinux_2_28 -q -o "$wheel_dir"
}
# pip keeps an installed snapcut of the same version (an editable one from
# `maturin develop` included): remove it first, so the wheel is what imports.
install_wheel() {
  local wheels=("$wheel_dir"/snapcut-*.whl)
  [ "${#wheels[@]}" -eq 1 ] && [ -f "${wheels[0]}" ] \
    || { echo "expected one wheel in $wheel_dir, got: ${wheels[*]}"; return 1; }
  python -m pip uninstall -q -y snapcut
  python -m pip install -q "${wheels[0]}[$extras]"
}
# The wheel's dependencies (pyproject.toml's, with the extras) install while
# maturin builds: pip mostly waits on files and the network, the build on CPU.
deps_log=$venv/setup-deps.log
python - "$extras" >"$venv/setup-deps.txt" <<'PY'
import sys
import tomllib

with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
wanted = [e for e in sys.argv[1].split(",") if e]
unknown = sorted(set(wanted) - set(project["optional-dependencies"]))
if unknown:
    sys.exit(f"setup: no such extra {unknown} in pyproject.toml")
print("\n".join([*project["dependencies"],
                 *(r for e in wanted for r in project["optional-dependencies"][e])]))
PY
python -m pip install -q -r "$venv/setup-deps.txt" >"$deps_log" 2>&1 &
deps_pid=$!
trap 'kill "$deps_pid" 2>/dev/null || true' EXIT
wait_for_deps() {
  wait "$deps_pid" || { cat "$deps_log"; return 1; }
}
run "snapcut wheel (Rust, release, manylinux_2_28 abi3, zig) into $wheel_dir; its dependencies alongside" build_wheel
run "the dependencies with extras [$extras] (pip, started beside the build)" wait_for_deps
run "snapcut from that wheel with extras [$extras]" install_wheel
