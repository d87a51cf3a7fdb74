"""Making ``format("snapcut")`` known to a Spark session, once per session."""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

__all__ = ["register"]

_registered: weakref.WeakSet[Any] = weakref.WeakSet()


def register(spark: Any) -> None:
    """Registers snapcut's data source with `spark` (a classic or Connect
    session). Idempotent: a session it has seen is left alone."""
    try:
        if spark in _registered:
            return
    except TypeError:  # a session that takes no weak reference: register again
        pass
    from snapcut.spark.source.data_source import SnapcutDataSource

    spark.dataSource.register(SnapcutDataSource)
    with contextlib.suppress(TypeError):
        _registered.add(spark)
