"""This tree's HiCache host rows and auto-size estimate equal, exactly, the series' own (patches/upstream-next applied).

At test_budget.py's full scale (61 target layers, a one-layer draft, 500k
device rows), at dcp 1, 2, 4 and 8 and --hicache-size 0.05, 1 and 100 GB,
the target host pool and the draft sidecar built by sglang's own
``build_kv_only_stack`` and ``build_full_draft_pools`` in this process have
the rows the series tree builds, and sglang's auto-size estimate is the
series' at each dcp. The series' figures come from the series tree itself:
one child process with PYTHONPATH on it (parity.py), all cases at once,
JSON back. On ``next-plugin`` this holds through the plugin's hooks; on
``next-patched`` the tree is the series (the child is not needed); on
``next-stock`` the rows differ, a strict xfail.
"""

from __future__ import annotations

import pytest

from tree_table import TREES
from trees import imported_tree

from . import parity

SERIES_TREE = TREES["next-patched"].path  # 0.5.23 + patches/upstream-next


def in_the_series_tree() -> bool:
    return imported_tree().root.resolve() == SERIES_TREE.resolve()


@pytest.fixture(scope="session")
def figures() -> tuple[dict, dict]:
    """(the series' figures, this process's), each parity.figures()."""
    here = parity.figures()
    if in_the_series_tree():
        return here, here
    # Started by conftest when this file was collected; started here if it was not.
    return parity.series_child(SERIES_TREE).figures(), here


def _first_difference(series: dict, here: dict, what: str) -> str | None:
    assert series.keys() == here.keys(), f"{what}: cases differ: {sorted(series)} vs {sorted(here)}"
    for case, want in series.items():
        if here[case] != want:
            return f"{what} first differs at {case}: the series {want}, this tree {here[case]}"
    return None


@pytest.mark.regression
def test_target_and_draft_host_rows_are_the_series(figures):
    series, here = figures
    # [target host rows, draft host rows] per case.
    difference = _first_difference(series["rows"], here["rows"], "[target, draft] host rows")
    assert difference is None, difference
    assert len(here["rows"]) == len(parity.DCP_SIZES) * len(parity.BUDGETS_GB)


@pytest.mark.regression
def test_auto_size_estimate_is_the_series(figures):
    series, here = figures
    difference = _first_difference(series["estimate"], here["estimate"], "auto-size estimate (bytes per unit of ratio)")
    assert difference is None, difference
