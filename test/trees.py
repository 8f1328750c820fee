"""What the per-tree pytest runs share: the tree label, strict xfails for the defect, and series checks.

`make test` runs pytest once per tree of patches/trees.json (tools/tree_table.py
reads it; tools/suite.py runs each), with PYTHONPATH on that tree and DCP_DSPARK_TREE naming it; each
per-tree conftest checks that the imported sglang is the tree the label names
and that its series read as the table says.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import subprocess
import unittest
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_dcp_dspark import series as series_mod
from sglang_dcp_dspark.core.compat import SglangTree, locate_tree
from sglang_dcp_dspark.series import maintain, patching
from tree_table import BUILD_TREES, TREES

TREE = os.environ.get("DCP_DSPARK_TREE", "stock")
__all__ = ["BUILD_TREES", "TREE", "TREES"]


def load_bench(name: str) -> SimpleNamespace:
    """bench/<name>.py's names, run as a module (the benches are scripts, not a package).

    runpy lends the running file a module of its own while it executes (dataclasses look their module up as they
    are made), and gives it back when done: the names stay, nothing stays registered."""
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    return SimpleNamespace(**runpy.run_path(str(path), run_name=f"bench_{name}"))


def expected_state(label: str, series: str) -> patching.State:
    """The state patches/trees.json says ``series`` reads as on the tree ``label``."""
    return patching.State(TREES[label].expect[series])


def expect_fixed(label: str = TREE) -> bool:
    """False on a tree the table marks ``defect``: there tests marked ``regression`` are strict xfails."""
    return not TREES[label].defect


def check_label(series: series_mod.Series, expected_dir: Path | None) -> SglangTree:
    """The imported sglang, checked to be the run's tree by path and by the table's state of ``series``."""
    found = imported_tree(expected_dir)
    status = patching.inspect(found, series)
    want = expected_state(TREE, series.name)
    assert status.state is want, f"DCP_DSPARK_TREE={TREE} expects {series.name} {want.value}: {status.line()}"
    return found


def mark_defects(items, reason: str) -> None:
    """Tests marked ``regression`` describe the fix: on a tree with the defect each must fail with an AssertionError."""
    defect = pytest.mark.xfail(raises=AssertionError, strict=True, reason=reason)
    for item in items:
        if item.get_closest_marker("regression"):
            item.add_marker(defect)


def imported_tree(expected_dir: Path | None = None) -> SglangTree:
    """The sglang tree this interpreter imports; with ``expected_dir``, checked to be that one."""
    import sglang

    imported = Path(sglang.__file__).resolve().parent.parent
    if expected_dir is not None:
        assert imported == expected_dir.resolve(), (
            f"DCP_DSPARK_TREE={TREE} expects sglang from {expected_dir}, but it is imported from {imported}"
        )
    return locate_tree(imported)


def assert_reexports(series: series_mod.Series, base: SglangTree, tmp_path: Path) -> None:
    """CI's freshness check: git am the series onto ``base``, re-export, and find the committed bytes."""
    repo, out = tmp_path / "repo", tmp_path / "out"
    base_rev = maintain.workbench(base, series, repo)
    written = maintain.export(repo, base_rev, series.name, out_dir=out)
    # Everything in the series' directory but its metadata (config.json, the PR map prs.json): not export products.
    assert sorted(p.name for p in written) == sorted(p.name for p in series.directory.iterdir()
                                                     if p.name not in ("config.json", "prs.json"))
    stale = [p.name for p in written if p.read_bytes() != (series.directory / p.name).read_bytes()]
    assert stale == [], (
        f"{stale} differ from a fresh export; fix: sglang-dcp-dspark workbench --series {series.name} --from "
        f"{base.root} --repo R, then sglang-dcp-dspark export --repo R --base <base commit> --series {series.name}"
    )


def run_upstream_test_file(series: series_mod.Series, test_file: str, out: Path) -> unittest.TestResult:
    """Extract a series' upstream-style test file (git apply of its hunks alone) and run it with unittest."""
    subprocess.run(["git", "init", "-q", str(out)], check=True)
    subprocess.run(["git", "apply", "--include=test/*", *[str(p.path) for p in series.patches]], cwd=out, check=True)
    spec = importlib.util.spec_from_file_location(f"upstream_{Path(test_file).stem}", out / test_file)
    module = importlib.util.module_from_spec(spec)
    # CustomTestCase retries a failing test (with a back-off sleep) in CI; one try is the result.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SGLANG_TEST_MAX_RETRY", "0")
        spec.loader.exec_module(module)
        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromModule(module).run(result)
    return result
