"""Run the upstream-next suite against one sglang 0.5.23 tree, named by DCP_DSPARK_TREE.

`make test` runs this directory on every tree of patches/trees.json whose
suite is upstream-next, with PYTHONPATH on that tree (`make next-trees`):
- ``next-stock``: sglang 0.5.23 as released. Tests marked ``regression``
  describe the draft-aware budget and the guard, so here they must fail with an
  AssertionError (strict xfail).
- ``next-patched``: a copy with patches/upstream-next applied.
- ``next-plugin``: the stock 0.5.23 tree again, with sglang's load_plugins()
  run first, so the installed dcp_dspark plugin hooks it at run time; it
  carries what 0001-0003 carry (the draft-aware budget, the auto-size fix, the
  guard), so the regression tests of those must pass. What only the series
  has (the sharded backup 0005-0007, the series' own files) is skipped there
  with a one-line "series-only: ..." reason (:func:`series_only`).
Without one of these labels the directory is not collected: the default run
imports sglang 0.5.17, which has no draft sidecar.
"""

from __future__ import annotations

import pytest

from sglang_dcp_dspark import series as series_mod
from sglang_dcp_dspark.core.compat import locate_tree
from tree_table import TREES, trees_testing
from trees import TREE, check_label, expected_state, mark_defects
from trees import expect_fixed as _expect_fixed

SERIES = "upstream-next"
# label -> (the directory the imported sglang must come from, the state the series must be in there),
# both from patches/trees.json
TREE_DIRS = {
    label: (t.path, expected_state(label, SERIES)) for label, t in trees_testing(SERIES).items()
}
# The labels on which the plugin, not the series, fixes the tree (the stock tree, hooked at run time).
PLUGIN_TREES = frozenset({"next-plugin"})
PLUGIN = TREE in PLUGIN_TREES
# What the plugin must have hooked on stock 0.5.23: what patches/upstream-next 0001-0003 change.
PLUGIN_TARGETS = (
    "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler.build_kv_only_stack",
    "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler.build_kv_only_group",
    "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler.build_full_draft_pools",
    "sglang.srt.mem_cache.hicache_auto_size._draft_bytes",
)

if TREE not in TREE_DIRS:
    collect_ignore_glob = ["test_*.py"]


def expect_fixed() -> bool:
    return _expect_fixed(TREE)


def series_only(what: str):
    """Skip on a plugin tree what only the series carries: the plugin does not, by design."""
    return pytest.mark.skipif(PLUGIN, reason=f"series-only: {what}")


def pytest_report_header(config):
    if TREE in TREE_DIRS:
        how = "; the dcp_dspark plugin loaded through load_plugins()" if PLUGIN else ""
        return f"upstream-next run on: {TREE} ({locate_tree(None).describe()}{how})"


@pytest.fixture(scope="session")
def series() -> series_mod.Series:
    return series_mod.load_series(SERIES)


@pytest.fixture(scope="session", autouse=True)
def tree(series):
    """The sglang tree this interpreter imports, checked against the label by path and by series state."""
    want_dir, _ = TREE_DIRS[TREE]
    return check_label(series, want_dir)


def load_plugin_as_a_scheduler_does() -> dict:
    """The modules the hooks patch imported, then sglang's load_plugins() (idempotent); the plugin's findings.

    A 0.5.23 scheduler has its cache modules imported by the time
    run_scheduler_process calls load_plugins(), so the hooks are judged and
    applied there and then, as here.
    """
    from sglang.srt.mem_cache import hicache_auto_size  # noqa: F401
    from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler  # noqa: F401
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang_dcp_dspark import plugin

    return plugin.findings


@pytest.fixture(scope="session", autouse=True)
def _plugin_loaded(tree):
    if not PLUGIN:
        return
    from sglang_dcp_dspark.plugin.hooks.common import Verdict

    findings = load_plugin_as_a_scheduler_does()
    got = {t: findings[t].verdict.value if t in findings else "not judged" for t in PLUGIN_TARGETS}
    # Otherwise every test below would be testing stock 0.5.23 under the plugin's name.
    assert all(v == Verdict.NEEDS_FIX.value for v in got.values()), f"{TREE}: the plugin did not hook stock 0.5.23: {got}"


def pytest_collection_modifyitems(config, items):
    if TREE in TREE_DIRS and not expect_fixed():
        mark_defects(items, "stock sglang 0.5.23 leaves the draft sidecar out of the HiCache budget and has no guard")


def pytest_collection_finish(session):
    # test_plugin_parity.py compares with the series tree's own figures, from one child process: started
    # now, so that its sglang import overlaps the tests before it. Not needed on the series tree itself.
    series_tree = TREES["next-patched"].path
    if (TREE in TREE_DIRS and not session.config.option.collectonly
            and TREE_DIRS[TREE][0].resolve() != series_tree.resolve()
            and any(item.path.name == "test_plugin_parity.py" for item in session.items)):
        from . import parity

        parity.series_child(series_tree)


def pytest_sessionfinish(session, exitstatus):
    import sys

    parity = sys.modules.get(f"{__package__}.parity")
    if parity is not None:
        parity.stop_series_child()
