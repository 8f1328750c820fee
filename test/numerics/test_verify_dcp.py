"""The target verify under DCP on flashinfer MLA, by numbers: N ranks merged by sglang's own merge against one rank.

``verify_dcp.py`` runs in a child process (Triton's interpreter must be on before Triton is imported), on this
run's tree. Where the fix lives on each tree: the plugin's hooks on stock 0.5.23 (``next-stock``) and 0.5.22
(``release-0.5.22``), the series' code on 0.5.23 + upstream-next (``next-patched``). On both, every case must match
one rank to 1e-5, the split must hand the kernel at most 1.2x the KV the ranks hold where the prefixes are in the
thousands, each control must be caught, and the kernel check must pass the oracle and stop each broken kernel, called
alone and at the backend's first verify; on the stock tree without the hooks every case with N > 1 must fail. The
map's readings of the verify with the fix (``python -m emulation.passmap --fix``) and the docs' numbers tables
(``verify-numbers-*`` in docs/verify-under-dcp.md, ``verify-pr-numbers`` in docs/upstreaming.md) must be fresh on
the tree that carries it.
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
# The tree label -> how verify_dcp.py applies the fix there, the passmap --fix name of its readings, the DCP
# widths the fix runs at (the narrowest and widest on 0.5.23, for the plugin's hooks and the series; the widest on
# 0.5.22, the plugin's hooks on the same code; dcp 4 is in the generated tables), and the docs blocks whose numbers
# it checks.
HOMES = {"next-stock": ("plugin", "plugin", "2,8", ("verify-numbers-plugin",)),
         "next-patched": ("none", "upstream-next", "2,8", ("verify-numbers-series", "verify-pr-numbers")),
         "release-0.5.22": ("plugin", "plugin", "8", ())}
pytestmark = pytest.mark.skipif(TREE not in HOMES, reason=f"the verify fix is written for the flashinfer MLA backend "
                                                          f"of sglang 0.5.22 and 0.5.23 (trees {', '.join(HOMES)}), "
                                                          f"not {TREE}")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TOLERANCE, STOCK_FAILS_OVER, KV_RATIO_BOUND = 1e-5, 1e-2, 1.2
CONTROLS = ("shift-write", "all-ids", "bottom-right", "window-off-by-one")
SHAPES = 11
LONG = ("long-prefixes-page1", "long-prefixes-page64", "long-prefixes-eagle")
# The controls run eager at dcp 8 on prefixes shorter than N (ranks that hold no key of a request); the fix runs
# on every shape at this tree's widths, eager and graph, in the same process.
CONTROL_CASES = "short-prefixes"


def _run(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=1500)


@functools.cache
def _numbers(*args: str) -> dict:
    out = _run(str(REPO / "tools" / "emulation" / "mla" / "verify_dcp.py"), "--json", *args)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _fixed_and_controls() -> dict:
    fix, _, widths, _ = HOMES[TREE]
    return _numbers("--fix", fix, "--dcp", widths, "--control", ",".join(("none", *CONTROLS)),
                    "--control-cases", CONTROL_CASES, "--control-dcp", "8", "--control-modes", "eager")["runs"]


def _table(rows: list[dict]) -> str:
    return "\n".join(f"{r['case']} dcp {r['dcp']} {r['mode']}: {r['outcome']} {r.get('error', r.get('detail', ''))}"
                     for r in rows)


def test_the_fixed_verify_matches_one_rank_in_every_case():
    widths = HOMES[TREE][2]
    rows = _fixed_and_controls()["None"]
    assert len(rows) == SHAPES * len(widths.split(",")) * 2  # shapes x widths x eager and graph
    bad = [r for r in rows if r["outcome"] != "matches" or r["error"] > TOLERANCE]
    assert not bad, _table(bad)


def test_the_split_hands_the_kernel_what_the_ranks_hold_on_long_prefixes():
    """KV tokens handed to the kernel, all ranks, filler slots included, over the tokens they hold: at most 1.2x
    where the prefixes are in the thousands (the per-row design handed 7x at dcp 8, DSpark block 7)."""
    rows = [r for r in _fixed_and_controls()["None"] if r["case"] in LONG and r["dcp"] == 8]
    assert {r["mode"] for r in rows} == {"eager", "graph"} and {r["case"] for r in rows} == set(LONG)
    over = [r for r in rows if r["kv_handed"] > KV_RATIO_BOUND * r["kv_held"]]
    assert not over, [(r["case"], r["mode"], r["kv_handed"], r["kv_held"]) for r in over]


def test_each_control_is_caught():
    runs = _fixed_and_controls()
    for name in CONTROLS:
        rows = runs[name]
        assert rows, name
        missed = [r for r in rows if r["outcome"] == "matches" or r.get("error", 1.0) <= STOCK_FAILS_OVER]
        assert not missed, f"control {name} not caught:\n{_table(missed)}"


def test_stock_fails_every_case_with_more_than_one_rank():
    fix, _, widths, _ = HOMES[TREE]
    if fix != "plugin":
        pytest.skip("the series' own code carries the fix on this tree")
    rows = _numbers("--fix", "none", "--dcp", widths)["runs"]["None"]
    passed = [r for r in rows if r["outcome"] == "matches" or r.get("error", 1.0) <= STOCK_FAILS_OVER]
    assert not passed, _table(passed)


def test_the_kernel_check_passes_the_oracle_and_stops_each_broken_kernel():
    """Called alone and at the backend's first verify under DCP (its wrapper the kernel under test): the oracle
    passes and the verify runs; each broken kernel stops in one line naming the assumption it breaks."""
    fix = HOMES[TREE][0]
    kernels = _numbers("--kernel-check", "--fix", fix)["kernels"]
    assert kernels["oracle"] == {"check": "passes", "verify": "runs"}, kernels["oracle"]
    for kernel, assumption in (("lse-base-e", "lse-base"), ("drops-empty-row", "rows"),
                               ("split-kv-unweighted", "split-kv"), ("stale-replay", "replay")):
        found = kernels[kernel]
        assert found["check"] == f"stops: {assumption}", (kernel, found)
        assert "\n" not in found["message"] and "--dcp-size 1" in found["message"], found["message"]
        assert assumption in found["verify"] and "cannot run on this kernel" in found["verify"], (kernel, found)


# What one layer's verify attention may cost beyond stock's verify at dcp 1, counted through the backend's forward
# on rank 0 at dcp 8 (tools/emulation/mla/launches.py): its second flashinfer run and the on-rank merge.
EXTRA_LAUNCHES, EXTRA_PASSES = 3, 2


def _cost(control: str) -> list[dict]:
    fix = HOMES[TREE][0]
    return _numbers("--cost", "--fix", fix, "--control", control)["rows"]


def _over_budget(rows: list[dict]) -> list[str]:
    """Each split row's excess over stock's at the same case, and any replay that makes a full plan()."""
    stock = {r["case"]: r for r in rows if r["design"] == "stock"}
    bad = []
    for r in rows:
        if r["design"] != "split":
            continue
        base = stock[r["case"]]
        if r["launches"] > base["launches"] + EXTRA_LAUNCHES or r["full_passes"] > base["full_passes"] + EXTRA_PASSES:
            bad.append(f"{r['case']} {r['mode']}: {r['launches']} launches, {r['full_passes']} full passes against "
                       f"stock's {base['launches']} and {base['full_passes']}: {' '.join(r['kernels'])}")
        if "full" in r.get("replay_plans", []):
            bad.append(f"{r['case']} {r['mode']}: a replay makes a full plan() ({r['replay_plans']})")
    return bad


def test_one_layers_verify_costs_at_most_two_launches_and_two_passes_more_than_stocks():
    """DSPARK and EAGLE, eager at page 1 and a graph replay at page 64, rank 0 of dcp 8: the split's layer launches at
    most stock's dcp-1 verify + 3 kernels and makes at most 2 more full passes over the output, and its replay plans
    each wrapper with the native scheduler alone, as stock's replay does, never with flashinfer's full plan()."""
    rows = _cost("none")
    assert {(r["algorithm"], r["mode"]) for r in rows} == {(a, m) for a in ("DSPARK", "EAGLE") for m in ("eager",
                                                                                                        "graph")}
    assert not _over_budget(rows), _over_budget(rows)
    replays = [r["replay_plans"] for r in rows if r["mode"] == "graph" and r["design"] == "split"]
    assert replays and all(plans == ["fast", "fast"] for plans in replays), replays


@pytest.mark.parametrize("control", ["unfused-merge", "full-replan"])
def test_the_cost_check_fails_on_the_split_as_it_first_shipped(control):
    """The same check on the merge built from torch ops and merge_state, and on a replay that calls plan()."""
    assert _over_budget(_cost(control))


def test_the_maps_readings_of_the_fixed_verify_are_fresh():
    _, fix, _, _ = HOMES[TREE]
    out = _run("-m", "emulation.passmap", "--fix", fix, "--check")
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]


# ---------------------------------------------------------------- the docs' numbers, against this run

ERROR = re.compile(r"\d\.\de[-+]\d\d")


def committed_rows(name: str) -> dict:
    """(case, dcp) -> (outcome, [errors], [KV ratios]) as the docs' block ``name`` shows them. The full table has a
    row per case and N; the PR's a row per case, with the errors at N = 2 / 4 / 8 and the ratio at N = 8."""
    out = {}
    for line in docblocks.block(name).body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[1].isdigit():
            out[(cells[0], int(cells[1]))] = (cells[2], ERROR.findall(cells[3]), re.findall(r"[\d.]+x", cells[4]))
        elif len(cells) == 4 and cells[2].count("/") == 2 and cells[0] != "case":
            for dcp, error in zip((2, 4, 8), cells[2].split("/"), strict=True):
                out[(cells[0], dcp)] = ("matches" if ERROR.search(error) else error.strip(), ERROR.findall(error),
                                        re.findall(r"[\d.]+x", cells[3]) if dcp == 8 else [])
    return out


