"""Writes a JVM class archive (CDS) of the classes a Spark test JVM loads, for
scripts/test.sh: one local session runs the plans the tests run most (a batch
query through mapInArrow, a streaming query through applyInPandasWithState
into foreachBatch, a Parquet write and read), then stops; the JVM writes the
classes it loaded into the archive as it exits (-XX:ArchiveClassesAtExit).

Every later JVM started with -XX:SharedArchiveFile=ARCHIVE maps those classes
instead of loading, parsing and verifying them from the jars (measured
2026-12-04: a session's start and two small queries took 9.4-9.6 CPU seconds
with the archive, 12.4-14.4 without). A JVM whose class path differs from
this one's (an executor of local-cluster) uses the JDK's own archive only;
what any JVM computes does not depend on it.

    python scripts/spark_class_archive.py ARCHIVE
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa


def main(archive: Path) -> int:
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.unlink(missing_ok=True)
    options = os.environ.get("JDK_JAVA_OPTIONS", "")
    os.environ["JDK_JAVA_OPTIONS"] = f"{options} -XX:ArchiveClassesAtExit={archive}".strip()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.state import GroupStateTimeout

    try:
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("snapcut-class-archive")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.memory", "1g")
            .getOrCreate()
        )
    except Exception as e:  # PySpark's gateway errors have no common class
        print(
            f"spark_class_archive: Spark did not start ({type(e).__name__}: {e}); its JVM "
            f"ran with JDK_JAVA_OPTIONS={os.environ['JDK_JAVA_OPTIONS']!r}: check those "
            "options and that JAVA_HOME names a Java 17",
            file=sys.stderr,
        )
        return 1
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:

        def same(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            yield from batches

        rows = spark.range(10_000).selectExpr("id", "id % 7 AS k")
        rows.mapInArrow(same, rows.schema).groupBy("k").count().collect()
        rows.write.parquet(f"{tmp}/in")

        def count(
            key: tuple[int], frames: Iterator[pd.DataFrame], state: object
        ) -> Iterator[pd.DataFrame]:
            n = sum(len(f) for f in frames)
            yield pd.DataFrame({"k": [key[0]], "n": [n]})

        def collect(df: Any, _batch_id: int) -> None:
            df.collect()

        query = (
            spark.readStream.schema("id long, k long")
            .parquet(f"{tmp}/in")
            .groupBy("k")
            .applyInPandasWithState(
                count, "k long, n long", "n long", "update", GroupStateTimeout.NoTimeout
            )
            .writeStream.foreachBatch(collect)
            .outputMode("update")
            .option("checkpointLocation", f"{tmp}/chk")
            .trigger(availableNow=True)
            .start()
        )
        # Bounded: its one small batch takes seconds; 300 s means Spark is stuck.
        if not query.awaitTermination(300):
            query.stop()
            spark.stop()
            print("spark_class_archive: the streaming query ran past 300 s", file=sys.stderr)
            return 1
    spark.stop()
    # The gateway JVM writes the archive as it exits: it exits once its stdin
    # closes (PySpark's launcher watches it), which waiting here makes happen
    # before this process ends.
    from pyspark import SparkContext

    proc = SparkContext._gateway.proc  # type: ignore[union-attr]
    proc.stdin.close()
    proc.wait(timeout=120)
    if not archive.exists():
        print(f"spark_class_archive: the JVM wrote no archive at {archive}", file=sys.stderr)
        return 1
    print(f"spark_class_archive: {archive} ({archive.stat().st_size >> 20} MiB)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python scripts/spark_class_archive.py ARCHIVE", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(Path(sys.argv[1])))
