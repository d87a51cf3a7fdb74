#!/bin/bash
# interleaved old/new: snapcut snapshots list / verify --all / prune --keep 3 --dry-run on a 1,000-checkpoint root
. /work/main/.venv/bin/activate
ROOT=/tmp/sc-bench-root
run() { # $1 label, $2 pythonpath, rest: args
  local label=$1 pp=$2; shift 2
  local t0=$(date +%s.%N)
  PYTHONPATH=$pp python -c "import sys; from snapcut.cli import main; sys.exit(main(sys.argv[1:]))" snapshots "$@" >/dev/null 2>&1
  local rc=$?
  local t1=$(date +%s.%N)
  echo "$label $1 $(echo "$t1 - $t0" | bc) rc=$rc"
}
for round in 1 2 3 4 5 6 7; do
  for cmd in "list $ROOT" "verify $ROOT --all" "prune $ROOT --keep 3 --dry-run"; do
    run old /tmp/sc-old-site $cmd
    run new "" $cmd
  done
done
