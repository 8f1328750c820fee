"""bench/sharded_draft.py on the patched 0.5.23 tree: its fixed-budget gain (meta-device pools, no processes).

Only the ``next-patched`` run can measure it: ``--hicache-draft-backup`` is
patch 0005's, so on ``next-stock`` there is no sharded mode to compare. The
bench's rank groups are the ones test/datapath/test_sharded.py already runs
at dcp 2 and 4; running them again here would cost make test another 10-20 s.
"""

from __future__ import annotations

import pytest

from trees import TREE, load_bench

from .conftest import PLUGIN, series_only

pytestmark = [
    series_only("--hicache-draft-backup sharded is patches/upstream-next 0005-0007, which the plugin does not carry"),
    pytest.mark.skipif(TREE != "next-patched" and not PLUGIN, reason="--hicache-draft-backup is in patches/upstream-next"),
]


@pytest.fixture(scope="module")
def bench():
    return load_bench("sharded_draft")


def test_sharded_backup_gives_the_target_more_rows_at_a_fixed_budget(bench):
    # DeepSeek-V3 at dcp 8 on meta tensors: no processes, about a second once sglang is imported.
    gain = bench.fixed_budget_gain(8)
    assert gain["target_host_rows_sharded"] > gain["target_host_rows_replicated"]
    assert gain["target_tokens_gain_at_fixed_budget"] > 0
    # The sharded draft keeps the target's rows; the replicated one a row per logical slot.
    assert gain["draft_host_rows_at_budget_sharded"] == gain["target_host_rows_sharded"]
    assert gain["draft_host_rows_at_budget_replicated"] == 8 * gain["target_host_rows_replicated"]
