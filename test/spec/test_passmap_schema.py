"""The pass map's committed file (tools/emulation/passmap/spec_passes.json) has the shape its readers expect: every
case, plain record, probe and verify-with-the-fix record, on every mapped release.

It reads the committed file alone, no sglang tree: make test runs it once, in the tree-free run (patches/trees.json's
tree_free). test_passmap.py checks the file fresh on each mapped tree.
"""

from __future__ import annotations

import json
from pathlib import Path

from sglang_dcp_dspark.plugin import hooks
from tree_table import TREES, VERSIONS

DATA = Path(__file__).resolve().parents[2] / "tools" / "emulation" / "passmap" / "spec_passes.json"
# The releases the map is generated on: 0.5.17 (the stock run) and the trees patches/trees.json runs test/spec on.
MAP_TREES = tuple(label for label, t in TREES.items() if label == "stock" or "test/spec" in t.test_dirs)


def _version(release: str) -> tuple[int, ...]:
    return tuple(map(int, release.split(".")))


MAPPED = sorted({TREES[label].sglang for label in MAP_TREES}, key=_version)


def test_schema() -> None:
    data = json.loads(DATA.read_text(encoding="utf-8"))
    assert data["passes"] == ["EXTEND", "DRAFT_DECODE_GRAPH", "DRAFT_DECODE_EAGER", "DRAFT_EXTEND",
                              "TARGET_VERIFY_GRAPH", "TARGET_VERIFY_EAGER"]
    keys = {"release", "algorithm", "draft_class", "draft_kind", "target_backend", "draft_backend",
            "draft_backend_flag", "target_kind", "dcp", "rank", "passes"}
    verdicts = {"consistent", "wrong-rows", "wrong-output", "raises", "not-admitted", "not-run"}
    for case in data["cases"]:
        assert set(case) == keys
        assert case["target_kind"] == "mla"
        if case["algorithm"] == "NEXTN":
            assert case["draft_backend_flag"] is None
        for name in data["passes"]:
            p = case["passes"][name]
            assert p["verdict"] in verdicts and p["after_hicache"]["verdict"] in verdicts
            assert p["detail"] and p["where"]
    assert {r["release"] for r in data["probes"]} == {c["release"] for c in data["cases"]}
    # the non-speculative passes, on every release the speculative ones are mapped on
    assert data["plain_passes"] == ["EXTEND", "DECODE_EAGER", "DECODE_GRAPH"]
    assert {r["release"] for r in data["plain"]} == {c["release"] for c in data["cases"]}
    for record in data["plain"]:
        assert set(record) == {"release", "algorithm", "target_backend", "target_kind", "dcp", "rank", "passes"}
        assert record["algorithm"] is None and record["target_kind"] == "mla"
        assert list(record["passes"]) == data["plain_passes"]
        for p in record["passes"].values():
            assert p["verdict"] in verdicts and p["detail"] and p["where"]
    for probe in data["probes"]:
        assert set(probe) == {"release", "probe", "verdict", "detail", "where"}
        assert probe["verdict"] in verdicts and probe["detail"] and probe["where"]
    # the verify with the fix (python -m emulation.passmap --fix): flashinfer MLA's TARGET_VERIFY passes, under DCP only, on the
    # releases and carriers the fix is written for
    since = _version(hooks.VERIFY_FIX_SINCE)
    assert {(r["release"], r["fix"]) for r in data["verify_fixed"]} == {
        *((release, "plugin") for release in MAPPED if _version(release) >= since),
        (VERSIONS["next"], "upstream-next")}
    for record in data["verify_fixed"]:
        assert set(record) == {"release", "fix", "algorithm", "draft_class", "draft_backend_flag", "dcp", "rank",
                               "passes"}
        # and NEXTN's draft decode graph and draft extend, which the fix plans under DCP too
        nextn_draft = ["DRAFT_DECODE_GRAPH", "DRAFT_EXTEND"] if record["algorithm"] == "NEXTN" else []
        assert record["dcp"] > 1 and list(record["passes"]) == ["TARGET_VERIFY_GRAPH", "TARGET_VERIFY_EAGER",
                                                                *nextn_draft]
        for p in record["passes"].values():
            assert p["verdict"] in verdicts and p["after_hicache"]["verdict"] in verdicts and p["detail"] and p["where"]
