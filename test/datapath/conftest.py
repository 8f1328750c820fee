"""Data-path suite: one sglang tree per run (DCP_DSPARK_TREE), cases from matrix.py, defects as asserted xfails.

`make test` adds this directory to every per-tree pytest run. On a tree with
the defect (matrix.DEFECT_TREES) each case with dcp > 1 is a strict xfail that
only a DraftHostOverflow satisfies: any other error, or a byte mismatch, fails
the run.
"""

from __future__ import annotations

import pytest

from emulation.datapath import matrix
from emulation.datapath.harness import DraftHostOverflow, DraftRowsWrong
from trees import TREE

KNOWN = TREE in matrix.TREES
DRIVEN = KNOWN and bool(matrix.TREES[TREE][1])


# Why a driven tree has no case of a kind (matrix.py plans them).
NONE_PLANNED = {
    "budget": "the --hicache-size round trips run on the sglang 0.5.23 trees",
    "pairs_round_trip": "the draft plan x layout cases run on the sglang 0.5.23 trees",
    "pairs_stress": "the draft plan x layout cases run on the sglang 0.5.23 trees",
}
# What an expected failure must raise, and why (matrix.expected).
XFAILS = {
    "xfail: draft host overflow": (DraftHostOverflow, "the draft host pool is sized from physical rows"),
    "xfail: draft rows wrong": (DraftRowsWrong, "HiCache moves other draft rows than the draft's forward reads"),
}


def plan(kind: str) -> list:
    """Parameters for one scenario on this run's tree; a visible skip where the tree is not driven."""
    if not DRIVEN:
        reason = matrix.NOT_DRIVEN if KNOWN else f"DCP_DSPARK_TREE={TREE} is not in tools/emulation/datapath/matrix.py"
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="not-driven")]
    planned = {"round_trip": matrix.round_trip_plan, "stress": matrix.stress_plan, "negative": matrix.negative_plan,
               "budget": matrix.budget_plan,
               "pairs_round_trip": lambda tree: matrix.draft_pair_plan(tree, "round_trip"),
               "pairs_stress": lambda tree: matrix.draft_pair_plan(tree, "stress")}[kind](TREE)
    if not planned:
        reason = f"{TREE}: {NONE_PLANNED.get(kind, f'no {kind} case is planned for this tree')}"
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="none")]
    params = []
    for p in planned:
        marks = []
        outcome = matrix.expected(TREE, p)
        if outcome.startswith("xfail"):
            raises, why = XFAILS[outcome]
            marks.append(pytest.mark.xfail(raises=raises, strict=True, reason=f"{TREE}: {why}"))
        params.append(pytest.param(p, marks=marks, id=p.id))
    return params


def pytest_report_header(config):
    return f"data path driven on: {TREE} ({'driven' if DRIVEN else 'not driven'})"


@pytest.fixture
def halved_draft_host_pool(monkeypatch):
    """test/conftest.py's fixture, extended to the sidecar path (the hybrid assembler's own class binding)."""
    from emulation.datapath import scenarios

    scenarios.halve_draft_host_pool(monkeypatch)


# The labels whose sglang is hooked by the installed plugin, loaded as a scheduler loads it (patches/trees.json).
PLUGIN_TREES = frozenset({"plugin", "next-plugin"})


@pytest.fixture(scope="session", autouse=True)
def _plugin_loaded():
    if TREE not in PLUGIN_TREES:
        return
    # As sglang's schedulers do: the cache modules imported, then load_plugins() (idempotent per process).
    # 0.5.17 registers the draft in kv_cache_builder; 0.5.23 builds its host pools in the hybrid
    # assembler and auto-sizes them in hicache_auto_size.
    if TREE == "plugin":
        from sglang.srt.mem_cache import kv_cache_builder  # noqa: F401
    else:
        from sglang.srt.mem_cache import hicache_auto_size  # noqa: F401
        from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler  # noqa: F401
    from sglang.srt.plugins import load_plugins

    load_plugins()


def pytest_collection_modifyitems(config, items):
    # An expected DraftHostOverflow (or DraftRowsWrong) is reported as its one-line message: formatting the
    # traceback of each of the 60-odd expected failures costs more than running them.
    # Any other exception keeps pytest's full report.
    for item in items:
        expected = {m.kwargs.get("raises") for m in item.iter_markers("xfail")} & {DraftHostOverflow, DraftRowsWrong}
        if not expected:
            continue
        full = item.repr_failure

        def repr_failure(excinfo, _full=full, _expected=tuple(expected)):
            return excinfo.exconly() if excinfo.errisinstance(_expected) else _full(excinfo)

        item.repr_failure = repr_failure
