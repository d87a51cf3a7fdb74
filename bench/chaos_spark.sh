#!/usr/bin/env bash
# Chaos figures on Spark for bench/results/chaos_spark/README.md: `snapcut chaos
# --engine spark` in chunks of RUNS runs (seed = SEED + chunk) so partial
# results survive a deadline; each chunk's summary JSON (stdout's last line)
# is appended to bench/results/chaos_spark/chaos-spark.jsonl (the per-attempt lines to
# /tmp/snapcut-chaos-bench/spark.log). One Spark child at a time. With
# --remote (Spark Connect) among the extra args, to chaos-spark-connect.jsonl;
# with --step tws (the transformWithState job), to chaos-spark-tws.jsonl (--step
# map_batches: -l2, apply_in_pandas_with_state: -l3); with --state-memory (state
# spilling past a budget), to bench/results/chaos_spark_spill/chaos-spark-spill.jsonl
# (with --step tws too, chaos-spark-tws-spill.jsonl there; -l2-, -l3-); with
# --session-gap (levels 2 and 3 with event-time timeouts), -sessions.jsonl; with
# --state-root s3
# (the state root on moto's S3), to bench/results/chaos_spark_s3/chaos-spark-s3.jsonl.
# Usage: bash bench/chaos_spark.sh CHUNKS RUNS SEED [extra snapcut chaos args]
set -u
chunks=${1:-10}; runs=${2:-10}; seed=${3:-4000}; shift 3 2>/dev/null || shift $#
export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$(command -v python)}
out=$(dirname "$0")/results/chaos_spark/chaos-spark.jsonl
case " $* " in *" --remote "*) out=${out%.jsonl}-connect.jsonl ;; esac
step=
case " $* " in
  *" --step tws "*) step=-tws ;;
  *" --step map_batches "*) step=-l2 ;;
  *" --step apply_in_pandas_with_state "*) step=-l3 ;;
esac
out=${out%.jsonl}$step.jsonl
case " $* " in
  *" --state-memory "*)
    out=$(dirname "$0")/results/chaos_spark_spill/chaos-spark$step-spill.jsonl ;;
esac
case " $* " in
  *" --session-gap "*) out=${out%.jsonl}-sessions.jsonl ;;
esac
case " $* " in
  *" --state-root s3 "*) out=$(dirname "$0")/results/chaos_spark_s3/chaos-spark-s3.jsonl ;;
esac
# SNAPCUT_CHAOS_OUT names another file (a campaign of its own, e.g. compaction's).
out=${SNAPCUT_CHAOS_OUT:-$out}
mkdir -p "$(dirname "$out")"
log=/tmp/snapcut-chaos-bench/spark.log
mkdir -p /tmp/snapcut-chaos-bench
for c in $(seq 0 $((chunks - 1))); do
  python -m snapcut chaos --engine spark --runs "$runs" --seed $((seed + c)) \
    --workdir "/tmp/snapcut-chaos-bench/spark-$((seed + c))" "$@" | tee -a "$log" \
    | tail -n 1 >> "$out"
done
