"""docs/draft-layouts.md's table is what layouts.py measures on stock sglang 0.5.23, and its key facts hold.

The probe runs once, in a subprocess, since it needs Triton's interpreter
switched on before sglang is imported (this session imports sglang with
Triton as it is). Only on ``next-stock``: the table is stock 0.5.23's, and
the other trees that run this directory are other releases, or 0.5.23 with
the series or the plugin, whose table would differ.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import docblocks
from emulation.datapath import layouts
from tree_table import TREES
from trees import TREE

TREE_LABEL = "next-stock"
pytestmark = pytest.mark.skipif(
    TREE != TREE_LABEL,
    reason=f"the draft-layouts table is measured on stock sglang 0.5.23 (DCP_DSPARK_TREE={TREE_LABEL}), not {TREE}",
)
MLA_DRAFTS = ("NEXTN (MLA NextN layer)", "EAGLE, external MLA draft")
TRITON_MHA = ("EAGLE3, Llama MHA draft, triton", "EAGLE, external MHA draft, triton")
DSPARK_DENSE = "DSPARK, dense DSparkDraftModel, fa3/flashinfer"
PLAIN_MHA = ("EAGLE3, Llama MHA draft, fa3/flashinfer", "EAGLE, external MHA draft, fa3/flashinfer", DSPARK_DENSE)
COUNTERFACTUAL = ("counterfactual: NEXTN, draft pool dcp_replicated=True",)


@pytest.fixture(scope="module")
def measured() -> dict:
    """``layouts.py --json`` on the next-stock tree, with the plugin's switches off as docblocks runs commands."""
    env = dict(os.environ, PYTHONPATH=str(TREES[TREE_LABEL].path), PYTHONWARNINGS="ignore")
    for name in ("SGLANG_PLUGINS", "SGLANG_ENABLE_DCP_DSPARK_PLUGIN", "DCP_DSPARK_TREE"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, str(docblocks.REPO / "tools" / "emulation" / "datapath" / "layouts.py"), "--json"],
                          cwd=docblocks.REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"layouts.py --json exited {proc.returncode}: {proc.stderr.strip()[-2000:]}"
    return json.loads(proc.stdout)


def rows(measured: dict, *labels: str) -> list[dict]:
    found = [r for r in measured["rows"] if not labels or r["launch"] in labels]
    assert found, f"no rows for {labels}"
    return found


def test_committed_table_is_fresh(measured):
    assert layouts.committed_table() == measured["table"], (
        "docs/draft-layouts.md's table is stale; fix: PYTHONPATH=build/trees/sglang-0.5.23 "
        ".venv/bin/python tools/emulation/datapath/layouts.py --write"
    )
    docblocks.check("draft-layouts", measured["table"])


def test_every_launch_at_every_dcp_on_both_end_ranks(measured):
    for launch in layouts.launches():
        got = sorted(r["dcp"] for r in rows(measured, launch.label))
        assert got == sorted(launch.dcp_sizes), launch.label
    for row in rows(measured):
        assert [r["rank"] for r in row["ranks"]] == sorted({0, row["dcp"] - 1}), (row["launch"], row["dcp"])


def test_plans(measured):
    """NEXTN (EAGLE + num_nextn_predict_layers) packs; EAGLE3, external EAGLE drafts and DSPARK get a sidecar."""
    for row in rows(measured):
        want = "PACKED" if row["launch"].startswith(("NEXTN", "counterfactual: NEXTN")) else "SIDECAR"
        assert row["plan"] == want, (row["launch"], row["dcp"], row["plan"])
    assert {r["algorithm"] for r in rows(measured, MLA_DRAFTS[0])} == {"EAGLE"}  # NEXTN aliases EAGLE


def test_gate_admits_only_dspark_under_dcp(measured):
    for row in rows(measured):
        want = "admitted" if row["dcp"] == 1 or "DSPARK" in row["launch"] else "refused"
        assert row["gate"] == want, (row["launch"], row["dcp"])


def test_the_gate_with_the_fix_admits_exactly_the_launches_whose_round_trip_fits(measured):
    """The plugin's hook on the same gate (upstream-next 0020 decides the same) admits a launch under DCP + HiCache
    where its measured round trip fits, and refuses it where the draft's rows come back wrong. The counterfactual
    replicated NextN pool no launch builds: its gate admits the NextN layer, and the plan check at cache build
    stops that pool (test/upstream_next/test_speculative.py)."""
    for row in rows(measured):
        if row["launch"] in COUNTERFACTUAL:
            assert row["gate_fixed"] == "admitted" and not row["fits"], row["launch"]
            continue
        assert (row["gate_fixed"] == "admitted") is row["fits"], (row["launch"], row["dcp"], row["gate_fixed"])
    # And it is a change: stock's gate refuses every one of them under DCP but DSPARK's.
    changed = [r for r in rows(measured) if r["gate"] != r["gate_fixed"] and r["launch"] not in COUNTERFACTUAL]
    assert {r["launch"] for r in changed} == {MLA_DRAFTS[0], *PLAIN_MHA} - {DSPARK_DENSE}, changed


