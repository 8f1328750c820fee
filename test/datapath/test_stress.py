"""Eviction stress: 64 shared-prefix requests, repeated L1 evict/load cycles until the host pool itself wraps, every load-back byte-exact."""

from __future__ import annotations

import pytest

from emulation.datapath import scenarios
from emulation.datapath.harness import case_from

from .conftest import plan


@pytest.mark.parametrize("planned", plan("stress"))
def test_eviction_stress_is_byte_exact(planned):
    counts = scenarios.eviction_stress(case_from(planned), requests=64)
    assert counts.requests >= 2 * 64
    assert counts.host_evictions > 0 and counts.load_backs > 0
    assert counts.tokens_checked >= counts.tokens_loaded > 0
