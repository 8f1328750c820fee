"""docs/preflight.md's release table: the embedded default launch, judged by each release's own classes.

One row per release tree of patches/trees.json (stock trees and the one with
patches/upstream-next). Every tree's test run computes its own row in-process
and checks it against the committed table (test_docs.py); ``--write``
recomputes every row, one child process per tree (sglang can be imported only
once per process), and rewrites the table.

    .venv/bin/python test/releases/table.py --write
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import docblocks
from tree_table import TREES

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

NAME = "releases"
HEADER = ("| sglang | judged by (adapter, since) | verdict | draft plan and path | pinned per node | draft coverage |\n"
          "|---|---|---|---|---|---|\n")
# The release trees, in the table's order: one row each (the plugin's run of a tree judges the same code as its stock run).
LABELS = [label for label, t in TREES.items() if ("test/releases" in t.test_dirs or label == "stock")]


def row() -> str:
    """This process's release: the embedded default as preflight judges it (as an operator runs it: plugin on)."""
    import contextlib
    import io

    from sglang_dcp_dspark.__main__ import main

    env = {k: os.environ.pop(k) for k in ("SGLANG_PLUGINS", "SGLANG_ENABLE_DCP_DSPARK_PLUGIN") if k in os.environ}
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = main(["preflight", "--json"])
    finally:
        os.environ.update(env)
    report = json.loads(out.getvalue())
    rel, sizing = report["release"], report["sizing"]
    applied = " + " + ", ".join(rel["series_applied"]) if rel["series_applied"] else ""
    path = sizing["draft_path"].replace(" -> ", " → ")
    per_node = sizing["host_ram"]["needed_per_node"] / 2**30
    return (f"| {rel['sglang']}{applied} | `{rel['adapter']}` ({rel['family_since']}) | {report['verdict']['outcome']} "
            f"(exit {code}) | {sizing['draft_plan']}: `{path}` | {per_node:,.2f} GiB | {sizing['draft_coverage']:.6f} |")


def committed_rows() -> dict[str, str]:
    body = docblocks.block(NAME).body
    return {line.split("|")[1].strip(): line for line in body.splitlines()[2:] if line.startswith("| ")}


def write() -> None:
    rows = []
    for label in LABELS:
        tree = TREES[label]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DCP_DSPARK_TREE")}
        if tree.path is not None:
            env["PYTHONPATH"] = str(tree.path)
        done = subprocess.run([sys.executable, __file__, "--row"], env=env, capture_output=True, text=True, cwd=REPO)
        if done.returncode != 0:
            sys.exit(f"{label}: {done.stderr.strip()[-2000:]}")
        rows.append(done.stdout.strip().splitlines()[-1])
    b = docblocks.block(NAME)
    text = b.doc.read_text(encoding="utf-8")
    head = f"<!-- {NAME}:begin ({b.command}) -->\n"
    start = text.index(head) + len(head)
    end = text.index(f"<!-- {NAME}:end -->", start)
    b.doc.write_text(text[:start] + HEADER + "\n".join(rows) + "\n" + text[end:], encoding="utf-8")
    print(f"rewrote the {NAME} block of {b.doc.relative_to(REPO)} ({len(rows)} releases)")


if __name__ == "__main__":
    if sys.argv[1:] == ["--row"]:
        print(row())
    elif sys.argv[1:] == ["--write"]:
        write()
    else:
        sys.exit("usage: python test/releases/table.py --write")
