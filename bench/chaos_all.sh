#!/usr/bin/env bash
# Chaos figures for bench/results/chaos/README.md: `snapcut chaos` per protocol, in
# chunks of 50 runs (seed = SEED + chunk) so partial results survive a
# deadline; each chunk's summary JSON (stdout's last line) is appended to
# bench/results/chaos/chaos-<protocol>.jsonl. Protocols run in parallel.
# Usage: bash bench/chaos_all.sh CHUNKS RECORDS SEED
set -u
chunks=${1:-4}; records=${2:-20000}; seed=${3:-2026}
for p in aligned unaligned chandy-lamport sync; do
  (
    out=$(dirname "$0")/results/chaos/chaos-$p.jsonl
    : > "$out"
    for c in $(seq 0 $((chunks - 1))); do
      python -m snapcut chaos --protocol "$p" --runs 50 --records "$records" \
        --seed $((seed + c)) --job-seconds 0.3 --workdir "/tmp/snapcut-chaos-bench/$p" \
        --quiet | tail -n 1 >> "$out"
    done
  ) &
done
wait
