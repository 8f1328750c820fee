"""The draft's HiCache plan x its device layout on sglang 0.5.23 (docs/draft-layouts.md), through the real data path.

Each case builds the tree's UnifiedRadixCache with the draft where its plan
puts it (PACKED: tail layers of the target host pool; SIDECAR: its own host
pool), writes the draft as its layout has it (STRIPED: through the MLA draft
pool's own ``set_mla_kv_buffer``; REPLICATED: every loc at row = loc), and
after every load-back checks the draft's bytes where its layout keeps them and
where the draft attention's own read path reads them (the forward-read
check). A pair that 0.5.23 does not fit is a strict xfail that only
``DraftRowsWrong`` (the rows HiCache moved are not the rows the check reads;
the message names both) satisfies. The negative controls show that a draft
load-back one row off, and a load byte-exact on rows the read path does not
read, are caught.
"""

from __future__ import annotations

import pytest

from emulation.datapath import matrix, scenarios
from emulation.datapath.harness import DRAFT, DraftRowsWrong, case_from
from emulation.datapath.substitutions import ReferenceOps
from trees import TREE

from .conftest import DRIVEN, plan


def _counted(counts, case) -> None:
    assert counts.load_backs > 0 and counts.tokens_loaded > 0
    # The forward read covered this rank's share of every checked token (all of them for a replicated draft).
    share = 1 if case.draft_layout == "replicated" and case.draft == "mha" else case.dcp_size
    assert counts.tokens_read_checked * share >= counts.tokens_checked > 0, counts


@pytest.mark.parametrize("planned", plan("pairs_round_trip"))
def test_draft_pair_round_trip(planned):
    case = case_from(planned)
    counts = scenarios.round_trip(case)
    assert counts.load_backs == counts.requests > 0
    assert counts.tokens_loaded == counts.tokens_checked == counts.tokens_written
    _counted(counts, case)


@pytest.mark.parametrize("planned", plan("pairs_stress"))
def test_draft_pair_eviction_stress(planned):
    case = case_from(planned)
    counts = scenarios.eviction_stress(case, requests=64)
    assert counts.requests >= 2 * 64 and counts.host_evictions > 0
    _counted(counts, case)


CONTROLS = matrix.draft_control_plan(TREE) if DRIVEN else []


@pytest.mark.skipif(not CONTROLS, reason=f"{TREE}: the draft plan x layout controls run on the sglang 0.5.23 trees")
@pytest.mark.parametrize("control", CONTROLS or [None], ids=[c[0] for c in CONTROLS] or ["none"])
def test_draft_rows_control_is_caught(control):
    name, planned, shift, byte_check = control
    ops = ReferenceOps()
    if shift:  # every copy into the draft device pool lands one row further on
        ops.reroute[f"{DRAFT}/device"] = lambda rows: rows + 1
    with pytest.raises(DraftRowsWrong) as caught:
        scenarios.round_trip(case_from(planned), ops=ops, draft_byte_check=byte_check)
    message = str(caught.value)
    check = "draft buffer 0 differs" if byte_check and shift else "the draft attention's read of draft buffer 0 differs"
    assert check in message and "wrong rows: the load-back wrote draft rows " in message, message
    if not byte_check or not shift:
        assert "the draft attention's read path reads them at rows " in message, message


# The launch each measured pair stands for, as the HiCache gate's facts (passes.draft_host_layout) read it.
GATE_FACTS = {
    ("packed", "striped", "mla"): dict(algorithm="NEXTN", own_layer=True, draft_mla=False, draft_backend=None),
    ("sidecar", "replicated", "mha"): dict(algorithm="EAGLE3", own_layer=False, draft_mla=False, draft_backend=None),
    ("sidecar", "striped", "mla"): dict(algorithm="EAGLE", own_layer=False, draft_mla=True, draft_backend=None),
}


@pytest.mark.parametrize("pair", [p for p in matrix.DRAFT_PAIRS if p[:3] in GATE_FACTS], ids=lambda p: "-".join(p[:3]))
def test_the_hicache_gate_admits_exactly_the_pairs_the_data_path_fits(pair):
    """The gate under DCP + HiCache (the plugin's hook, upstream-next 0020) decides from a launch's facts; each
    decision is the measured verdict of the pair that launch builds (the counterfactual pair no launch builds)."""
    from sglang_dcp_dspark import passes

    plan_, layout, draft, _, fits = pair
    facts = GATE_FACTS[(plan_, layout, draft)]
    assert passes.draft_host_layout(target_backend="flashinfer", **facts) == (plan_.upper(), layout)
    refused = passes.hicache_draft_refusal_of(dcp=8, hicache=True, target_backend="flashinfer", **facts)
    assert (refused is None) == fits, refused
