"""cutedsl_mla and trtllm_mla under DCP, by numbers: N ranks merged by sglang's own merge against one rank.

``python -m emulation.mla.decode_dcp`` runs in a child process (Triton's interpreter must be on before Triton is
imported) on this run's tree: 0.5.17 (``stock``) and 0.5.23 (``next-stock``), the two releases whose Blackwell
backends the embedded default runs. Each pass the release serves under DCP must match one rank to 1e-5 (cutedsl_mla's
DECODE and TARGET_VERIFY, eager and CUDA graph; trtllm_mla's DECODE), trtllm_mla's verify must stay a refusal, the
one-rank reference must equal attention written out, and each control must be caught where it applies.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import docblocks

TREE = os.environ.get("DCP_DSPARK_TREE", "stock")
HOMES = ("stock", "next-stock")
pytestmark = pytest.mark.skipif(TREE not in HOMES, reason=f"the Blackwell numbers run on 0.5.17 and 0.5.23 "
                                                          f"(trees {', '.join(HOMES)}), not {TREE}")
REPO = Path(__file__).resolve().parents[2]
BLOCK = {"stock": "blackwell-numbers-base", "next-stock": "blackwell-numbers-next"}
TOLERANCE = 1e-5
# Where each control must be caught: the bound only matters for a verify's several queries, and cute-dsl zeroes an
# empty rank's rows itself under DCP, so only trtllm_mla's decode needs sglang's fixup.
CAUGHT = {"shift-write": {("cutedsl_mla", "TARGET_VERIFY"), ("cutedsl_mla", "DECODE"), ("trtllm_mla", "DECODE")},
          "flipped-bound": {("cutedsl_mla", "TARGET_VERIFY")},
          "lse-base": {("cutedsl_mla", "TARGET_VERIFY"), ("cutedsl_mla", "DECODE"), ("trtllm_mla", "DECODE")},
          "no-fixup": {("trtllm_mla", "DECODE")}}


@functools.cache
def _rows(*args: str) -> list[dict]:
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-m", "emulation.mla.decode_dcp", "--json", *args], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=1500)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_served_pass_matches_one_rank():
    rows = _rows("--cases", "dspark-block7-page64,short-prefixes,no-prefix-key,eagle-chain4-page32",
                 "--dcp", "2,8")
    served = [r for r in rows if r["backend"] == "cutedsl_mla" or (r["pass"] == "DECODE" and TREE != "stock")]
    assert served and {r["mode"] for r in served} == {"eager", "graph"}
    bad = [r for r in served if r["outcome"] != "matches"]
    assert not bad, bad[:3]
    assert max(r["error"] for r in served) <= TOLERANCE


@pytest.mark.skipif(TREE != "stock", reason="0.5.23 has trtllm_mla's DCP decode (#33926)")
def test_trtllm_mla_decode_on_0_5_17_reads_past_the_ranks_cache():
    """0.5.17 predates #33926: trtllm_mla's decode builds its table from the widened locs, whose pages lie past
    the rank's own pool (on a GPU: another request's rows or an illegal access)."""
    rows = _rows("--backends", "trtllm_mla", "--passes", "DECODE", "--cases", "dspark-block7-page64", "--dcp", "2")
    assert rows and all(r["outcome"] == "raises" and "outside a cache" in r["detail"] for r in rows), rows


def test_trtllm_mla_verify_under_dcp_stays_a_refusal():
    rows = _rows("--backends", "trtllm_mla", "--passes", "TARGET_VERIFY", "--cases", "dspark-block7-page64",
                 "--dcp", "2", "--modes", "eager")
    assert rows and all(r["outcome"] == "raises" and r["detail"].startswith("NotImplementedError") for r in rows)


def test_after_a_hicache_load_back():
    rows = _rows("--backends", "cutedsl_mla", "--cases", "after-load-back", "--dcp", "4", "--modes", "eager")
    if TREE == "stock":  # 0.5.17's HiCache moves pages through a controller API the load-back does not drive
        assert all(r["outcome"] == "not-run" for r in rows)
    else:
        assert rows and all(r["outcome"] == "matches" for r in rows), rows


def test_the_reference_is_attention_written_out():
    code = ("from emulation.passmap import harness; harness.prepare()\n"
            "from emulation.mla import decode_dcp as D\n"
            "import json; print(json.dumps([D.one_rank_error(b, p, s) for b in D.BACKENDS for p in D.PASSES "
            "for s in D.SHAPES[:2]]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600,
                         env=dict(os.environ, TRITON_INTERPRET="1"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert max(json.loads(out.stdout.strip().splitlines()[-1])) < 1e-6


def test_each_control_is_caught_where_it_applies():
    caught_where = {c: {w for w in where if TREE != "stock" or w[0] == "cutedsl_mla"} for c, where in CAUGHT.items()}
    rows = _rows("--cases", "short-prefixes,no-prefix-key", "--dcp", "8", "--modes", "eager",
                 "--control", ",".join(CAUGHT))
    for control, where in caught_where.items():
        for backend, pass_name in where:
            mine = [r for r in rows if (r["control"], r["backend"], r["pass"]) == (control, backend, pass_name)]
            assert mine, (control, backend, pass_name)
            caught = [r for r in mine if r["outcome"] != "matches"]
            assert caught, f"{control} not caught on {backend} {pass_name}: {mine}"


def committed(name: str) -> dict:
    """(backend, pass, case, dcp) -> outcome, as the docs' block ``name`` shows it."""
    out = {}
    for line in docblocks.block(name).body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[3].isdigit():
            out[(cells[0], cells[1], cells[2], int(cells[3]))] = cells[4]
    return out


def test_the_docs_numbers_are_this_runs():
    table = committed(BLOCK[TREE])
    rows = _rows("--cases", "dspark-block7-page64,short-prefixes,no-prefix-key,eagle-chain4-page32",
                 "--dcp", "2,8")
    grouped: dict = {}
    for r in rows:
        grouped.setdefault((r["backend"], r["pass"], r["case"], r["dcp"]), set()).add(r["outcome"])
    bad = [f"{key}: table {table.get(key)}, now {'/'.join(sorted(v))}" for key, v in grouped.items()
           if table.get(key) != "/".join(sorted(v))]
    assert not bad, (f"the {BLOCK[TREE]} block is stale: " + "; ".join(bad[:4])
                     + f"; fix: python tools/docblocks.py --write {BLOCK[TREE]}")
