#!/usr/bin/env bash
# Creates the peers' own virtualenvs for bench/peers (not snapcut's .venv,
# which they would disturb: apache-flink pins pyarrow 16 / pandas 2.2 /
# numpy 2.1 / grpcio 1.65 and pulls in apache-beam):
#
#   bench/peers/.venv-flink     apache-flink==2.3.0   (PyFlink; bundles Flink's jars)
#   bench/peers/.venv-bytewax   bytewax==0.21.1 + numpy (the shared generator)
#
# Usage: bash bench/peers/setup.sh [flink] [bytewax]     (default: both)
# Env:   PYTHON=python3.11 (the interpreter the venvs are made from; PyFlink
#        2.3 supports Python 3.9-3.12), PEERS_VENV_DIR=bench/peers
# Spark and snapcut run in snapcut's own .venv (scripts/setup.sh, pyspark).
# Java 17 must be installed for PyFlink (as for Spark). Downloads ~500 MB.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="${PEERS_VENV_DIR:-$here}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3

FLINK_VERSION=2.3.0
BYTEWAX_VERSION=0.21.1

which_ones=("$@")
[ ${#which_ones[@]} -eq 0 ] && which_ones=(flink bytewax)

make_venv() {  # name, packages...
  local venv="$dir/.venv-$1"; shift
  if [ ! -x "$venv/bin/python" ]; then
    echo "creating $venv with $("$python" -V)"
    "$python" -m venv "$venv"
  fi
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install "$@"
  echo "$venv ready: $("$venv/bin/python" -m pip list 2>/dev/null | grep -iE '^(apache-flink|bytewax|numpy|pyarrow) ' | tr -s ' ' | paste -sd ',' -)"
}

for w in "${which_ones[@]}"; do
  case "$w" in
    flink)
      java -version >/dev/null 2>&1 || { echo "PyFlink needs Java (17): not found" >&2; exit 1; }
      make_venv flink "apache-flink==$FLINK_VERSION" ;;
    bytewax)
      make_venv bytewax "bytewax==$BYTEWAX_VERSION" "numpy>=1.24" ;;
    *)
      echo "unknown peer '$w' (flink, bytewax)" >&2; exit 2 ;;
  esac
done
echo "next: python bench/peers/run.py --dry-run   (see bench/peers/README.md)"
