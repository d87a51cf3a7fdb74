#!/usr/bin/env bash
# Sets everything up (see setup.sh) and runs the main job: `snapcut demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh spark
# shellcheck disable=SC1091
. "${SNAPCUT_VENV:-.venv}/bin/activate"
exec snapcut demo "$@"
