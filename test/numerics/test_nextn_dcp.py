"""The NextN draft's own passes under DCP on flashinfer MLA, by numbers: N ranks merged by sglang's own merge against
one rank.

``nextn_dcp.py`` runs in a child process (Triton's interpreter must be on before Triton is imported), on this run's
tree, where the fix lives: the plugin's hooks on stock 0.5.23 (``next-stock``) and 0.5.22 (``release-0.5.22``), the
series' code (upstream-next 0017) on 0.5.23 + upstream-next (``next-patched``). With it the draft decode (eager and as
a CUDA graph) and the draft extend match one rank to 1e-5 in every case, after a HiCache load-back too; each control
(an id one row on, a bound one position on) is caught; and on the stock tree without the hooks the draft decode graph
and the draft extend fail at every N > 1, while the eager draft decode, sglang's own DCP decode plan, matches. The
docs' tables (``nextn-numbers-plugin``, ``nextn-numbers-series`` in docs/verify-under-dcp.md) must be this run's.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import docblocks

TREE = os.environ.get("DCP_DSPARK_TREE", "stock")
# The tree label -> how nextn_dcp.py applies the fix there, the DCP widths it runs at (dcp 4 is in the generated
# tables), and the docs block of this tree's numbers.
HOMES = {"next-stock": ("plugin", "2,8", "nextn-numbers-plugin"), "next-patched": ("none", "2,8", "nextn-numbers-series"),
         "release-0.5.22": ("plugin", "8", None)}
pytestmark = pytest.mark.skipif(TREE not in HOMES, reason=f"the NextN draft fix is written for the flashinfer MLA "
                                                          f"backend of sglang 0.5.22 and 0.5.23 (trees "
                                                          f"{', '.join(HOMES)}), not {TREE}")

REPO = Path(__file__).resolve().parents[2]
TOLERANCE, FAILS_OVER = 1e-5, 1e-2
CONTROLS = ("draft-id-off-by-one", "draft-bound-off-by-one")
SHAPES = 7  # tools/emulation/mla/nextn_dcp.py SHAPES: 3 draft decode (eager, graph), 4 draft extend (eager)
ROWS_PER_WIDTH = 3 * 2 + 4
# The controls run at dcp 8 on one shape of each pass; the stock run at this tree's widths on those and after a
# load-back.
CONTROL_CASES = "nextn-decode-page1,nextn-extend-page1"
STOCK_CASES = "nextn-decode-page64,nextn-extend-page64,nextn-decode-after-load-back"


@functools.cache
def _numbers(*args: str) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, str(REPO / "tools" / "emulation" / "mla" / "nextn_dcp.py"), "--json", *args],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=1500)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["runs"]


def _fixed() -> list[dict]:
    fix, widths, _ = HOMES[TREE]
    return _numbers("--fix", fix, "--dcp", widths)["None"]


def _table(rows: list[dict]) -> str:
    return "\n".join(f"{r['case']} dcp {r['dcp']} {r['mode']}: {r['outcome']} {r.get('error', r.get('detail', ''))}"
                     for r in rows)


def test_the_nextn_draft_passes_match_one_rank_with_the_fix():
    rows = _fixed()
    assert len(rows) == ROWS_PER_WIDTH * len(HOMES[TREE][1].split(","))
    assert {r["pass"] for r in rows} == {"draft-decode", "draft-extend"}
    assert {r["mode"] for r in rows if r["pass"] == "draft-decode"} == {"eager", "graph"}
    bad = [r for r in rows if r["outcome"] != "matches" or r["error"] > TOLERANCE]
    assert not bad, _table(bad)


@pytest.mark.parametrize("control", CONTROLS)
def test_each_control_is_caught(control):
    rows = _numbers("--fix", HOMES[TREE][0], "--dcp", "8", "--cases", CONTROL_CASES, "--control", control)[control]
    assert {r["pass"] for r in rows} == {"draft-decode", "draft-extend"}
    missed = [r for r in rows if r["outcome"] == "matches" or r.get("error", 1.0) <= FAILS_OVER]
    assert not missed, f"control {control} not caught:\n{_table(missed)}"


def test_stock_reads_other_rows_in_the_graph_and_the_extend_but_not_in_the_eager_decode():
    """The same tree without the hooks: the map's wrong-rows cells, by numbers, and its consistent one."""
    fix, widths, _ = HOMES[TREE]
    if fix != "plugin":
        pytest.skip("the series' own code carries the fix on this tree")
    rows = _numbers("--fix", "none", "--dcp", widths, "--cases", STOCK_CASES)["None"]
    broken = [r for r in rows if r["pass"] == "draft-extend" or r["mode"] == "graph"]
    eager = [r for r in rows if r["pass"] == "draft-decode" and r["mode"] == "eager"]
    assert broken and eager
    passed = [r for r in broken if r["outcome"] == "matches" or r.get("error", 1.0) <= FAILS_OVER]
    assert not passed, _table(passed)
    assert all(r["outcome"] == "matches" for r in eager), _table(eager)


