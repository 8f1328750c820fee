"""hostram: what a judged launch's host pools need, and when the draft's coverage stops startup (at the rule's edge)."""

from __future__ import annotations

import pytest

from sglang_dcp_dspark.core.sizing import HostPoolSize
from sglang_dcp_dspark.preflight import hostram
from sglang_dcp_dspark.preflight.releases import Built, Pinned

TARGET_ROWS, DCP = 2_112, 8


def built(draft_rows: int) -> Built:
    target = HostPoolSize(TARGET_ROWS, TARGET_ROWS * DCP, 64, 70_272, TARGET_ROWS * 70_272)
    draft = HostPoolSize(draft_rows, draft_rows, 64 * DCP, 2_560, draft_rows * 2_560)
    return Built(pools=[Pinned("target KV", "target", "test", target), Pinned("draft", "draft", "test", draft)],
                 draft_plan="SIDECAR")


def judged(draft_rows: int) -> hostram.HostRam:
    return hostram.judge(built(draft_rows), ranks_per_node=8, available=2**50, available_from="test", reserve=0,
                         hicache_size_gb=0, estimated_rows=False)


@pytest.mark.parametrize("short", [1, TARGET_ROWS * DCP // 2])
def test_a_draft_short_of_the_logical_slots_stops_startup(short):
    ram = judged(TARGET_ROWS * DCP - short)
    assert ram.coverage < 1 and len(ram.stops) == 1 and "draft host pool covers" in ram.stops[0]


@pytest.mark.parametrize("extra", [0, 1])
def test_a_draft_at_or_past_every_logical_slot_does_not(extra):
    ram = judged(TARGET_ROWS * DCP + extra)
    assert ram.coverage >= 1 and ram.stops == []
