"""Session kinds for the Spark test modules.

A module that sets ``SESSION_KINDS = True`` and defines a module-scoped
``spark`` fixture taking ``request.param`` gets every test run on a classic
session, and the tests marked ``both_sessions`` once more on Spark Connect
(the same assertions). Classic is always parameter 0, so pytest runs all of
a module's classic cases on one session, then all its Connect cases on one
Connect server (one kind at a time per process)."""

from __future__ import annotations

import pytest
from tests.spark_support import SESSION_KINDS


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "spark" not in metafunc.fixturenames or not getattr(metafunc.module, "SESSION_KINDS", False):
        return
    both = metafunc.definition.get_closest_marker("both_sessions") is not None
    kinds = list(SESSION_KINDS) if both else [SESSION_KINDS[0]]
    metafunc.parametrize("spark", kinds, indirect=True, scope="module")