def test_draft_device_pool_spans_the_widened_loc_space(measured):
    for row in rows(measured):
        dcp = row["dcp"]
        assert row["loc_space_scale"] == dcp
        assert (row["pool_rows"], row["pool_page"]) == (layouts.PAGE * layouts.PAGES * dcp, layouts.PAGE * dcp)
    for row in rows(measured, *MLA_DRAFTS):
        assert row["pool_class"] == "MLATokenToKVPool" and row["dcp_replicated"] is False
    for row in rows(measured, *TRITON_MHA, *PLAIN_MHA):
        assert row["pool_class"] == "MHATokenToKVPool"


def test_measured_device_layouts(measured):
    """MLA drafts and MHA drafts on Triton stripe like the target; MHA drafts on fa3/flashinfer replicate."""
    expect = {**dict.fromkeys(MLA_DRAFTS + TRITON_MHA, "striped"), **dict.fromkeys(PLAIN_MHA + COUNTERFACTUAL,
                                                                                    "replicated")}
    for row in rows(measured):
        want = "row = loc" if row["dcp"] == 1 else expect[row["launch"]]
        assert row["layout"] == want, (row["launch"], row["dcp"], row["layout"])
        for rank in row["ranks"]:
            assert rank["read_ok"] is (row["launch"] not in COUNTERFACTUAL), (row["launch"], row["dcp"], rank)


def test_mla_combined_row_door_refuses_under_dcp(measured):
    for row in rows(measured, *MLA_DRAFTS):
        for rank in row["ranks"]:
            assert rank["mla_set_kv_buffer"] == ("writes" if row["dcp"] == 1 else "AssertionError"), row["dcp"]


def test_host_pools_and_their_indices(measured):
    """PACKED: the target's striped host pool, translated indices; SIDECAR: logical_size rows, untranslated."""
    for row in rows(measured):
        dcp, packed = row["dcp"], row["plan"] == "PACKED"
        assert row["host_pool"] == ("MHATokenToKVPoolHost" if row["pool_class"] == "MHATokenToKVPool"
                                    else "MLATokenToKVPoolHost")
        assert row["host_dcp_size"] == (dcp if packed else 1)
        assert row["host_logical"] == row["host_rows"] * row["host_dcp_size"]
        want = "row = slot" if dcp == 1 else "translated" if packed else "untranslated"
        assert {r["backup_indices"] for r in row["ranks"]} == {want}, (row["launch"], dcp)
    # The sidecar holds as many rows as the packed target pool holds logical slots.
    packed = {r["dcp"]: r["host_logical"] for r in rows(measured, MLA_DRAFTS[0])}
    for row in rows(measured, DSPARK_DENSE):
        assert row["host_rows"] == packed[row["dcp"]]


def test_verdicts(measured):
    """Striped + PACKED and replicated + SIDECAR fit; striped + SIDECAR and every counterfactual do not."""
    for row in rows(measured):
        fits = row["dcp"] == 1 or row["launch"] in (MLA_DRAFTS[0], *PLAIN_MHA)
        assert row["fits"] is fits, (row["launch"], row["dcp"], row["verdict"])
        assert (row["verdict"] == "fits") is fits
    for row in rows(measured, *MLA_DRAFTS[1:], *TRITON_MHA):
        if row["dcp"] > 1:
            last = row["ranks"][-1]
            assert last["read_ok"] and not last["restored_ok"] and not last["round_trip_ok"]
            assert "WRONG ROWS" in row["verdict"]
    # A replicated draft packed into the striped target pool: each rank backs up 1/N of the locs.
    for row in rows(measured, COUNTERFACTUAL[0]):
        for rank in row["ranks"]:
            assert rank["backed_up"] * row["dcp"] == rank["locs"] and not rank["restored_ok"]
    # The dense DSPARK draft is written at row = loc on every rank and its sidecar restores those rows.
    for row in rows(measured, DSPARK_DENSE):
        for rank in row["ranks"]:
            assert rank["read_ok"] and rank["restored_ok"] and rank["round_trip_ok"], (row["dcp"], rank)
