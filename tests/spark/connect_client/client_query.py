"""Run by the client-only venv (pyspark-client, no JVM): keyed_state + the
sink against a Spark Connect server; prints one JSON line of what it saw."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(url: str, base: str) -> None:
    import pyspark
    from pyspark.sql import SparkSession

    import snapcut.spark as ss

    jvm_files = Path(pyspark.__file__).parent / "jars"
    spark = SparkSession.builder.remote(url).getOrCreate()
    src = (
        spark.readStream.schema("user long, dwell_ms long")
        .option("maxFilesPerTrigger", 1)
        .parquet(f"{base}/in")
    )
    state = ss.keyed_state(src, key="user", root=f"{base}/state", partitions=2)
    totals = state.aggregate(count="count", total=("sum", "dwell_ms"))
    sink = ss.ArrowSnapshotSink(
        f"{base}/out",
        output_mode="update",
        key="user",
        state=state,
        checkpoint_location=f"{base}/chk",
    )
    query = (
        totals.writeStream.foreachBatch(sink)
        .option("checkpointLocation", f"{base}/chk")
        .outputMode("update")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    out = ss.read_output_arrow(f"{base}/out").to_pylist()
    print(
        json.dumps(
            {
                "client": type(spark).__module__,
                "pyspark_has_jars": jvm_files.exists(),
                "history": [[h.batch_id, h.rows, h.state_batch] for h in sink.history()],
                "output": sorted([r["user"], r["count"], r["total"]] for r in out),
                "spark_reader_rows": ss.read_output(spark, f"{base}/out").count(),
            }
        )
    )
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
