#!/usr/bin/env bash
# Runs `snapcut chaos` for every recovering protocol in sequence; prints each
# protocol's summary JSON (the last stdout line) to bench/results/chaos-runs.jsonl.
# Usage: bash bench/chaos_all.sh RUNS RECORDS SEED
set -u
runs=${1:-200}; records=${2:-20000}; seed=${3:-2026}
out=bench/results/chaos-runs.jsonl
: > "$out"
for p in aligned unaligned chandy-lamport sync; do
  python -m snapcut chaos --protocol "$p" --runs "$runs" --records "$records" \
    --seed "$seed" --workdir "/tmp/snapcut-chaos-bench/$p" --quiet | tail -n 1 >> "$out"
done
