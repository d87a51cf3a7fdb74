"""`snapcut snapshots`: inspect and operate a snapshot root from the shell.

ROOT is a local path or any URI pyarrow's filesystems accept (file://,
s3://, gs://, hdfs://); roots of the local runtime and of snapcut's Spark
helper alike. Every command is a thin layer over the Python API in
snapcut.snapshots (list_checkpoints, show_checkpoint, verify_checkpoints,
diff_checkpoints, changes, export_checkpoint, prune).

Tables are drawn with rich on a terminal and as plain columns otherwise;
--json prints machine-readable output. Errors are one line on stderr, with
exit code 2; `verify` exits with 1 when a checkpoint is broken.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from snapcut import _fs, snapshots
from snapcut._console import Out
from snapcut._core import SnapcutError
from snapcut.snapshots.layout import parse_dir_name
from snapcut.snapshots.ops import CheckpointRow, TaskInfo
from snapcut.snapshots.ops import Progress as ProgressFn
from snapcut.snapshots.tables import FORMATS, TaskDiff, write_diff

Handler = Callable[[argparse.Namespace], int]


def _shown(root: str) -> str:
    """A root as printed: a URI's credentials (s3://KEY:SECRET@...) masked."""
    return _fs.redact(root)


@contextmanager
def _progress(description: str, in_bytes: bool) -> Iterator[ProgressFn]:
    """A rich progress bar on stderr (only when it is a terminal)."""
    console = Console(stderr=True)
    count = DownloadColumn() if in_bytes else MofNCompleteColumn()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        count,
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as bar:
        task = bar.add_task(description, total=None)

        def advance(n: int, total: int) -> None:
            bar.update(task, total=total, advance=n)

        yield advance


