"""preflight and the plugin on every sglang release of patches/trees.json, each judged by that release's own code.

`make test` runs this directory on every tree whose test_dirs list it (0.5.18,
0.5.19 to 0.5.22, 0.5.23 and 0.5.23 with patches/upstream-next), and the stock
run (0.5.17) takes it too. Each run imports its tree's sglang once
and judges every launch of the matrix in-process.
"""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest

from sglang_dcp_dspark.core.compat import locate_tree
from sglang_dcp_dspark.plugin.switch import SWITCH_ENV, WHITELIST_ENV
from tree_table import TREES
from trees import TREE, imported_tree

RELEASE_TREES = {label for label, t in TREES.items() if "test/releases" in t.test_dirs} | {"stock"}

if TREE not in RELEASE_TREES:
    collect_ignore_glob = ["test_*.py"]


def pytest_report_header(config):
    if TREE in RELEASE_TREES:
        return f"release run on: {TREE} ({locate_tree(None).describe()})"


@pytest.fixture(scope="session", autouse=True)
def release_tree():
    """The imported sglang is the label's tree, at the table's release."""
    row = TREES[TREE]
    tree = imported_tree(row.path)
    assert tree.version == row.sglang, f"DCP_DSPARK_TREE={TREE} expects sglang {row.sglang}, imported {tree.version}"
    return row


@contextlib.contextmanager
def plugin_switches(env: dict[str, str] | None):
    """The plugin switches as an operator's shell has them by default (unset), unless ``env`` sets them."""
    saved = {name: os.environ.pop(name) for name in (WHITELIST_ENV, SWITCH_ENV) if name in os.environ}
    os.environ.update(env or {})
    try:
        yield
    finally:
        for name in (env or {}):
            os.environ.pop(name, None)
        os.environ.update(saved)


def preflight(*argv: str, env: dict[str, str] | None = None) -> tuple[int, dict, str]:
    """``sglang-dcp-dspark preflight --json ARGV`` in this process: exit code, report, stderr.

    The plugin switches are as an operator's shell has them by default (unset), unless ``env`` sets them.
    """
    from sglang_dcp_dspark.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with plugin_switches(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["preflight", "--json", *argv])
    return code, json.loads(out.getvalue()), err.getvalue()


def judge(node: str, argv: list[str], device_rows: int, env: dict[str, str] | None = None) -> tuple[int, dict, str]:
    """One launch judged as ``preflight --gpu-name NODE --device-rows N -- ARGV`` judges it, in this process: its
    exit code, its ``--json`` report and its text report (one judgement serves both)."""
    from sglang_dcp_dspark.core.errors import DcpDsparkError
    from sglang_dcp_dspark.preflight import check, report
    from sglang_dcp_dspark.preflight.launch import Node

    with plugin_switches(env):
        try:
            judged = check.run(list(argv), Node.of_part(node), device_rows)
        except DcpDsparkError as exc:
            return exc.exit_code, {"verdict": {"code": exc.exit_code, "line": str(exc)}}, f"error: {exc}"
    return judged.verdict.code, judged.as_dict(), report.render(judged)
