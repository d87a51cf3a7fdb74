"""The dwell-time query's per-user logic as a Spark ``StatefulProcessor``
(for ``spark_dwell --step tws``): count, total and average per user in a
value state, the user's last three dwell times in a list state and hits per
dwell second in a map state. The output rows are the aggregate step's
``(user, count, total, avg)``, so chaos runs check both steps the same way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

OUTPUT = "user long, count long, total long, avg double"
TOTALS = "totals"


class DwellProcessor(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.totals = handle.getValueState(TOTALS, "count long, total long")
        self.recent = handle.getListState("recent", "dwell_ms long")
        self.seconds = handle.getMapState("seconds", "second long", "hits long")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        count, total = self.totals.get() or (0, 0)
        dwell: list[int] = []
        for frame in rows:
            dwell += [int(v) for v in frame["dwell_ms"]]
        count += len(dwell)
        total += sum(dwell)
        self.totals.update((count, total))
        self.recent.put([*self.recent.get(), *((d,) for d in dwell)][-3:])
        for second in sorted({d // 1000 for d in dwell}):
            hits = self.seconds.getValue((second,))
            self.seconds.updateValue((second,), ((hits[0] if hits else 0) + 1,))
        yield pd.DataFrame(
            {"user": [key[0]], "count": [count], "total": [total], "avg": [total / count]}
        )

    def close(self) -> None:
        pass
