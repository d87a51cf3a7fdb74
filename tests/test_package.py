import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.import_graph import cycles, import_graph, module_files

import snapcut
from snapcut import _core
from snapcut.cli import main


def test_version_matches_the_rust_crate() -> None:
    assert snapcut.__version__ == _core.__version__
    assert snapcut.__version__.count(".") == 2


def test_cli_prints_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"snapcut {snapcut.__version__}"


def test_console_script_runs_as_module() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "snapcut", "--version"], capture_output=True, text=True, check=True
    )
    assert snapcut.__version__ in out.stdout


def test_cli_without_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: snapcut" in capsys.readouterr().err


@pytest.mark.parametrize(("env", "want"), [(None, 1000), ("123", 123)])
def test_the_allocator_keeps_freed_pages_a_second_unless_told(env: str | None, want: int) -> None:
    # In a new process: options are read once. The environment's value read
    # back through the index the bindings set shows it is `purge_delay`.
    code = "from snapcut import _core; print(_core._allocator_purge_delay_ms())"
    environ = {k: v for k, v in os.environ.items() if k != "MIMALLOC_PURGE_DELAY"}
    if env is not None:
        environ["MIMALLOC_PURGE_DELAY"] = env
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=environ
    )
    assert int(out.stdout) == want


def test_protocol_name_is_validated_in_rust() -> None:
    assert _core.protocol_name("Chandy_Lamport") == "chandy-lamport"
    with pytest.raises(snapcut.ConfigError, match=r"unknown protocol \"bogus\""):
        _core.protocol_name("bogus")
    assert issubclass(snapcut.ConfigError, snapcut.SnapcutError)


def test_no_import_cycles_in_the_package() -> None:
    """Dependencies point down only (lazy and TYPE_CHECKING imports included)."""
    src = Path(__file__).resolve().parents[1] / "python"
    graph = import_graph(src, extra_modules=("snapcut._core",))
    assert "snapcut.spark.keyed_state" in graph["snapcut.spark"]  # the graph was read
    assert cycles(graph) == []


FORMAT = "snapcut._core.format"


def format_binding_users(src: Path) -> list[str]:
    """Modules under `src` outside ``snapcut.snapshots`` that use the format
    bindings: import ``snapcut._core.format`` (any form, lazy and
    TYPE_CHECKING ones included), or reach ``_core.format`` / a flat
    ``format_*`` binding by attribute or ``from snapcut._core import``."""
    graph = import_graph(src, extra_modules=("snapcut._core", FORMAT))
    users = {m for m, deps in graph.items() if FORMAT in deps}
    for module, path in module_files(src).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "snapcut._core":
                if any(a.name.startswith("format") for a in node.names):
                    users.add(module)
            elif (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("format")
                and isinstance(node.value, ast.Name | ast.Attribute)
                and (node.value.id if isinstance(node.value, ast.Name) else node.value.attr)
                == "_core"
            ):
                users.add(module)
    return sorted(m for m in users if m.split(".")[:2] != ["snapcut", "snapshots"])


def test_only_snapshots_calls_the_format_bindings() -> None:
    """The format's rules reach the rest of the package through
    ``snapcut.snapshots`` (``encode_ipc``, ``file_entry``, the readers and
    writers), never around it."""
    src = Path(__file__).resolve().parents[1] / "python"
    graph = import_graph(src, extra_modules=("snapcut._core", FORMAT))
    assert any(FORMAT in graph[m] for m in graph if m.startswith("snapcut.snapshots."))
    assert format_binding_users(src) == []


def test_the_format_check_finds_every_way_in(tmp_path: Path) -> None:
    files = {
        "snapshots/ok.py": "from snapcut._core import format as fmt\n",
        "spark/a.py": "def f():\n    import snapcut._core.format\n",
        "spark/b.py": "from snapcut._core import format_scan\n",
        "spark/c.py": "from snapcut import _core\n_core.format.scan([])\n",
        "spark/d.py": "import snapcut._core\nsnapcut._core.format_scan\n",
        "spark/e.py": "from snapcut._core.format import scan\n",
        "spark/f.py": "from snapcut._core import SnapshotError\n",
    }
    for name, text in {"__init__.py": "", "snapshots/__init__.py": "", **files}.items():
        (tmp_path / "snapcut" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "snapcut" / name).write_text(text)
    assert format_binding_users(tmp_path) == [f"snapcut.spark.{m}" for m in "abcde"]


def test_the_cycle_check_finds_lazy_and_type_only_cycles(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg import b\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n"
    )
    (pkg / "c.py").write_text("from pkg.a import f\n")
    assert cycles(import_graph(tmp_path)) == [["pkg.a", "pkg.b"]]


SPARK_MODULE_MAX_LINES = 500


def test_no_module_of_the_spark_wing_is_over_500_lines() -> None:
    """Issue 36's rooms: every module of ``snapcut.spark`` owns one concept,
    which kept them under ~500 lines; a module that grows past it is due for
    a split, not a longer file."""
    spark = Path(__file__).resolve().parents[1] / "python" / "snapcut" / "spark"
    sizes = {p: len(p.read_text().splitlines()) for p in spark.rglob("*.py")}
    assert len(sizes) > 20
    limit = SPARK_MODULE_MAX_LINES
    too_long = {str(p.relative_to(spark)): n for p, n in sizes.items() if n > limit}
    assert too_long == {}, f"split these modules by concept (lines): {too_long}"
