"""Speculative decoding under DCP on 0.5.23, judged on the pass map: preflight, upstream-next 0008-0010, the plugin.

preflight names the passes the map shows reading other rows on every tree,
and never says PASSES for them; with the fix (the series or the plugin) the
broken pairs the map ran are refused at argument time in the series' words,
and the verify on flashinfer MLA is planned split under DCP (0012-0013), so
DSPARK and external EAGLE drafts there PASS, naming that fix and its evidence;
so does NEXTN, whose own draft passes the fix plans too (0017-0018).
The plan check (0009, hardening: nothing admits a packed or an EAGLE draft
under DCP + HiCache now) is tested on sglang's own pools with the plugin's
words (:func:`hooks.hybrid_pool_assembler.check_draft_pools`), and the
series' version through its own upstream-style tests (test_upstream_file.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_dcp_dspark import passes
from sglang_dcp_dspark.plugin.switch import SWITCH_ENV, WHITELIST_ENV
from sglang_dcp_dspark.preflight.check import DEFAULT_DRAFT, DEFAULT_MODEL
from trees import TREE

# An external MLA draft: a one-layer DeepSeek-V3-shaped stand-in (test/data).
REPO = Path(__file__).resolve().parents[2]
MLA_DRAFT = str(REPO / "test" / "data" / "deepseek-v3-mla-draft")
DCP8 = ["--model-path", str(DEFAULT_MODEL), "--tp", "8", "--dcp-size", "8", "--enable-hierarchical-cache"]


def preflight(*argv: str, plugin_off: bool = False) -> tuple[int, dict]:
    """preflight --json on this tree, as run: the series' code, the plugin's hooks, or on next-stock sglang alone."""
    from sglang_dcp_dspark.__main__ import main

    saved = {name: os.environ.pop(name) for name in (WHITELIST_ENV, SWITCH_ENV) if name in os.environ}
    if TREE == "next-stock" or plugin_off:
        os.environ[SWITCH_ENV] = "0"  # the installed plugin would fix the tree: stock is judged without it
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = main(["preflight", "--json", "--device-rows", "540000", "--", *argv])
    finally:
        os.environ.pop(SWITCH_ENV, None)
        os.environ.update(saved)
    return code, json.loads(out.getvalue())


HICACHE = ("--enable-hierarchical-cache",)
DSPARK = ("--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(DEFAULT_DRAFT))
FLASHINFER = ("--attention-backend", "flashinfer")


@pytest.mark.parametrize("hicache", [(), HICACHE], ids=["no-hicache", "hicache"])
def test_nextn_at_dcp_8_on_flashinfer_is_judged_on_the_passes_the_launch_runs(hicache):
    """preflight -- --model-path <DeepSeek-V3> --tp 8 --dcp-size 8 [--enable-hierarchical-cache] --speculative-algorithm NEXTN.

    On flashinfer MLA (named: on the emulated H200 sglang would pick fa3): stock 0.5.23 admits it without HiCache
    (BROKEN PASS, exit 5), the line saying what its draft does and the details naming the verify and the draft's
    passes; with HiCache sglang's gate refuses it (exit 1). With the fix (the series' 0012, 0017 and 0020, the
    plugin's hooks) every pass it runs reads this rank's rows, the NextN layer is packed into the target's host
    pool, and it PASSES with and without HiCache.
    """
    code, report = preflight(*DCP8[:-1], *hicache, "--speculative-algorithm", "NEXTN", *FLASHINFER)
    line = report["verdict"]["line"]
    why = " ".join(report["verdict"]["details"])  # the block's details name every pass, broken or consistent
    verdicts = {p["name"]: p["verdict"] for p in report["passes"]["passes"]}
    assert "\n" not in line
    if TREE == "next-stock":
        assert code == (1 if hicache else 5), line
        verify = r"TARGET_VERIFY\w* on flashinfer( \(dcp 8, rank 0\):)? the target reads other tokens' KV"
        assert re.search(verify, why) and "DRAFT_DECODE_GRAPH on flashinfer" in why, why
        if code == 5:  # the line says what the first broken pass does, in an operator's words
            assert line.endswith("under DCP on flashinfer, the draft reads other tokens' KV"), line
        return
    assert set(verdicts.values()) == {"consistent"} and "DRAFT_EXTEND" in verdicts, verdicts
    assert code == 0 and "fixed by" in line, line
    if hicache:
        assert report["sizing"]["draft_plan"] == "PACKED", report["sizing"]["draft_plan"]


@pytest.mark.parametrize("algorithm", ["NEXTN", "EAGLE"])
def test_a_separate_nextn_checkpoint_is_judged_like_the_targets_own_layer(algorithm):
    """The map's cases are found by the draft sglang would run, not by its path: same passes, same verdict where
    both run. On the emulated H200 stock sglang picks fa3 and admits both (a broken pass). The series and the
    plugin pick flashinfer MLA: the target's own layer PASSES there, and a separate MLA checkpoint, whose passes are
    proven with the own layer only, is refused in one line saying so."""
    own_code, own = preflight(*DCP8[:-1], "--speculative-algorithm", "NEXTN")
    code, report = preflight(*DCP8[:-1], "--speculative-algorithm", algorithm, "--speculative-draft-model-path", MLA_DRAFT)
    if TREE == "next-stock":
        assert code == own_code == 5, report["verdict"]["line"]
        assert ([(p["name"], p["verdict"]) for p in report["passes"]["passes"]]
                == [(p["name"], p["verdict"]) for p in own["passes"]["passes"]])
        return
    assert own_code == 0, own["verdict"]["line"]
    assert code == 1 and report["message"] == f"ValueError: {passes.NEXTN_MLA_DRAFT.format(dcp=8, algorithm='EAGLE')}"


@pytest.mark.parametrize("algorithm", ["NEXTN", "EAGLE"])
def test_a_separate_mla_checkpoint_on_flashinfer_reads_as_the_own_layer_and_stays_refused(algorithm):
    """sglang builds the draft's attention from the draft's config: an MLA checkpoint runs on the MLA draft
    backends, as the target's own NextN layer does, and its draft passes read what that layer's read (the map's
    NEXTN case, not the dense EAGLE draft's): wrong rows on stock, this rank's rows with the fix. The series (0018)
    and the plugin refuse it in the same line, which says its passes are proven with the own layer only."""
    own = preflight(*DCP8[:-1], *FLASHINFER, "--speculative-algorithm", "NEXTN")[1]["passes"]["passes"]
    code, report = preflight(*DCP8[:-1], *FLASHINFER, "--speculative-algorithm", algorithm,
                             "--speculative-draft-model-path", MLA_DRAFT)
    drafts = [(p["name"], p["verdict"]) for p in report["passes"]["passes"] if p["name"].startswith("DRAFT_")]
    assert drafts == [(p["name"], p["verdict"]) for p in own if p["name"].startswith("DRAFT_")]
    if TREE == "next-stock":
        assert ("DRAFT_DECODE_GRAPH", "wrong-rows") in drafts, drafts
        assert code == 5, report["verdict"]["line"]
    else:
        assert {v for _, v in drafts} == {"consistent"}, drafts
        assert code == 1 and report["message"] == f"ValueError: {passes.NEXTN_MLA_DRAFT.format(dcp=8, algorithm='EAGLE')}"


def test_nextn_on_flashinfer_passes_with_the_fix():
    """With --attention-backend flashinfer (MLA): stock admits it with its draft and verify reading other rows
    (exit 5); the series (0017-0018) and the plugin's hooks plan every pass it runs and admit it (exit 0)."""
    code, report = preflight(*DCP8[:-1], *FLASHINFER, "--speculative-algorithm", "NEXTN")
    if TREE == "next-stock":
        assert code == 5 and report["stock"]["passed"]
        return
    assert code == 0 and report["message"] is None, report["verdict"]["line"]
    assert "the NextN draft's decode and extend" in report["verdict"]["evidence"], report["verdict"]["evidence"]


def test_the_plugins_off_switch_turns_the_plugins_fix_off():
    """SGLANG_ENABLE_DCP_DSPARK_PLUGIN=0: the plugin plans nothing, and preflight names the broken passes.

    In a process of its own, as a user runs preflight: this test process may
    have loaded the plugin through load_plugins() already (next-plugin).
    """
    env = {k: v for k, v in os.environ.items() if k not in (WHITELIST_ENV, SWITCH_ENV)}
    env.update({SWITCH_ENV: "0", "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "python"), env.get("PYTHONPATH")]))})
    argv = [sys.executable, "-m", "sglang_dcp_dspark", "preflight", "--json", "--device-rows", "540000", "--",
            *DCP8[:-1], *FLASHINFER, "--speculative-algorithm", "NEXTN"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    report = json.loads(done.stdout)
    assert not report["plugin"]["enabled"]
    if TREE == "next-patched":  # the series plans it in sglang's own code, whatever the plugin's switch says
        assert done.returncode == 0, report["verdict"]["line"]
    else:
        assert done.returncode == 5 and report["passed"] and "TARGET_VERIFY" in " ".join(report["verdict"]["details"])


@pytest.mark.parametrize("hicache", [(), HICACHE], ids=["no-hicache", "hicache"])
def test_dspark_with_the_default_draft_backend_reads_its_own_rows_in_the_drafts_passes(hicache):
    """The dense DSparkDraftModel on the default draft backend: every draft pass consistent, with and without HiCache.

    Its verify is the target's. On stock flashinfer MLA the map shows it reading other rows: stock 0.5.23 admits it
    (BROKEN PASS). The series (0012) and the plugin's hooks plan it split: it PASSES, the line names that
    fix and the block beneath it the fix's evidence.
    """
    code, report = preflight(*DCP8[:-1], *hicache, *DSPARK, *FLASHINFER)
    found = {p["name"]: p for p in report["passes"]["passes"]}
    line = report["verdict"]["line"]
    assert found["DRAFT_EXTEND"]["verdict"] == "consistent", found["DRAFT_EXTEND"]
    verify = {p["verdict"] for name, p in found.items() if name.startswith("TARGET_VERIFY")}
    if TREE == "next-stock":
        assert verify == {"wrong-rows"} and code == 5 and "on flashinfer, the target reads" in line, line
        assert any(d.startswith("TARGET_VERIFY") for d in report["verdict"]["details"]), report["verdict"]
    else:
        fix, short = (("upstream-next 0012", "upstream-next") if TREE == "next-patched"
                      else ("the plugin's flashinfer MLA hooks", "the plugin"))
        assert verify == {"consistent"} and code == 0, line
        assert f"{short} fixes its verify" in line, line  # the line names the fix; its block, the evidence
        evidence = report["verdict"]["evidence"]
        assert f"fixed by {fix}" in evidence and "not yet on a GPU" in evidence, evidence


def test_dspark_with_a_triton_draft_backend_is_refused_and_its_rows_named():
    code, report = preflight(*DCP8[:-1], *DSPARK, *FLASHINFER, "--speculative-draft-attention-backend", "triton")
    triton = [p for p in report["passes"]["passes"] if p["backend"] == "triton" and p["verdict"] == "wrong-rows"]
    assert triton and "reads rows" in triton[0]["detail"]
    if TREE == "next-stock":
        assert code == 5
    else:
        assert code == 1 and report["message"] == f"ValueError: {passes.TRITON_DRAFT.format(dcp=8)}"


def _pools(dcp: int):
    from sglang_dcp_dspark.core import sidecar

    rank = sidecar.Rank(dcp, device_rows=64, page_size=16, target_layers=1)
    return rank, sidecar.device_pools(rank)


def _plan(mode: str, pools):
    from sglang.srt.speculative.base_spec_worker import HiCacheDraftMode, HiCacheDraftPlan

    return HiCacheDraftPlan(mode=getattr(HiCacheDraftMode, mode), device_pools=tuple(pools))


def _params(packed=(), sidecars=()):
    return SimpleNamespace(mtp_draft_device_pools=tuple(packed), sidecar_draft_device_pools=tuple(sidecars))


def test_the_plan_check_admits_a_striped_packed_draft_and_refuses_the_rest():
    """The plugin's plan check (0009's rule, as 0020 narrows it) on sglang's own pools at dcp 2: each refusal is one
    line naming the pair; a dense EAGLE-family draft in a sidecar passes where its backends keep it replicated."""
    from sglang.srt.runtime_context import get_context

    from sglang_dcp_dspark.core import sidecar
    from sglang_dcp_dspark.plugin.hooks.hybrid_pool_assembler import check_draft_pools

    rank, pools = _pools(2)
    with sidecar.on_rank(rank):
        check_draft_pools(_params(packed=[pools.draft_device]))  # the NextN layer: striped like the target
        check_draft_pools(_params(sidecars=[pools.draft_device]))  # no speculative algorithm published: DSPARK's way
        replicated = SimpleNamespace(_write_loc_dcp_span=1)  # what a dcp_replicated (DSA) draft pool says
        with pytest.raises(NotImplementedError) as caught:
            check_draft_pools(_params(packed=[replicated]))
        assert "cannot pack this draft" in str(caught.value) and "\n" not in str(caught.value)
        for algorithm in ("EAGLE", "EAGLE3"):
            # The MLA draft pool is striped (one row per 2 locs): its sidecar would restore other rows.
            with get_context().override_server_args(speculative_algorithm=algorithm), pytest.raises(NotImplementedError) as caught:
                check_draft_pools(_params(sidecars=[pools.draft_device]))
            assert "cannot back this EAGLE draft up in a host pool of its own" in str(caught.value)
            assert "(an MLA draft, one row per 2 locs)" in str(caught.value) and "\n" not in str(caught.value)
        # A dense draft pool says nothing of DCP spans: the backends sglang resolved for the draft tell its layout
        # (its own flag, else the target's).
        dense = SimpleNamespace()
        with get_context().override_server_args(speculative_algorithm="EAGLE3", attention_backend="flashinfer"):
            check_draft_pools(_params(sidecars=[dense]))
        with get_context().override_server_args(speculative_algorithm="EAGLE3", attention_backend="flashinfer",
                                                 speculative_draft_attention_backend="triton"), \
                pytest.raises(NotImplementedError, match="a dense draft on triton"):
            check_draft_pools(_params(sidecars=[dense]))
        with get_context().override_server_args(speculative_algorithm="DSPARK"):
            check_draft_pools(_params(sidecars=[pools.draft_device]))


def _estimates(dcp: int) -> tuple[int, int, int, int]:
    """sglang's auto-size estimate for a packed and a sidecar plan of one draft, with the target's and the draft's bytes."""
    from sglang.srt.mem_cache import hicache_auto_size

    from sglang_dcp_dspark.core import sidecar

    rank, pools = _pools(dcp)
    with sidecar.on_rank(rank):
        params = SimpleNamespace(token_to_kv_pool_allocator=SimpleNamespace(get_kvcache=lambda: pools.target_device),
                                 req_to_token_pool=None, mtp_draft_device_pools=(pools.draft_device,))
        packed = hicache_auto_size._estimate_hicache_bytes(params, _plan("PACKED", [pools.draft_device]))
        sidecar_estimate = hicache_auto_size._estimate_hicache_bytes(params, _plan("SIDECAR", [pools.draft_device]))
    target = hicache_auto_size._pool_bytes(pools.target_device)
    draft = hicache_auto_size._pool_bytes(pools.draft_device)
    stripe = draft * pools.target_device.size // pools.draft_device.size
    return packed, sidecar_estimate, target, stripe


@pytest.mark.regression
def test_auto_size_prices_a_packed_draft_at_one_row_per_target_row():
    """As the series' 0009 does it: a sidecar at dcp_size rows per target row, packed layers at one."""
    packed, sidecar_estimate, target, stripe = _estimates(8)
    assert packed == target + stripe
    # The sidecar's row per logical slot: what patches/upstream-next 0002 prices and stock 0.5.23 does not.
    assert sidecar_estimate == target + stripe * 8


def test_preflight_prices_a_packed_draft_as_the_plugin_does():
    """Preflight applies the hooks per module (hooks.in_effect): the estimate's hook, judged after _draft_bytes's, still goes in.

    It follows the _draft_bytes entry; judged after that entry was patched, it
    once saw the plugin's own hook, left the estimate alone, and a NEXTN launch
    was auto-sized as if its packed layer were a sidecar (8 rows per target row).
    """
    from sglang_dcp_dspark.plugin import hooks

    with hooks.in_effect(hooks.AUTO_SIZE) as found:
        packed, sidecar_estimate, target, stripe = _estimates(8)
    assert found[f"{hooks.AUTO_SIZE}._estimate_hicache_bytes"].verdict is found[f"{hooks.AUTO_SIZE}._draft_bytes"].verdict
    assert (packed, sidecar_estimate) == (target + stripe, target + stripe * 8)
