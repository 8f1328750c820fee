"""Capacity guard: a draft host pool sized too small stops startup with one error, on every fixed tree."""

from __future__ import annotations

import pytest

import hostpool


@pytest.mark.regression
@pytest.mark.parametrize("dcp", [1, 4])
def test_wrong_draft_sizing_stops_registration(halved_draft_host_pool, dcp):
    try:
        pair = hostpool.build_pools(hostpool.Geometry(dcp))
    except Exception as exc:  # the plugin raises DraftHostPoolTooSmall, patch 0003 a RuntimeError
        message = str(exc)
    else:
        raise AssertionError(
            f"registration accepted a {pair.draft_host_pool.size}-row draft host pool for "
            f"{pair.target_host_pool.logical_size} logical slots"
        )
    assert "\n" not in message
    assert message.startswith("draft HiCache host pool has ") and f"dcp_size {dcp}" in message
    assert "logical slots" in message and "sglang-dcp-dspark apply" in message
