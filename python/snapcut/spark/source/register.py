"""Making ``format("snapcut")`` known to a Spark session, once per session."""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any

from snapcut.spark.source.options import FORMAT

__all__ = ["register"]

# Per session: whether ``format("snapcut")`` resolves in it.
_known: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
# Queries started from several threads of one driver register at once, and
# Spark refuses the second registration of a name: check and call are one step.
_lock = threading.Lock()
_ALREADY_EXISTS = "DATA_SOURCE_ALREADY_EXISTS"


def register(spark: Any) -> bool:
    """Registers snapcut's data source with `spark` (a classic or Connect
    session); returns whether ``spark.read.format("snapcut")`` resolves in it.

    Idempotent and safe from several threads. False only where Spark refuses
    the name: Spark 4.3 refuses it in a second session of a driver whose first
    session registered it (``newSession()``) yet does not resolve it there.
    ``read_state`` and ``read_output`` then read through ``mapInArrow``."""
    from snapcut.spark.source.data_source import SnapcutDataSource

    with _lock:
        try:
            if spark in _known:
                return _known[spark]
        except TypeError:  # a session that takes no weak reference: ask Spark again
            pass
        if _resolves(spark):
            usable = True
        else:
            try:
                spark.dataSource.register(SnapcutDataSource)
                usable = True
            except Exception as exc:
                if _condition(exc) != _ALREADY_EXISTS:
                    raise
                usable = bool(_resolves(spark))
        with contextlib.suppress(TypeError):
            _known[spark] = usable
        return usable


def _resolves(spark: Any) -> bool | None:
    """Whether the session's own data source manager has the name; None on
    Spark Connect, whose client cannot ask."""
    try:
        manager = spark._jsparkSession.sessionState().dataSourceManager()
    except Exception:
        return None
    return bool(manager.dataSourceExists(FORMAT))


def _condition(exc: BaseException) -> str | None:
    """The Spark error condition of `exc`, or None for an error that is not Spark's."""
    for name in ("getCondition", "getErrorClass"):
        method = getattr(exc, name, None)
        if callable(method):
            value = method()
            return value if isinstance(value, str) else None
    return None
