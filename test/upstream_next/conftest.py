"""Run the upstream-next suite against one sglang 0.5.23 tree, named by DCP_DSPARK_TREE.

`make test` runs this directory twice, with PYTHONPATH on a tree that
`make next-trees` builds under build/trees:
- ``next-stock``: sglang 0.5.23 as released. Tests marked ``regression``
  describe the draft-aware budget and the guard, so here they must fail with an
  AssertionError (strict xfail).
- ``next-patched``: a copy with patches/upstream-next applied.
Without one of these labels the directory is not collected: the default run
imports sglang 0.5.17, which has no draft sidecar.
"""

from __future__ import annotations

import pytest
from trees import BUILD_TREES as TREES
from trees import TREE, imported_tree, mark_defects

from sglang_dcp_dspark import series as series_mod
from sglang_dcp_dspark.compat import locate_tree

SERIES = "upstream-next"
# label -> (the directory the imported sglang must come from, the state the series must be in there)
TREE_DIRS = {
    "next-stock": (TREES / "sglang-0.5.23", series_mod.State.APPLICABLE),
    "next-patched": (TREES / "sglang-0.5.23-next", series_mod.State.APPLIED),
}

if TREE not in TREE_DIRS:
    collect_ignore_glob = ["test_*.py"]


def expect_fixed() -> bool:
    return TREE == "next-patched"


def pytest_report_header(config):
    if TREE in TREE_DIRS:
        return f"upstream-next run on: {TREE} ({locate_tree(None).describe()})"


@pytest.fixture(scope="session")
def series() -> series_mod.Series:
    return series_mod.load_series(SERIES)


@pytest.fixture(scope="session", autouse=True)
def tree(series):
    """The sglang tree this interpreter imports, checked against the label by path and by series state."""
    want_dir, want_state = TREE_DIRS[TREE]
    found = imported_tree(want_dir)
    status = series_mod.inspect(found, series)
    assert status.state is want_state, status.line()
    return found


def pytest_collection_modifyitems(config, items):
    if TREE in TREE_DIRS and not expect_fixed():
        mark_defects(items, "stock sglang 0.5.23 leaves the draft sidecar out of the HiCache budget and has no guard")
