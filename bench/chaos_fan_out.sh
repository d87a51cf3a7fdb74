#!/usr/bin/env bash
# Chaos figures for bench/results/regional_failover/README.md: the fan-out job
# under failover="upstream", per protocol, one sink subtask failing per run
# (task errors; seed 1), then the same with whole-process SIGKILLs added, in
# chunks of 100 runs (seeds 2, 3, ...). Each summary JSON goes to
# bench/results/regional_failover/chaos-task-<protocol>.json and
# chaos-kill-<protocol>-seed<S>.json.
# Usage: bash bench/chaos_fan_out.sh [TASK_RUNS] [KILL_CHUNKS]
set -euo pipefail
task_runs=${1:-200}; kill_chunks=${2:-2}
out=$(dirname "$0")/results/regional_failover
mkdir -p "$out"
for p in aligned unaligned chandy-lamport; do
  snapcut chaos --topology fan-out --failover upstream --protocol "$p" \
    --runs "$task_runs" --seed 1 --quiet | tail -n 1 > "$out/chaos-task-$p.json"
done
for s in $(seq 2 $((kill_chunks + 1))); do
  for p in aligned unaligned chandy-lamport; do
    snapcut chaos --topology fan-out --failover upstream --protocol "$p" \
      --runs 100 --seed "$s" --process-kills --quiet | tail -n 1 > "$out/chaos-kill-$p-seed$s.json"
  done
done