def _when(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _chain(ids: Sequence[int]) -> str:
    return "→".join(str(i) for i in ids) if ids else "-"


def _num(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _short(value: Any, width: int = 32) -> str:
    text = repr(value) if isinstance(value, bytes | str) else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _checkpoint_id(text: str) -> int:
    """A checkpoint id: `5` or its directory name `chk-00000005`."""
    if text.isdigit():
        return int(text)
    cid = parse_dir_name(text)
    if cid is None:
        raise argparse.ArgumentTypeError(f"not a checkpoint id: {text!r}")
    return cid


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return int(text)


def _status(row: CheckpointRow) -> str:
    return "complete (savepoint)" if row.savepoint else row.status


def cmd_list(args: argparse.Namespace, out: Out) -> int:
    rows = snapshots.list_checkpoints(args.root)
    if args.json:
        out.json([r.to_dict() for r in rows])
        return 0
    if not rows:
        out.line(f"no checkpoints under {_shown(args.root)}")
        return 0
    header: tuple[str, ...] = ("id", "committed (UTC)", "engine", "protocol", "status", "kind")
    header += ("files", "size", "records", "chain")
    out.table(
        header,
        [
            (
                str(r.id),
                _when(r.committed_ms),
                r.engine or "-",
                r.protocol or "-",
                _status(r),
                r.kind or "-",
                str(r.files),
                _size(r.bytes),
                _num(r.records),
                _chain(r.chain),
            )
            for r in rows
        ],
        right=(0, 6, 7, 8),
    )
    complete = sum(r.status == "complete" for r in rows)
    out.line(f"{len(rows)} checkpoints under {_shown(args.root)}: {complete} complete")
    for r in rows:
        if r.error:
            out.line(f"  checkpoint {r.id} is {r.status}: {r.error}")
    return 0


def _task_row(t: TaskInfo) -> tuple[str, ...]:
    s = t.state
    chan_rows = sum(int(c["rows"]) for c in t.channels)
    return (
        t.label,
        "-" if s is None else str(s.get("kind", "full")),
        "-" if s is None else _num(int(s["rows"])),
        "-" if s is None else _size(int(s["bytes"])),
        "-" if s is None else _chain(s.get("chain") or []),
        f"{len(t.channels)} ({chan_rows:,} rows)" if t.channels else "-",
        _num(t.source_offset),
        "-" if t.alignment_ms is None else f"{t.alignment_ms:.3f}",
    )


def cmd_show(args: argparse.Namespace, out: Out) -> int:
    info = snapshots.show_checkpoint(args.root, args.id)
    if args.json:
        out.json(info.to_dict())
        return 0
    m, r = info.manifest, info.summary
    took = ""
    if m.get("started_ms") and m.get("committed_ms"):
        took = f" ({m['committed_ms'] - m['started_ms']} ms after it started)"
    out.line(f"checkpoint {r.id} under {_shown(args.root)}")
    fields = [
        ("status", _status(r)),
        ("engine", f"{r.engine}, protocol {r.protocol}"),
        ("committed", f"{_when(r.committed_ms)} UTC{took}"),
        ("format", f"{m.get('format')} v{m.get('format_version')}"),
        ("graph", m.get("graph_fingerprint") or "-"),
        ("kind", f"{r.kind or 'no state'}, chain {_chain(r.chain)}"),
        ("files", f"{r.files} files, {_size(r.bytes)}, {_num(r.records)} records"),
    ]
    for key, value in (m.get("spark") or {}).items():
        fields.append((f"spark {key}", json.dumps(value) if not isinstance(value, str) else value))
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        out.line(f"  {key.ljust(width)}  {value}")
    out.line()
    header = ("task", "state", "rows", "size", "chain", "channel logs", "source offset")
    out.table(
        (*header, "align ms"),
        [_task_row(t) for t in info.tasks],
        right=(2, 3, 6, 7),
        title="tasks",
    )
    other = [(t.label, f) for t in info.tasks for f in t.other]
    other += [(f"partition {f['partition']}" if "partition" in f else "-", f) for f in info.files]
    if other:
        out.line()
        out.table(
            ("file", "role", "task", "rows", "size"),
            [
                (str(f["path"]), str(f["role"]), task, _num(int(f["rows"])), _size(int(f["bytes"])))
                for task, f in other
            ],
            right=(3, 4),
            title="other files",
        )
    return 0


def cmd_verify(args: argparse.Namespace, out: Out) -> int:
    which: int | Literal["latest", "all"] = (
        "all" if args.all else "latest" if args.id is None else int(args.id)
    )
    with _progress("verifying", in_bytes=True) as progress:
        checks = snapshots.verify_checkpoints(args.root, which, progress=progress)
    out.table(
        ("id", "status", "files read", "bytes read", "result"),
        [
            (
                str(c.id),
                c.status,
                str(len(c.files)),
                _size(sum(f.bytes for f in c.files)),
                "ok" if c.ok else "BROKEN",
            )
            for c in checks
        ],
        right=(0, 2, 3),
    )
    broken = [c for c in checks if not c.ok]
    for c in broken:
        for reason in c.reasons():
            out.line(f"  {reason}")
    if broken:
        out.line(f"{len(broken)} of {len(checks)} checkpoints broken under {_shown(args.root)}")
        return 1
    out.line(f"{len(checks)} checkpoint{'s' * (len(checks) != 1)} intact under {_shown(args.root)}")
    return 0


def _sample_lines(d: TaskDiff, n: int) -> list[str]:
    sample = d.sample(n)
    keys = d.key

    def key_of(row: dict[str, Any]) -> str:
        return " ".join(f"{k}={_short(row[k])}" for k in keys)

    def values(row: dict[str, Any]) -> str:
        return " ".join(f"{k}={_short(v)}" for k, v in row.items() if k not in keys)

    lines = [f"  + {key_of(r)}  {values(r)}".rstrip() for r in sample["added"]]
    lines += [f"  - {key_of(r)}  {values(r)}".rstrip() for r in sample["removed"]]
    for r in sample["changed"]:
        cols = [c.removeprefix("before_") for c in r if c.startswith("before_")]
        moved = [
            f"{c}: {_short(r[f'before_{c}'])} → {_short(r[f'after_{c}'])}"
            for c in cols
            if r[f"before_{c}"] != r[f"after_{c}"]
        ]
        lines.append(f"  ~ {key_of(r)}  {', '.join(moved)}")
    return lines


def cmd_diff(args: argparse.Namespace, out: Out) -> int:
    diffs = snapshots.diff_checkpoints(args.root, args.a, args.b, task=args.task)
    if args.arrow is not None:
        files = write_diff(diffs, args.arrow, overwrite=args.overwrite)
        if not args.json:
            out.line(f"wrote {len(files)} Arrow files to {args.arrow}: {', '.join(files)}")
    if args.json:
        out.json({"a": args.a, "b": args.b, "tasks": [d.to_dict(args.sample) for d in diffs]})
        return 0
    out.table(
        ("task", "key", "rows A", "rows B", "added", "removed", "changed", "unchanged"),
        [
            (
                d.label,
                ",".join(d.key) or "(whole rows)",
                *(f"{v:,}" for v in d.counts().values()),
            )
            for d in diffs
        ],
        right=(2, 3, 4, 5, 6, 7),
        title=f"checkpoint {args.a} → {args.b}",
    )
    for d in diffs:
        lines = _sample_lines(d, args.sample)
        if lines:
            out.line(f"{d.label} (up to {args.sample} of each):")
            for line in lines:
                out.line(line)
    return 0


CHANGE_FORMATS = ("table", "json", "parquet")


def cmd_changes(args: argparse.Namespace, out: Out) -> int:
    if args.format == "parquet" and args.to is None:
        raise SnapcutError("--format parquet writes a file: name it with --to FILE")
    feed = snapshots.changes(args.root, args.start, args.end, variable=args.variable)
    if args.format == "parquet":
        fs, path = _fs.resolve(args.to)
        with fs.open_output_stream(path) as sink:
            pq.write_table(feed, sink)
        out.line(f"wrote {feed.num_rows:,} changes to {args.to}")
        return 0
    rows = feed.to_pylist()
    if args.format == "json":
        out.json(rows)
        return 0
    out.table(
        ("batch", "change", "partition", "key", "value"),
        [
            (
                str(r["batch_id"]),
                str(r["change_type"]),
                str(r["partition_id"]),
                _fields(r["key"]),
                "-" if r["value"] is None else _fields(r["value"]),
            )
            for r in rows
        ],
        right=(0, 2),
    )
    out.line(f"{len(rows):,} changes under {_shown(args.root)}")
    return 0


def _fields(row: dict[str, Any]) -> str:
    return " ".join(f"{k}={_short(v)}" for k, v in row.items())


def cmd_export(args: argparse.Namespace, out: Out) -> int:
    with _progress("exporting", in_bytes=False) as progress:
        result = snapshots.export_checkpoint(
            args.root,
            args.to,
            args.id,
            format=args.format,
            overwrite=args.overwrite,
            progress=progress,
        )
    out.table(
        ("table", "role", "files", "rows", "key", "path"),
        [
            (
                t.name,
                t.role,
                str(len(t.parts)),
                f"{t.rows:,}",
                t.key or "-",
                f"{t.path}/*.{result.format}",
            )
            for t in result.tables
        ],
        right=(2, 3),
        title=f"checkpoint {result.checkpoint} → {result.out} ({result.format})",
    )
    files = sum(len(t.parts) for t in result.tables)
    out.line(f"exported {len(result.tables)} tables in {files} files")
    if result.tables and result.format != "arrow":
        t = result.tables[0]
        reader = "read_parquet" if result.format == "parquet" else "read_csv"
        out.line(
            f"e.g. duckdb -c \"SELECT * FROM {reader}('{result.out}/{t.path}/*.{result.format}')\""
        )
    return 0


def cmd_prune(args: argparse.Namespace, out: Out) -> int:
    result = snapshots.prune(args.root, args.keep, dry_run=args.dry_run)

    def ids(values: Sequence[int]) -> str:
        return ", ".join(map(str, values)) or "none"

    verb = "would remove" if result.dry_run else "removed"
    out.line(f"{verb} {len(result.removed)} checkpoints: {ids(result.removed)}")
    out.line(
        f"kept {len(result.kept)} (the newest {args.keep}, savepoints and the bases they "
        f"need): {ids(result.kept)}"
    )
    if result.base_only:
        out.line(
            f"kept only as bases, not restorable themselves: {ids(result.base_only)} (their "
            "own chains start in removed checkpoints)"
        )
    if result.held:
        out.line(
            f"held {len(result.held)} directories for the runs kept checkpoints read "
            f"(only those files stay): {ids(result.held)}"
        )
    if result.partial:
        out.line(f"left {len(result.partial)} partial directories alone: {ids(result.partial)}")
    return 0


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def _handler(command: str, fn: Callable[[argparse.Namespace, Out], int]) -> Handler:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args, Out())
        except (SnapcutError, OSError, pa.ArrowException) as err:
            print(f"snapcut snapshots {command}: error: {_one_line(err)}", file=sys.stderr)
            return 2

    return run


_ID_HELP = "checkpoint or Spark batch id (5 or chk-00000005); default: the newest complete one"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "snapshots",
        help="list, show, verify, diff, export and prune the checkpoints of a snapshot root, "
        "and read its change feed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmds = p.add_subparsers(dest="snapshots_command", metavar="COMMAND", required=True)

    def command(name: str, fn: Callable[[argparse.Namespace, Out], int], help: str) -> Any:
        c = cmds.add_parser(name, help=help, description=help)
        c.add_argument("root", metavar="ROOT", help="local path or URI (file://, s3://, ...)")
        c.set_defaults(handler=_handler(name, fn))
        return c

    c = command("list", cmd_list, "one row per checkpoint (or Spark batch), oldest first")
    c.add_argument("--json", action="store_true", help="print JSON")

    c = command("show", cmd_show, "a checkpoint's manifest, per task (default: the newest)")
    c.add_argument("id", metavar="ID", nargs="?", type=_checkpoint_id, help=_ID_HELP)
    c.add_argument("--json", action="store_true", help="print JSON (the manifest included)")

    c = command(
        "verify",
        cmd_verify,
        "check size, checksum and structure of every file (default: the newest checkpoint); "
        "exit code 1 when anything is broken",
    )
    which = c.add_mutually_exclusive_group()
    which.add_argument("id", metavar="ID", nargs="?", type=_checkpoint_id, help=_ID_HELP)
    which.add_argument("--all", action="store_true", help="every checkpoint directory")

    c = command("diff", cmd_diff, "keys added, removed and changed from checkpoint A to B")
    c.add_argument("a", metavar="A", type=_checkpoint_id, help="checkpoint before")
    c.add_argument("b", metavar="B", type=_checkpoint_id, help="checkpoint after")
    c.add_argument("--task", metavar="T", help="a task (vertex-subtask) or a vertex")
    c.add_argument("--sample", type=int, default=5, help="rows of each change to show")
    c.add_argument("--json", action="store_true", help="print JSON")
    c.add_argument(
        "--arrow",
        metavar="OUT",
        help="also write every change as OUT/<vertex>/part-<subtask>.arrow",
    )
    c.add_argument("--overwrite", action="store_true", help="replace an earlier OUT")

    c = command(
        "changes",
        cmd_changes,
        "one row per key changed per batch from START to END (Spark's change feed "
        "columns: batch_id, change_type, key, value, partition_id)",
    )
    c.add_argument("start", metavar="START", type=_checkpoint_id, help="first batch")
    c.add_argument(
        "end", metavar="END", nargs="?", type=_checkpoint_id, help="last batch (default: newest)"
    )
    c.add_argument("--variable", metavar="V", help="a transformWithState state variable")
    c.add_argument("--format", choices=CHANGE_FORMATS, default="table")
    c.add_argument("--to", metavar="FILE", help="the parquet file --format parquet writes")

    c = command(
        "export",
        cmd_export,
        "write each operator's full state (and a Spark batch's outputs) as "
        "OUT/<table>/part-<subtask>.<format>",
    )
    c.add_argument("id", metavar="ID", nargs="?", type=_checkpoint_id, help=_ID_HELP)
    c.add_argument("--to", required=True, metavar="OUT", help="directory (path or URI)")
    c.add_argument("--format", choices=FORMATS, default="parquet")
    c.add_argument("--overwrite", action="store_true", help="replace an earlier export in OUT")

    c = command(
        "prune",
        cmd_prune,
        "remove old checkpoints, keeping the newest N, savepoints and every base they need",
    )
    c.add_argument("--keep", type=_positive, required=True, metavar="N")
    c.add_argument("--dry-run", action="store_true", help="only say what would be removed")
