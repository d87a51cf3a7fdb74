"""Counts the Python lines that still implement snapshot-format logic.

"Format logic": code that applies a rule of docs/format.md itself (names of
directories and files, what makes a checkpoint complete or partial, which
entries of a manifest mean what, chains, retention, verification, encoding)
rather than moving bytes, calling ``snapcut._core.format_*`` or presenting
results. The spans are chosen by hand (the list below is the judgement);
this script only measures them, so the figure follows the code. Each span is
a whole function or class (by qualified name, docstring included) or a run
of lines starting at a given text.

Run from the repository root:  python bench/results/format_owner/format_logic_lines.py
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# (file, span, what it decides). span: "qualname" or ("first line text", lines).
SPANS: list[tuple[str, str | tuple[str, int], str]] = [
    # -- names and layout: none left (snapshots/layout.py calls Rust's
    #    checkpoint_dir_name, parse_checkpoint_dir, file_component,
    #    channel_file_name and sources_schema; the CLI parses ids with them)
    # -- completeness: Rust's scan_listing classifies a listing and
    #    missing_manifest words the error; what is left is which paths a
    #    local listing probes (each checkpoint directory's manifest)
    ("snapshots/backend.py", ("probes = [", 7), "which manifests a local listing probes"),
    # -- chains: a Spark partition's entry gets its chain from Rust
    #    (format_encode_state's chain_at, format::chain_after); left: when a
    #    partition writes a full (the chain bound, docs/format.md full_every)
    (
        "spark/state/partition.py",
        ("if len(base) + 1 > self.root.spec.full_every", 2),
        "chain bound (full_every)",
    ),
    # -- manifest entries, their reading, chains, the export plan: none left
    #    (format_encode_channel / _file / _state, format_summary,
    #    format_state_files, format_channel_files, format_export_plan,
    #    format_build_manifest resolving chains through manifest_of)
    # -- retention and verification: the rules and their driving are Rust's
    #    (retention_of_root, verify_with, plan_verify_with); left: the
    #    deletion order, and the verifier's per-checkpoint status
    ("snapshots/writer.py", ("# Manifest first: an interrupted removal", 3), "deletion order"),
    ("snapshots/ops.py", "_Verifier.verify", "partial / unreadable / complete status"),
]

# The Spark helper's own records (acknowledgements, the manifest's "spark",
# "output" and "state" objects, root metadata): docs/format.md "Spark roots",
# written only by Python. Counted apart: not a copy of a Rust rule.
SPARK_LAYER: list[tuple[str, str | tuple[str, int], str]] = [
    ("spark/state/root.py", "StateRoot._ack_name", "acknowledgement name"),
    ("spark/state/root.py", "StateRoot.ack_path", "acknowledgement path"),
    ("spark/state/root.py", "StateRoot.acked", "acknowledgement names"),
    ("spark/state/root.py", "StateRoot.finalize", 'the "spark" record'),
    ("spark/sink/commit.py", "commit_batch", "output entries"),
    ("spark/sink/root.py", "output_files", "output entries"),
    # stage_partition: the Rust encoder writes the files; the staged name
    # and where a file ends (max_file_bytes) are the sink's
    ("spark/sink/staging.py", ('rel = f"{STAGING_DIR}/{target.batch:08d}', 1), "staged file name"),
    ("spark/sink/staging.py", ("    size = 0", 9), "file split at max_file_bytes"),
]


def _span(tree: ast.Module, lines: list[str], span: str | tuple[str, int]) -> int:
    if isinstance(span, tuple):
        text, n = span
        if not any(text in line for line in lines):
            raise SystemExit(f"no line holds {text!r}")
        return n
    node: ast.AST = tree
    for part in span.split("."):
        found = [
            c
            for c in ast.iter_child_nodes(node)
            if isinstance(c, ast.FunctionDef | ast.ClassDef) and c.name == part
        ]
        if not found:
            raise SystemExit(f"no {span}")
        node = found[0]
    assert isinstance(node, ast.FunctionDef | ast.ClassDef) and node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def count(spans: list[tuple[str, str | tuple[str, int], str]]) -> dict[str, int]:
    per_file: dict[str, int] = {}
    for rel, span, _ in spans:
        path = ROOT / "python" / "snapcut" / rel
        source = path.read_text()
        n = _span(ast.parse(source), source.splitlines(), span)
        per_file[rel] = per_file.get(rel, 0) + n
    return per_file


def main() -> int:
    for title, spans in (("format logic", SPANS), ("Spark-layer records", SPARK_LAYER)):
        per_file = count(spans)
        print(f"{title}: {sum(per_file.values())} lines")
        for rel, n in sorted(per_file.items(), key=lambda kv: -kv[1]):
            print(f"  {n:4d}  python/snapcut/{rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
