"""rules: the HiCache budget split, logical-slot coverage and per-node arithmetic, imported without sglang or torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sglang_dcp_dspark.core import rules

T, D = 70_272, 1_152  # host bytes per token: a 61-layer MLA target and a one-layer MLA draft, bf16


def test_the_rule_module_imports_neither_sglang_nor_torch():
    code = "import sys, sglang_dcp_dspark.core.rules; print(__import__('json').dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('sglang', 'torch'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


@pytest.mark.parametrize("dcp", [1, 2, 8])
def test_the_split_buys_dcp_draft_rows_per_target_row_inside_the_budget(dcp):
    budget = 100 * 10**9
    split = rules.BudgetSplit(budget, T, D, dcp, page_size=64)
    assert split.bytes_per_target_row == T + dcp * D
    assert split.draft_rows == split.target_rows * dcp
    assert split.target_share == T / (T + dcp * D)
    # After sglang's page rounding of both pools (the draft page is dcp physical pages wide), still inside.
    target_rows = rules.host_pool_rows(split.target_rows, 64)
    draft_rows = rules.host_pool_rows(split.draft_rows, 64 * dcp)
    assert target_rows * T + draft_rows * D <= budget
    # And nothing more is held back than the rounding: one more row would not be covered by it.
    assert (split.target_rows + 1) * split.bytes_per_target_row > budget - split.rounding_bytes


def test_holding_nothing_back_is_upstream_nexts_split():
    held = rules.BudgetSplit(10**9, T, D, 8, page_size=64)
    bare = rules.BudgetSplit(10**9, T, D, 8, page_size=64, hold_back_rounding=False)
    assert bare.rounding_bytes == 0 and held.rounding_bytes == 64 * (T + 2 * 8 * D)
    assert bare.target_rows == 10**9 // (T + 8 * D)
    assert bare.target_rows - held.target_rows == 10**9 // (T + 8 * D) - (10**9 - held.rounding_bytes) // (T + 8 * D)


def test_pr_35875s_share_misses_the_dcp_factor():
    split = rules.BudgetSplit(10**9, T, D, 8)
    assert split.share_without_dcp == T / (T + D) > split.target_share


def test_a_budget_below_the_rounding_buys_nothing():
    assert rules.BudgetSplit(1, T, D, 8, page_size=64).target_rows == 0


def test_logical_slots_and_coverage():
    assert rules.logical_slots(2112, 8) == 16896
    assert rules.coverage(2560, 16896) == 2560 / 16896
    assert not rules.covers(2560, 16896) and rules.covers(16896, 16896)
    assert rules.host_pool_rows(2048, 64) == 2112 and rules.host_pool_rows(2047, 64) == 2048


@pytest.mark.parametrize(
    "tp,pp,nnodes,ranks",
    [(8, 1, 1, 8), (16, 1, 2, 8), (8, 2, 2, 8), (4, 1, 1, 4), (1, 1, 4, 1)],
)
def test_ranks_per_node(tp, pp, nnodes, ranks):
    assert rules.ranks_per_node(tp, pp, nnodes) == ranks


def test_uneven_layouts_and_nodes_needed():
    assert rules.most_ranks_on_a_node(12, 1, 2) == 6 and rules.most_ranks_on_a_node(9, 1, 2) == 5
    assert rules.nodes_needed(16, 1, 8) == 2 and rules.nodes_needed(9, 1, 8) == 2


def test_per_node_and_the_rank_share_of_free_ram():
    assert rules.per_node(3, 8) == 24
    reserve = 10 * 2**30
    assert rules.rank_share_of_free_ram(reserve + 8 * 1000 + 7, reserve, 8) == 1000
    assert rules.rank_share_of_free_ram(reserve - 1, reserve, 8) == 0
    assert rules.smallest_host_bytes(1000, T, D, 8) == 1000 * (T + 8 * D)


@pytest.mark.parametrize("rows,covered", [(16_895, False), (16_896, True), (16_897, True)])
def test_coverage_at_one_row_short_exactly_full_and_one_over(rows, covered):
    """The rule's edge: one draft row per logical slot, not a share of them."""
    assert rules.covers(rows, 16_896) is covered
