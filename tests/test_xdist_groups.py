"""With ``pytest -n 2 --dist loadgroup`` (two xdist workers) each Spark module
must stay on one worker (its session starts once) and every
test that binds Spark Connect's port 15002 must share one group (two such
servers at once fail to bind). These check the grouping rule of
tests/conftest.py and that the installed pytest and pytest-xdist honour it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import CONNECT_PORT_GROUP, LOCAL_CLUSTER_GROUP, SPARK_TESTS


class GroupRecorder:
    def __init__(self) -> None:
        self.groups: dict[str, list[str]] = {}
        self.marked_connect: set[str] = set()
        self.marked_server: set[str] = set()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            marks = item.iter_markers("xdist_group")
            self.groups[item.nodeid] = [str(m.args[0]) for m in marks]
            if item.get_closest_marker("connect_port") is not None:
                self.marked_connect.add(item.nodeid)
            if item.get_closest_marker("connect_server") is not None:
                self.marked_server.add(item.nodeid)


def test_each_spark_module_is_one_group_and_connect_servers_share_one() -> None:
    recorder = GroupRecorder()
    code = pytest.main(
        ["--collect-only", "-q", "-p", "no:cacheprovider", str(SPARK_TESTS)],
        plugins=[recorder],
    )
    assert code == 0
    assert len(recorder.groups) > 100  # the Spark suite was collected
    connect: list[str] = []
    cluster: set[str] = set()
    for nodeid, groups in recorder.groups.items():
        assert len(groups) == 1, (nodeid, groups)
        if groups == [CONNECT_PORT_GROUP]:
            connect.append(nodeid)
            assert nodeid in recorder.marked_connect, nodeid
        elif groups == [LOCAL_CLUSTER_GROUP]:
            cluster.add(Path(nodeid.split("::")[0]).name)
        else:
            assert groups == [Path(nodeid.split("::")[0]).name], nodeid
    # the Connect session kind, and the tests that start `--remote local[2,4]` children
    assert any(n.endswith("[connect]") and "test_spark_state.py" in n for n in connect)
    assert any("test_demo_kills_restarts_and_verifies[connect]" in n for n in connect)
    assert any("test_chaos_on_spark_connect_is_exactly_once" in n for n in connect)
    # Classic sessions run beside each other, except where Spark starts a Python
    # process that has a fixed 10 s to connect back: the streaming data
    # source's reader, and Spark's own transformWithState's driver worker.
    alone = ("test_spark_source_stream.py", "test_row_variant_on_a_batch_dataframe[classic]")
    assert all(any(a in n for n in connect) for a in alone)
    assert any("test_chained_chaos_on_spark_is_exactly_once" in n for n in connect)
    assert any("test_spark_tws_parity.py" in n for n in connect)
    assert not any(n.endswith("[classic]") and not any(a in n for a in alone) for n in connect)
    assert cluster == {"test_spark_cluster.py", "test_spark_archives.py"}
    # `-m connect_port` (scripts/test.sh's full-priority runs) selects exactly that group,
    # `-m connect_server` the part that binds the port: the Connect session
    # kind and the tests that start `--remote` children, no classic session's test
    assert recorder.marked_connect == set(connect)
    server = recorder.marked_server
    assert server < recorder.marked_connect
    assert all("connect" in n.split("::")[1] for n in server), sorted(server)
    assert not any("[classic" in n for n in server)
    assert any("test_chaos_on_spark_connect_is_exactly_once" in n for n in server)
    assert any("test_demo_kills_restarts_and_verifies[connect]" in n for n in server)
    assert not any("test_spark_tws_parity.py" in n for n in server)


def test_the_installed_pytest_and_xdist_keep_a_group_on_one_worker(tmp_path: Path) -> None:
    """pytest-xdist 3.8 marks a group by appending ``@group`` to the node id,
    which pytest 9.2 stopped reading (pyproject.toml pins pytest < 9.2)."""
    (tmp_path / "test_grouped.py").write_text(
        "import pytest\n\n\n"
        "@pytest.mark.xdist_group('together')\n"
        "def test_one():\n    pass\n\n\n"
        "@pytest.mark.xdist_group('together')\n"
        "def test_two():\n    pass\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    workers = {
        line.split()[0]
        for line in run.stdout.splitlines()
        if "PASSED" in line and "@together" in line
    }
    assert len(workers) == 1, run.stdout
