"""Capacity guard: a draft host pool sized too small stops startup with one error, on every fixed tree."""

from __future__ import annotations

import pytest

from sglang_dcp_dspark import hostpool


@pytest.fixture
def halved_draft_host_pool(monkeypatch):
    """Deliberately wrong sizing: every draft host pool gets half the rows it asks for."""
    from sglang.srt.mem_cache.pool_host import mla

    class HalfDraft(mla.MLATokenToKVPoolHost):
        def __init__(self, device_pool, host_to_device_ratio, *args, **kwargs):
            if kwargs.get("pool_label") == "draft":
                host_to_device_ratio /= 2
            super().__init__(device_pool, host_to_device_ratio, *args, **kwargs)

    # The registration imports the class when it runs, so it builds this one.
    monkeypatch.setattr(mla, "MLATokenToKVPoolHost", HalfDraft)


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
