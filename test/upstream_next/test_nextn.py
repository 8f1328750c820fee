"""The NextN (MTP) draft under DCP + HiCache on 0.5.23 (upstream-next 0008-0010, or the plugin): admitted, planned PACKED, checked.

On stock 0.5.23 every release's blanket refusal stands, so the tests marked
``regression`` are strict xfails there. The plan check itself is tested on
sglang's own pools with the plugin's words (:func:`hooks.hicache_hook.check_draft_plan`),
and the series' version of it through its own upstream-style tests
(test_upstream_file.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_dcp_dspark.preflight import DEFAULT_MODEL
from sglang_dcp_dspark.switch import SWITCH_ENV, WHITELIST_ENV
from trees import TREE

# An external MLA draft: a one-layer DeepSeek-V3-shaped stand-in (test/data).
MLA_DRAFT = str(Path(__file__).resolve().parents[1] / "data" / "deepseek-v3-mla-draft")
DCP8 = ["--model-path", str(DEFAULT_MODEL), "--tp", "8", "--dcp-size", "8", "--enable-hierarchical-cache"]


def preflight(*argv: str) -> tuple[int, dict]:
    """preflight --json on this tree, as run: the series' code, the plugin's hooks, or on next-stock sglang alone."""
    from sglang_dcp_dspark.__main__ import main

    saved = {name: os.environ.pop(name) for name in (WHITELIST_ENV, SWITCH_ENV) if name in os.environ}
    if TREE == "next-stock":
        os.environ[SWITCH_ENV] = "0"  # the installed plugin would fix the tree: stock is judged without it
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = main(["preflight", "--json", "--device-rows", "540000", "--", *argv])
    finally:
        os.environ.pop(SWITCH_ENV, None)
        os.environ.update(saved)
    return code, json.loads(out.getvalue())


@pytest.mark.regression
def test_preflight_admits_the_nextn_draft_and_names_its_plan():
    """preflight -- --model-path <MLA with NextN> --tp 8 --dcp-size 8 --enable-hierarchical-cache --speculative-algorithm NEXTN."""
    code, report = preflight(*DCP8, "--speculative-algorithm", "NEXTN")
    assert code == 0, report["verdict"]["line"]
    sizing = report["sizing"]
    assert sizing["draft_plan"] == "PACKED" and "packed into the target host pool" in sizing["draft_path"]
    (pool,) = sizing["pools"]
    # One host pool: the target's, with the NextN layer's 1,152 bytes per token as its tail layer.
    assert pool["name"] == "target KV + packed draft layers" and pool["bytes_per_token"] == 70_272 + 1_152
    assert pool["logical_slots"] == 8 * pool["rows"]


@pytest.mark.regression
@pytest.mark.parametrize("algorithm,draft", [("EAGLE", MLA_DRAFT), ("EAGLE3", MLA_DRAFT)])
def test_an_external_eagle_draft_is_refused_in_one_line_naming_why(algorithm, draft):
    code, report = preflight(*DCP8, "--speculative-algorithm", algorithm, "--speculative-draft-model-path", draft)
    assert code == 1
    line = report["verdict"]["line"]
    assert "supports an EAGLE draft only as the target's own NextN (MTP) layer" in line and "\n" not in line


def _pools(dcp: int):
    from sglang_dcp_dspark import sidecar

    rank = sidecar.Rank(dcp, device_rows=64, page_size=16, target_layers=1)
    return rank, sidecar.device_pools(rank)


def _plan(mode: str, pools):
    from sglang.srt.speculative.base_spec_worker import HiCacheDraftMode, HiCacheDraftPlan

    return HiCacheDraftPlan(mode=getattr(HiCacheDraftMode, mode), device_pools=tuple(pools))


def test_the_plan_check_admits_a_striped_packed_draft_and_refuses_the_rest():
    """The plugin's plan check on sglang's own pools at dcp 2: each refusal is one line naming the pair."""
    from sglang_dcp_dspark import sidecar
    from sglang_dcp_dspark.hooks.hicache_hook import check_draft_plan

    rank, pools = _pools(2)
    with sidecar.on_rank(rank):
        check_draft_plan(_plan("PACKED", [pools.draft_device]), "EAGLE", 2)  # the NextN layer: striped
        check_draft_plan(_plan("SIDECAR", [pools.draft_device]), "DSPARK", 2)  # as 0.5.23 admits it
        check_draft_plan(_plan("PACKED", [pools.draft_device]), "EAGLE", 1)  # no DCP: nothing to check
        replicated = SimpleNamespace(_write_loc_dcp_span=1)  # what a dcp_replicated (DSA) draft pool says
        cases = [
            (_plan("PACKED", [replicated]), "EAGLE", "cannot pack this draft"),
            (_plan("SIDECAR", [pools.draft_device]), "EAGLE", "cannot back this EAGLE draft up in a host pool of its own"),
            (_plan("SIDECAR", [pools.draft_device]), "EAGLE3", "(the SIDECAR plan)"),
        ]
        for plan, algorithm, says in cases:
            with pytest.raises(NotImplementedError) as caught:
                check_draft_plan(plan, algorithm, 2)
            assert says in str(caught.value) and "\n" not in str(caught.value)
        check_draft_plan(_plan("FUSED", [pools.draft_device]), "DSPARK", 2)  # left to sglang, as 0009 leaves it


def _estimates(dcp: int) -> tuple[int, int, int, int]:
    """sglang's auto-size estimate for a packed and a sidecar plan of one draft, with the target's and the draft's bytes."""
    from sglang.srt.mem_cache import hicache_auto_size

    from sglang_dcp_dspark import sidecar

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
    from sglang_dcp_dspark import hooks

    with hooks.in_effect(hooks.AUTO_SIZE) as found:
        packed, sidecar_estimate, target, stripe = _estimates(8)
    assert found[f"{hooks.AUTO_SIZE}._estimate_hicache_bytes"].verdict is found[f"{hooks.AUTO_SIZE}._draft_bytes"].verdict
    assert (packed, sidecar_estimate) == (target + stripe, target + stripe * 8)
