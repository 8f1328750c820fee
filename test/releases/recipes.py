"""The README's table of what works: per release and node, the headline launch and the change that runs it.

The launch is the README's own (DeepSeek-V3 + DSPARK at --tp 8 --dcp-size 8 with HiCache, no --attention-backend),
judged with the plugin as an operator runs it, on an 8 x H200 and an 8 x B200 node, and beside it preflight's
embedded default (the same launch with --attention-backend cutedsl_mla on 8 x B200: PR #35221's validated shape) and
the same launch with DeepSeek-V3's own MTP layer as draft (--speculative-algorithm NEXTN, no draft path) on 8 x H200,
with and without HiCache. A cell is the verdict as it
is, or, where it does not pass, the change preflight names and the verdict preflight gave that changed launch
(it judges the advice itself). One row per release tree, as docs/preflight.md's release table (``table.py``);
every tree's test run checks its own row (test_docs.py), ``--write`` recomputes them all.

    .venv/bin/python test/releases/recipes.py --write
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

NAME = "recipes"
NODES = ("NVIDIA H200", "NVIDIA B200")
HEADER = ("| sglang | on 8 x H200 | on 8 x B200 | embedded default (8 x B200, cutedsl_mla) | NEXTN on 8 x H200 | "
          "NEXTN on 8 x H200, no HiCache |\n|---|---|---|---|---|---|\n")
LABELS = [label for label, t in TREES.items() if ("test/releases" in t.test_dirs or label == "stock")]


def cell(node: str | None, draft: str = "DSPARK", hicache: bool = True) -> str:
    """The headline launch on ``node``; None: preflight's embedded default (PR #35221's validated shape). ``draft``
    NEXTN: DeepSeek-V3's own MTP layer as draft in DSPARK's place; ``hicache`` False: without
    --enable-hierarchical-cache."""
    import contextlib
    import io

    from sglang_dcp_dspark.__main__ import main
    from sglang_dcp_dspark.preflight.check import DEFAULT_DRAFT, DEFAULT_MODEL

    speculative = (["--speculative-algorithm", "NEXTN"] if draft == "NEXTN" else
                   ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(DEFAULT_DRAFT)])
    argv = ["preflight", "--json", "--gpu-name", node, "--device-rows", "400000", "--", "--model-path",
            str(DEFAULT_MODEL), "--tp", "8", "--dcp-size", "8",
            *(["--enable-hierarchical-cache"] if hicache else []), *speculative]
    if node is None:
        argv = ["preflight", "--json"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(argv)
    verdict = json.loads(out.getvalue())["verdict"]
    advice = verdict["advice"]
    if verdict["code"] == 0 or advice is None:
        return f"as is: {verdict['outcome']} (exit {verdict['code']})"
    return (f"`{advice['change']}`: {'PASSES' if advice['verdict'] == 0 else 'PASSES, UNCHECKED'} (exit {advice['verdict']}); "
            f"as is: {verdict['outcome']} (exit {verdict['code']})")


def row() -> str:
    """This process's release, as an operator runs it (the plugin's switches unset)."""
    env = {k: os.environ.pop(k) for k in ("SGLANG_PLUGINS", "SGLANG_ENABLE_DCP_DSPARK_PLUGIN") if k in os.environ}
    try:
        from sglang_dcp_dspark.core.compat import installed_sglang_version
        from sglang_dcp_dspark.preflight.resolution import applied_series

        applied = applied_series()
        name = installed_sglang_version() + (" + " + ", ".join(applied) if applied else "")
        cells = [cell(node) for node in (*NODES, None)]
        cells += [cell(NODES[0], "NEXTN"), cell(NODES[0], "NEXTN", hicache=False)]
        return f"| {name} | " + " | ".join(cells) + " |"
    finally:
        os.environ.update(env)


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
        sys.exit("usage: python test/releases/recipes.py --write")