def fresh_rows() -> dict:
    grouped: dict = {}
    for r in _fixed_and_controls()["None"]:
        grouped.setdefault((r["case"], r["dcp"]), []).append(r)
    return {key: ("matches" if all(r["outcome"] == "matches" for r in rows) else rows[0]["outcome"],
                  [r["error"] for r in rows], [f"{r['kv_handed'] / r['kv_held']:.2f}x" for r in rows])
            for key, rows in grouped.items()}


def stale(committed: dict, fresh: dict) -> list[str]:
    """The rows of ``committed`` this run contradicts: another outcome, another KV ratio, or an error past the bound
    or more than 4x off (the last digits of an fp32 error follow the machine's summation order, so a table is not
    held to them)."""
    out = []
    for key, (outcome, errors, ratios) in fresh.items():
        if key not in committed:
            out.append(f"{key}: not in the table")
            continue
        c_outcome, c_errors, c_ratios = committed[key]
        if c_outcome != outcome or (c_ratios and set(c_ratios) != set(ratios)):
            out.append(f"{key}: table {c_outcome} {c_ratios}, now {outcome} {sorted(set(ratios))}")
        for c in c_errors if errors else ():  # a run that raised has no error to hold the table to
            if float(c) > TOLERANCE or abs(math.log10(float(c) / max(max(errors), 1e-12))) > math.log10(4):
                out.append(f"{key}: table error {c}, now {max(errors):.1e}")
    return out


def test_the_docs_numbers_are_this_runs():
    names = HOMES[TREE][3]
    if not names:
        pytest.skip("the docs' tables are generated on 0.5.23 (next-stock, next-patched)")
    fresh = fresh_rows()
    for name in names:
        bad = stale(committed_rows(name), fresh)
        assert not bad, (f"the {name} block is stale: " + "; ".join(bad[:6])
                         + f"; fix: python tools/docblocks.py --write {name}")


def test_a_stale_table_is_caught():
    committed = {("a", 8): ("matches", ["7.2e-07"], ["1.02x"])}
    assert not stale(committed, {("a", 8): ("matches", [6.0e-07], ["1.02x"])})
    assert stale(committed, {("a", 8): ("matches", [6.0e-07], ["1.10x"])})  # another ratio
    assert stale(committed, {("a", 8): ("matches", [4.0e-06], ["1.02x"])})  # 5x off
    assert stale(committed, {("a", 8): ("raises", [], [])})
