"""patches/trees.json: every tree reads as the table says for every series, and make runs what it lists."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tree_table
from sglang_dcp_dspark import series as series_mod
from sglang_dcp_dspark.core.compat import locate_tree
from sglang_dcp_dspark.series import patching

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("label", [pytest.param(label, marks=[pytest.mark.trees] if t.dir else [])
                                   for label, t in tree_table.TREES.items() if t.dir or label == "stock"])
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


def _make(*args: str) -> list[str]:
    # Under `make test` itself, the parent's flags (a jobserver, -k) must not reach this make.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    result = subprocess.run(["make", "-s", *args], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return result.stdout.splitlines()


TREE_GROUPS = list(dict.fromkeys(t.make_target for t in tree_table.TREES.values() if t.dir))


def test_make_test_starts_every_run_of_the_table_two_at_a_time_longest_first():
    """`make -n test` (nothing is run but the recursive makes' own dry runs) builds every tree, then starts one
    target per run, in -j2."""
    lines = _make("-n", "test")
    builds, start = [line for line in lines if " -j2 " in line]
    assert builds.split()[-len(TREE_GROUPS):] == TREE_GROUPS, builds  # every tree first, then the runs
    targets = [word.removeprefix("test-") for word in start.split() if word.startswith("test-")]
    assert sorted(targets) == sorted(tree_table.RUNS)
    assert targets == [r.label for r in sorted(tree_table.RUNS.values(), key=lambda r: -r.cost_s)]
    runs = [line.split()[-1] for line in lines if "tools/suite.py run " in line]
    assert sorted(runs) == sorted(tree_table.RUNS)


def test_each_run_is_its_trees_pytest_on_the_tables_paths():
    for label, run in tree_table.RUNS.items():
        env = run.env
        assert env["DCP_DSPARK_TREE"] == run.tree.label and ("PYTHONPATH" in env) == bool(run.tree.dir), label
        assert env[tree_table.TREE_FREE_ENV] == ("only" if label == "tree-free" else "skip"), label
        assert run.shell_line().endswith(" ".join(run.test_paths)), label
        if label in tree_table.TREES:
            assert run.test_paths == tree_table.TREES[label].test_dirs
    # A tree is suited by its own run, unless its files are another tree's.
    for label, tree in tree_table.TREES.items():
        assert (label in tree_table.RUNS) != bool(tree.same_files_as), label


def test_every_test_module_is_in_some_run():
    """A test file no run collects would pass unseen: every test_*.py under test/ lies in a run's paths."""
    paths = {p for run in tree_table.RUNS.values() for p in run.test_paths}
    modules = sorted(str(p.relative_to(REPO)) for p in (REPO / "test").rglob("test_*.py"))
    orphans = [m for m in modules if not any(m == p or m.startswith(p.rstrip("/") + "/") for p in paths)]
    assert not orphans, f"{orphans} are in no run of patches/trees.json; fix: add their directory to a run's tests"
    for name in tree_table.TREE_FREE_TESTS:
        assert (REPO / name).is_file(), name


@pytest.mark.trees
def test_a_tree_with_another_trees_files_is_that_tree_byte_for_byte():
    """Not suited twice, so asserted: every file of its sglang package hashes as the other tree's."""
    def digest(root):
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted((root / "sglang").rglob("*")) if p.is_file() and "__pycache__" not in p.parts}

    pairs = [(t, tree_table.TREES[t.same_files_as]) for t in tree_table.TREES.values() if t.same_files_as]
    assert pairs
    for tree, other in pairs:
        for t in (tree, other):
            if not (t.path / "sglang" / "__init__.py").is_file():
                pytest.fail(f"{t.path} is missing; fix: make {t.make_target}")
        mine, theirs = digest(tree.path), digest(other.path)
        assert mine.keys() == theirs.keys(), (tree.label, sorted(mine.keys() ^ theirs.keys())[:5])
        differing = sorted(k for k in mine if mine[k] != theirs[k])
        assert not differing, f"{tree.label} differs from {other.label} in {differing[:5]}; fix: suite it (tests)"


def test_the_tree_free_run_fails_on_a_test_that_imports_sglang(tmp_path):
    # Control: a test that imports sglang, run as the tree-free run runs, fails the run with one named line.
    probe = REPO / "test" / "core" / "test_compat.py"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(DCP_DSPARK_TREE="stock", **{tree_table.TREE_FREE_ENV: "only"})
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(probe)], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout[-2000:]
    assert "error: the tree-free run imported sglang" in result.stderr, result.stderr[-2000:]


def test_make_help_names_every_target_in_one_line_each():
    lines = _make("help")
    named = [line.split()[0] for line in lines if line.strip()]
    for target in ("demo", "test", "check", "lint", "bench", "help", "bench-smoke", "setup", "clean"):
        assert target in named, target
    assert {f"test-{label}" for label in tree_table.RUNS} <= set(named)
    assert all(len(line) <= 100 for line in lines), [line for line in lines if len(line) > 100]
    assert len(named) == len(set(named)), "a target listed twice"
    # every target the Makefile and the rendered include declare has its line
    declared = set()
    for text in ((REPO / "Makefile").read_text(encoding="utf-8"), tree_table.make_include()):
        declared |= {m.group(1) for m in re.finditer(r"^([a-zA-Z][a-zA-Z0-9_.-]*):(?!=)", text, re.M)}
    assert declared <= set(named), sorted(declared - set(named))
