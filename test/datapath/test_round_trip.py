"""Round trip through sglang's real HiCache: fill the host pool, evict all of L1, scrub, load back, compare target and draft bytes."""

from __future__ import annotations

import pytest

from emulation.datapath import scenarios
from emulation.datapath.harness import case_from

from .conftest import plan


@pytest.mark.parametrize("planned", plan("round_trip"))
def test_round_trip_is_byte_exact(planned):
    counts = scenarios.round_trip(case_from(planned))
    # Every request went out to host and came back: the comparison covered every token written.
    assert counts.load_backs == counts.requests > 0
    assert counts.tokens_loaded == counts.tokens_checked == counts.tokens_written
