"""preflight's figures for ``--hicache-draft-backup``: the pools of the backup the launch names.

On the patched 0.5.23 tree (patches/upstream-next 0005-0007) a launch can
name the sharded draft backup. preflight's pools, its pinned bytes and its RAM
verdict must then be the sharded backup's, not the replicated one it would
build with no flag: one DCP stripe of the draft per rank, so the draft host
pool has the target's rows (the relation bench/sharded_draft.py's fixed-budget
measurement asserts), against dcp times as many replicated.
"""

from __future__ import annotations

import pytest

from sglang_dcp_dspark.preflight import check as preflight
from trees import TREE, load_bench

from .conftest import PLUGIN, series_only

pytestmark = [
    series_only("--hicache-draft-backup sharded is patches/upstream-next 0005-0007, which the plugin does not carry"),
    pytest.mark.skipif(TREE != "next-patched" and not PLUGIN, reason="--hicache-draft-backup is in patches/upstream-next"),
]

ROWS = 100_000


@pytest.fixture(scope="module")
def reports() -> dict:
    out = {}
    for mode in ("replicated", "sharded"):
        launch = [*preflight.default_launch(), "--hicache-draft-backup", mode]
        out[mode] = preflight.run(launch, preflight.default_node(), device_rows=ROWS)  # the default's own node
    return out


def _draft(report):
    return next(p for p in report.sizing.pools if p.role == "draft")


def _target(report):
    return report.sizing.target


def test_the_launch_is_sized_with_the_backup_it_names(reports):
    replicated, sharded = reports["replicated"], reports["sharded"]
    assert replicated.resolved["hicache_draft_backup"] == "replicated"
    assert sharded.resolved["hicache_draft_backup"] == "sharded"
    dcp = sharded.sizing.dcp_size
    # replicated: one draft row per logical slot; sharded: one stripe, the target's rows
    assert _draft(replicated).rows == dcp * _target(replicated).rows
    assert _draft(sharded).rows == _target(sharded).rows
    assert sharded.sizing.host_ram.needed_per_rank < replicated.sizing.host_ram.needed_per_rank
    # the side-by-side figures agree with the pools the verdict is about
    assert sharded.sizing.backups["sharded"].pools == sharded.sizing.pools
    assert replicated.sizing.backups["replicated"].pools == replicated.sizing.pools


def test_the_sharded_figure_is_the_benchs(reports):
    """The bench builds the same pools on the meta device at a fixed --hicache-size: its sharded draft keeps the
    target's rows, as preflight's does."""
    gain = load_bench("sharded_draft").fixed_budget_gain(8)
    assert gain["draft_host_rows_at_budget_sharded"] == gain["target_host_rows_sharded"]
    sharded = reports["sharded"]
    assert _draft(sharded).rows / _target(sharded).rows == (
        gain["draft_host_rows_at_budget_sharded"] / gain["target_host_rows_sharded"])
