#!/usr/bin/env bash
# Chaos figures for bench/results/chaos/README.md: `snapcut chaos` per protocol, in
# chunks of 50 runs (seed = SEED + chunk) so partial results survive a
# deadline; each chunk's summary JSON (stdout's last line) is appended to
# bench/results/chaos/chaos-<protocol>.jsonl. Protocols run in parallel.
# Usage: bash bench/chaos_all.sh CHUNKS RECORDS SEED
# Env: CHAOS_OUT (folder under bench/results, default chaos), CHAOS_ARGS (more
# `snapcut chaos` options), CHAOS_JOB_SECONDS (default 0.3), CHAOS_PROTOCOLS
# (default: all four). Kills inside the store's compaction
# (bench/results/chaos_compaction/README.md; sync captures full state, so it
# has no diffs to merge):
#   CHAOS_OUT=chaos_compaction CHAOS_PROTOCOLS="aligned unaligned chandy-lamport" \
#     CHAOS_ARGS="--users 20000 --full-every 2 \
#     --failpoints compaction.sorted_copy,compaction.before_rename,compaction.adopted" \
#     bash bench/chaos_all.sh 2 40000 3026
# Both at once, a budget and a compacting store (bench/results/chaos_spill_compaction/README.md):
#   CHAOS_OUT=chaos_spill_compaction CHAOS_PROTOCOLS="aligned unaligned chandy-lamport" \
#     CHAOS_ARGS="--users 2000000 --state-memory 1MB --full-every 2 --failpoints \
#     spill.after_run,spill.merged,compaction.before_rename,compaction.adopted" \
#     bash bench/chaos_all.sh 2 400000 7628
# Kills while keyed state spills past a 1 MiB budget (bench/results/chaos_spill/README.md):
#   CHAOS_OUT=chaos_spill CHAOS_PROTOCOLS="aligned unaligned chandy-lamport" \
#     CHAOS_ARGS="--users 2000000 --state-memory 1MB \
#     --failpoints spill.after_run,spill.merged" bash bench/chaos_all.sh 2 400000 4026
set -u
chunks=${1:-4}; records=${2:-20000}; seed=${3:-2026}
folder=${CHAOS_OUT:-chaos}; job_seconds=${CHAOS_JOB_SECONDS:-0.3}
mkdir -p "$(dirname "$0")/results/$folder"
# shellcheck disable=SC2086 # CHAOS_PROTOCOLS is a list
for p in ${CHAOS_PROTOCOLS:-aligned unaligned chandy-lamport sync}; do
  (
    out=$(dirname "$0")/results/$folder/chaos-$p.jsonl
    : > "$out"
    for c in $(seq 0 $((chunks - 1))); do
      # shellcheck disable=SC2086 # CHAOS_ARGS is a list of options
      python -m snapcut chaos --protocol "$p" --runs 50 --records "$records" \
        --seed $((seed + c)) --job-seconds "$job_seconds" \
        --workdir "/tmp/snapcut-chaos-bench/$folder/$p" ${CHAOS_ARGS:-} \
        --quiet | tail -n 1 >> "$out"
    done
  ) &
done
wait
