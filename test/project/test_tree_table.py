"""patches/trees.json: every tree reads as the table says for every series, and make runs what it lists."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import tree_table
from sglang_dcp_dspark import series as series_mod
from sglang_dcp_dspark.core.compat import locate_tree
from sglang_dcp_dspark.series import patching

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("label", [label for label, t in tree_table.TREES.items() if t.dir or label == "stock"])
def test_every_series_reads_as_the_table_says_on_every_tree(label):
    """The table's expect column, checked for all series at once (each per-tree run checks only its own)."""
    tree_row = tree_table.TREES[label]
    if tree_row.path is not None and not (tree_row.path / "sglang" / "__init__.py").is_file():
        pytest.fail(f"{tree_row.path} is missing; fix: make {tree_row.make_target}")
    tree = locate_tree(tree_row.path)
    assert tree.version == tree_row.sglang
    got = {name: patching.inspect(tree, series_mod.load_series(name)).state.value for name in tree_table.SERIES}
    assert got == tree_row.expect


def test_the_table_is_whole():
    """Every tree names every series, its test directories exist, and built-from trees are in the table."""
    for tree in tree_table.TREES.values():
        assert set(tree.expect) == set(tree_table.SERIES), tree.label
        assert {patching.State(v) for v in tree.expect.values()}, tree.label
        assert all((REPO / d).is_dir() for d in tree.test_dirs), tree.test_dirs
        source = tree.build.get("from")
        assert source is None or source in tree_table.TREES, tree.label
        # A release no series is written for runs no series' directory.
        assert tree.suite in tree_table.SERIES or (tree.suite is None and tree.sglang in tree_table.VERSIONS["between"].split()), tree.label
        if tree.build["how"] == "same":
            assert tree.dir == tree_table.TREES[source].dir, tree.label
    for row in tree_table.SERIES.values():
        assert row["reexport_on"] in tree_table.TREES


def test_make_runs_one_pytest_per_tree_of_the_table():
    """`make -n test` (nothing is run) lists exactly the table's runs, in its order."""
    # Under `make test` itself, the parent's flags (a jobserver, -k) must not reach this dry run.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    result = subprocess.run(["make", "-n", "-s", "test"], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    runs = [line for line in result.stdout.splitlines() if line.startswith("DCP_DSPARK_TREE=")]
    assert [r.split()[0].removeprefix("DCP_DSPARK_TREE=") for r in runs] == list(tree_table.TREES)
    for run, tree in zip(runs, tree_table.TREES.values(), strict=True):
        assert run.endswith(" ".join(tree.test_dirs)), run
        assert (f"PYTHONPATH={tree.make_path} " in run) == bool(tree.dir), run