# ---------------------------------------------------------------- the docs' table, against this run

ERROR = re.compile(r"\d\.\de[-+]\d\d")


def committed_rows(name: str) -> dict:
    """(case, dcp) -> (outcome, error) as the docs' block ``name`` shows them."""
    out = {}
    for line in docblocks.block(name).body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[3].count("/") == 2 and cells[0] != "case":
            for dcp, error in zip((2, 4, 8), cells[3].split("/"), strict=True):
                found = ERROR.search(error)
                out[(cells[0], dcp)] = ("matches", float(found.group())) if found else (error.strip(), None)
    return out


def stale(committed: dict, fresh: list[dict]) -> list[str]:
    """The rows of ``committed`` this run contradicts: another outcome, or an error past the bound or more than 4x
    off (the last digits of an fp32 error follow the machine's summation order)."""
    grouped: dict = {}
    for r in fresh:
        grouped.setdefault((r["case"], r["dcp"]), []).append(r)
    out = []
    for key, rows in grouped.items():
        outcome = "matches" if all(r["outcome"] == "matches" for r in rows) else rows[0]["outcome"]
        if key not in committed:
            out.append(f"{key}: not in the table")
            continue
        c_outcome, c_error = committed[key]
        if c_outcome != outcome:
            out.append(f"{key}: table {c_outcome}, now {outcome}")
        elif c_error is not None:
            error = max(r["error"] for r in rows)
            if c_error > TOLERANCE or abs(math.log10(c_error / max(error, 1e-12))) > math.log10(4):
                out.append(f"{key}: table error {c_error:.1e}, now {error:.1e}")
    return out


def test_the_docs_table_is_this_runs():
    name = HOMES[TREE][2]
    if name is None:
        pytest.skip("the docs' tables are generated on 0.5.23 (next-stock, next-patched)")
    bad = stale(committed_rows(name), _fixed())
    assert not bad, (f"the {name} block is stale: " + "; ".join(bad[:6])
                     + f"; fix: python tools/docblocks.py --write {name}")


def test_a_stale_table_is_caught():
    committed = {("a", 8): ("matches", 7.2e-07)}
    fresh = [{"case": "a", "dcp": 8, "outcome": "matches", "error": 6.0e-07}]
    assert not stale(committed, fresh)
    assert stale(committed, [{**fresh[0], "error": 4.0e-06}])  # 5x off
    assert stale(committed, [{"case": "a", "dcp": 8, "outcome": "raises"}])
    assert stale({}, fresh)


# ---------------------------------------------------------------- what the draft decode costs a GPU


def _over_budget(rows: list[dict]) -> list[str]:
    """The draft decode's excess over stock's target decode under DCP, rank 0 of dcp 8: a layer may launch 2 more
    kernels and make no more full passes; a replay plans each step backend as stock's decode replay does (its
    native scheduler alone), launching what that replay launches plus the draft kernel's own id build once."""
    by = {r["design"]: r for r in rows}
    target, draft = by["target decode"], by["draft decode"]
    bad = []
    if draft["layer_launches"] > target["layer_launches"] + 2 or draft["layer_full_passes"] > target["layer_full_passes"]:
        bad.append(f"a layer: {draft['layer_kernels']} against {target['layer_kernels']}")
    if draft["replay_plans"] != ["fast"] * draft["backends"]:
        bad.append(f"a replay plans {draft['replay_plans']}")
    if draft["replay_launches"] > draft["backends"] * target["replay_launches"] + 1:
        bad.append(f"a replay launches {draft['replay_launches']} against {target['replay_launches']} per backend")
    return bad


def test_the_draft_decode_costs_what_the_targets_dcp_decode_costs():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, str(REPO / "tools" / "emulation" / "mla" / "nextn_dcp.py"), "--fix",
                          HOMES[TREE][0], "--cost"], capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])["rows"]
    assert [r["design"] for r in rows] == ["target decode", "draft decode"]
    assert not _over_budget(rows), _over_budget(rows)


def test_the_cost_check_fails_on_a_heavier_draft_decode():
    target = {"design": "target decode", "layer_launches": 3, "layer_full_passes": 2, "layer_kernels": [],
              "replay_launches": 34, "replay_plans": ["fast"], "backends": 1}
    fine = {**target, "design": "draft decode", "replay_launches": 69, "replay_plans": ["fast", "fast"], "backends": 2}
    assert not _over_budget([target, fine])
    assert _over_budget([target, {**fine, "layer_launches": 6}])
    assert _over_budget([target, {**fine, "replay_plans": ["full", "full"]}])
    assert _over_budget([target, {**fine, "replay_launches": 70}])
