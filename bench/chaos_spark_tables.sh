#!/usr/bin/env bash
# Chaos figures of the sink's table outputs (issue 40) for
# bench/results/chaos_spark_tables/: `snapcut chaos --engine spark --output F`
# for F in delta and iceberg, in chunks of RUNS runs (seed = SEED + chunk) so
# partial results survive a deadline. Per format: CHUNKS chunks on local[2,4]
# (the driver tree SIGKILLed at random moments and at crash points, among them
# sink.after_table_commit; Python workers killed mid-task), then
# CLUSTER_CHUNKS chunks (default 1) on local-cluster[2,1,1024], which add
# executor JVM kills. Each chunk's summary JSON (stdout's last line, with
# table_commits, table_double_commits, table_missing_batches) is appended to
# bench/results/chaos_spark_tables/chaos-spark-<F>.jsonl (-cluster.jsonl for
# local-cluster); the per-attempt lines go to /tmp/snapcut-chaos-bench/spark-tables.log.
# One Spark child at a time: run it on a quiet machine.
# Usage: bash bench/chaos_spark_tables.sh CHUNKS RUNS SEED [extra snapcut chaos args]
#   (defaults 5 10 6000: 50 runs per format, plus 10 on local-cluster)
set -u
chunks=${1:-5}; runs=${2:-10}; seed=${3:-6000}; shift 3 2>/dev/null || shift $#
cluster_chunks=${CLUSTER_CHUNKS:-1}
export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$(command -v python)}
results=$(dirname "$0")/results/chaos_spark_tables
log=/tmp/snapcut-chaos-bench/spark-tables.log
mkdir -p /tmp/snapcut-chaos-bench "$results"

campaign() {  # FORMAT OUT SEED0 CHUNKS [args]
  local format=$1 out=$2 first=$3 n=$4; shift 4
  for c in $(seq 0 $((n - 1))); do
    python -m snapcut chaos --engine spark --output "$format" --runs "$runs" \
      --seed $((first + c)) --workdir "/tmp/snapcut-chaos-bench/spark-$format-$((first + c))" \
      "$@" | tee -a "$log" | tail -n 1 >> "$out"
  done
}

for format in delta iceberg; do
  campaign "$format" "$results/chaos-spark-$format.jsonl" "$seed" "$chunks" "$@"
  # Seeds after the local[2,4] chunks': no run replays another's plan.
  campaign "$format" "$results/chaos-spark-$format-cluster.jsonl" $((seed + 100)) \
    "$cluster_chunks" --master 'local-cluster[2,1,1024]' "$@"
done
