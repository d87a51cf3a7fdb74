"""The SparkSession of snapcut's own Spark tools (the jobs, the demo, chaos,
``snapcut spark``): a classic session on ``master``, or a Spark Connect
session on ``remote`` (``local[2]`` starts a local Connect server in this
process's JVM; ``sc://host:15002`` talks to a running one)."""

from __future__ import annotations

import os
import sys
from typing import Any

from snapcut._core import ConfigError

__all__ = ["build_session", "check_remote"]


def check_remote(remote: str, what: str, *, local_only: bool = False) -> None:
    """Refuses a ``--remote`` value that is neither a Connect URL nor a local
    master; `local_only`: a tool that kills the server's process tree needs
    the server to be its own child (``local[...]``)."""
    local = remote.startswith(("local[", "local-cluster[")) or remote == "local"
    if not local and not remote.startswith("sc://"):
        raise ConfigError(
            f"--remote {remote!r} is not a Spark Connect URL: write sc://host:15002 for a "
            "running server, or local[2] to start one locally"
        )
    if local_only and not local:
        raise ConfigError(
            f"{what} kills the Spark Connect server with the job's process tree, so the server "
            f"must be the job's own: use --remote local[N] (a local server), not {remote!r}"
        )


def build_session(
    app: str, *, master: str, remote: str | None = None, conf: dict[str, str] | None = None
) -> Any:
    """A classic session on `master`, or a Connect session on `remote`."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    builder = builder.remote(remote) if remote is not None else builder.master(master)
    builder = builder.appName(app)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        **(conf or {}),
    }
    if remote is not None and remote.startswith("sc://"):
        # A running server's static settings are its own: set only session ones.
        settings = {k: v for k, v in settings.items() if not k.startswith("spark.ui.")}
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if remote is None:
        spark.sparkContext.setLogLevel("ERROR")
    return spark
