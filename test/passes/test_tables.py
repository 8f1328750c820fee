"""The pass map as the package ships it: one compact table per release, fresh, small, and read back whole.

The full map (tools/emulation/passmap/spec_passes.json) is what the generator writes
and test/spec checks against each release's code; these tests hold the
package's tables to it.
"""

from __future__ import annotations

import gzip
import json

import pytest

from emulation.passmap import compact
from sglang_dcp_dspark import passes

FULL = json.loads(compact.FULL.read_text(encoding="utf-8"))
RELEASES = sorted({c["release"] for c in FULL["cases"]}, key=compact._sort_key)
# The package ships what preflight and the plugin judge with; the full detail is a tool's artefact.
MAX_TABLE_BYTES = 200 * 1024


def _as_read(record: dict, drop: tuple[str, ...] = ()) -> dict:
    """A full-map record as the package reads it back: without the fields no judgement reads, nor unset ones."""
    return {k: v for k, v in record.items() if k not in drop and v is not None}


def test_the_tables_are_compacted_from_the_full_map():
    assert compact.stale() == [], "fix: python tools/emulation/passmap/compact.py"


def test_the_package_ships_a_table_per_release_and_under_200_kb():
    shipped = sorted(passes.TABLES.glob(f"*{passes.SUFFIX}"))
    assert [p.name for p in shipped] == [f"{r}{passes.SUFFIX}" for r in RELEASES]
    assert passes.releases() == tuple(RELEASES)
    assert sum(p.stat().st_size for p in passes.TABLES.iterdir()) < MAX_TABLE_BYTES
    assert not (passes.TABLES / "spec_passes.json").exists()


@pytest.mark.parametrize("release", RELEASES)
def test_a_table_reads_back_as_the_full_maps_records_under_dcp(release):
    table = passes.load(release)
    assert table["cases"] == [_as_read(c, ("draft_class",)) for c in FULL["cases"]
                              if c["release"] == release and c["dcp"] > 1]
    assert table["plain"] == [_as_read(r, ("algorithm",)) for r in FULL["plain"] if r["release"] == release and r["dcp"] > 1]
    assert table["verify_fixed"] == [_as_read(r, ("draft_class",)) for r in FULL["verify_fixed"]
                                     if r["release"] == release and r["dcp"] > 1]
    assert table["probes"] == [p for p in FULL["probes"] if p["release"] == release]
    assert table["passes"] == FULL["passes"] and table["plain_passes"] == FULL["plain_passes"]
    # What the table keeps of the dcp-1 baselines, which it leaves out.
    own = [c for c in FULL["cases"] if c["release"] == release]
    assert table["measured"] == any(p["verdict"] != "not-run" for c in own for p in c["passes"].values())
    assert table["case_backends"] == sorted({c["target_backend"] for c in own})


def test_a_release_the_map_does_not_cover_reads_as_empty():
    assert "0.5.16" not in passes.releases() and passes.load("0.5.16")["cases"] == []


def test_a_changed_verdict_makes_its_table_stale(tmp_path):
    """The freshness check can fail: one verdict of one case changed in the full map."""
    full = json.loads(compact.FULL.read_text(encoding="utf-8"))
    tables = tmp_path / "tables"
    compact.write(compact.FULL, tables)
    case = next(c for c in full["cases"] if c["release"] == "0.5.23" and c["dcp"] > 1)
    name, result = next(iter(case["passes"].items()))
    result["verdict"] = "raises" if result["verdict"] != "raises" else "consistent"
    changed = tmp_path / "spec_passes.json"
    changed.write_text(json.dumps(full), encoding="utf-8")
    assert compact.stale(changed, tables) == ["0.5.23.json.gz"]
    compact.write(changed, tables)
    assert compact.stale(changed, tables) == []
    raw = json.loads(gzip.decompress((tables / "0.5.23.json.gz").read_bytes()))
    assert any(row[-1].get(name, [None])[0] == result["verdict"] for row in raw["cases"])
