"""hostram: what a judged launch's host pools need, and when the draft's coverage stops startup (at the rule's edge).

The stops are typed here; their words are the verdict module's (test/preflight/test_verdict.py)."""

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


def judged(draft_rows: int, *, available: int = 2**50, device_rows: int | None = None) -> hostram.HostRam:
    return hostram.judge(built(draft_rows), ranks_per_node=8, available=available, available_from="test", reserve=0,
                         hicache_size_gb=0, device_rows=device_rows)


@pytest.mark.parametrize("short", [1, TARGET_ROWS * DCP // 2])
def test_a_draft_short_of_the_logical_slots_stops_startup(short):
    ram = judged(TARGET_ROWS * DCP - short)
    assert ram.coverage < 1 and [s.kind for s in ram.stops] == ["coverage"] and ram.stops[0].coverage == ram.coverage


@pytest.mark.parametrize("extra", [0, 1])
def test_a_draft_at_or_past_every_logical_slot_does_not(extra):
    ram = judged(TARGET_ROWS * DCP + extra)
    assert ram.coverage >= 1 and ram.stops == ()


def test_pools_the_node_cannot_hold_stop_startup_with_what_they_need_and_what_is_left():
    ram = judged(TARGET_ROWS * DCP, available=1_000)
    assert [s.kind for s in ram.stops] == ["ram"] and ram.stops[0].needed == ram.needed_per_node
    assert ram.stops[0].left == 1_000 and not ram.fits


def test_the_host_and_device_rows_are_kept_for_the_smaller_host_pool_warning():
    ram = judged(TARGET_ROWS * DCP, device_rows=5_000)
    assert (ram.host_rows, ram.device_rows) == (TARGET_ROWS, 5_000) and ram.stops == ()
