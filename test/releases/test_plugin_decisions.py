"""The plugin's decisions on every release, judged on its code, and ``status`` saying the same.

Each table entry's judge runs here on this release's own functions, in-process
(sglang's HookRegistry is not touched: nothing is hooked for the rest of the
run). A judge never guesses from the version; ``status``, which must answer
without importing the tree, does, and this test holds the two together.
"""

from __future__ import annotations

import contextlib
import io

import pytest

from sglang_dcp_dspark import passes
from sglang_dcp_dspark.core.compat import locate_tree, parse_version
from sglang_dcp_dspark.plugin import hooks
from sglang_dcp_dspark.plugin.hooks import forward_mla as phase_hooks
from sglang_dcp_dspark.plugin.hooks import hicache_hook as hicache_gate_hooks
from sglang_dcp_dspark.plugin.hooks import kv_cache_builder as kv_cache_hooks
from sglang_dcp_dspark.plugin.hooks import overrides as overrides_hooks
from sglang_dcp_dspark.plugin.hooks import scheduler as scheduler_hooks
from sglang_dcp_dspark.plugin.hooks import server_args as server_args_hooks
from sglang_dcp_dspark.plugin.hooks.common import Verdict
from tree_table import TREES
from trees import TREE

RELEASE = TREES[TREE].sglang
SERIES_TREE = TREE == "next-patched"
ASSEMBLER = "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler"
# What status says for each hook the plugin installs on a release after the upstream fix.
STATUS_PHRASE = {
    f"{ASSEMBLER}.build_kv_only_stack": "counts the draft sidecar in --hicache-size",
    f"{ASSEMBLER}.build_full_draft_pools": "stops a short draft sidecar at startup",
    "sglang.srt.mem_cache.hicache_auto_size._draft_bytes": "prices the draft sidecar in auto-sizing",
    "sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding": "refuses under DCP, at argument time, the speculative launches",
}


def since(version: str) -> bool:
    return parse_version(RELEASE) >= parse_version(version)


def _judged() -> dict[str, Verdict]:
    import importlib

    verdicts = {}
    for hook in hooks.HOOKS:
        try:
            importlib.import_module(hook.module)
        except ImportError:
            continue  # a module this release does not have: the plugin never hears of it
        verdicts[hook.target] = hook.judged().verdict
    return verdicts


@pytest.fixture(scope="module")
def verdicts():
    return _judged()


def test_what_each_hook_needs_on_this_release(verdicts):
    needs = {target for target, v in verdicts.items() if v is Verdict.NEEDS_FIX}
    # Nothing is unrecognised on a release the plugin was tested on: every entry reached a verdict.
    assert not [t for t, v in verdicts.items() if v is Verdict.UNRECOGNISED], verdicts
    # Under DCP on Hopper sglang picks fa3 for an MLA model: a ServerArgs method to 0.5.18, a function of
    # arg_groups.overrides from 0.5.19; upstream-next 0015 picks flashinfer itself.
    default_backend = (overrides_hooks.DEFAULT_BACKEND if since("0.5.19") else server_args_hooks.DEFAULT_BACKEND)
    if RELEASE == "0.5.17":
        want = {server_args_hooks.RESOLVER, kv_cache_hooks.DRAFT_REGISTRATION, scheduler_hooks.INIT_MEMORY_POOLS,
                default_backend}
        if passes.measured(RELEASE) and passes.broken_kinds(RELEASE):  # the map runs on 0.5.17 too
            want.add("sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding")
    elif SERIES_TREE:
        want = set()  # upstream-next carries all of it: the plugin stands aside
    else:
        want = {default_backend}
        if since("0.5.19"):
            want.add(f"{ASSEMBLER}.build_full_draft_pools")
        if since("0.5.21"):
            # The estimate's entry follows _draft_bytes: it tells that hook a packed draft from a sidecar.
            want |= {"sglang.srt.mem_cache.hicache_auto_size._draft_bytes",
                     "sglang.srt.mem_cache.hicache_auto_size._estimate_hicache_bytes"}
        if since("0.5.23"):
            # The HiCache gate under DCP decides a draft by its layout where the plan check can follow it.
            want |= {f"{ASSEMBLER}.build_kv_only_stack", f"{ASSEMBLER}.build_kv_only_group", hicache_gate_hooks.GATE}
        if since(hooks.VERIFY_FIX_SINCE):
            # The verify under DCP planned split: the flashinfer MLA verify of 0.5.22 and 0.5.23, with the NextN
            # draft's decode and extend, and the MLA forward that merges that extend.
            want |= {h.target for h in hooks.HOOKS if h.module in (hooks.FLASHINFER_MLA, phase_hooks.MODULE)}
        if passes.measured(RELEASE) and passes.broken_kinds(RELEASE):
            # The speculative check, where the pass map shows a launch kind reading other rows under DCP.
            want.add("sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding")
    assert needs == want, {t: v.name for t, v in verdicts.items()}


def test_status_says_what_the_judges_decided(verdicts, monkeypatch):
    from sglang_dcp_dspark.__main__ import main
    from sglang_dcp_dspark.plugin.switch import SWITCH_ENV, WHITELIST_ENV

    for name in (SWITCH_ENV, WHITELIST_ENV):
        monkeypatch.delenv(name, raising=False)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["status"]) == 0
    line = next(ln.strip() for ln in out.getvalue().splitlines() if ln.strip().startswith("plugin dcp_dspark"))
    assert RELEASE in locate_tree(None).version
    if SERIES_TREE:
        assert "series upstream-next applied; the plugin stands aside" in line
        return
    for target, phrase in STATUS_PHRASE.items():
        assert (phrase in line) == (verdicts.get(target) is Verdict.NEEDS_FIX), (target, line)
    if RELEASE == "0.5.17":
        assert "fixed at run time by the plugin" in line
    elif not any(v is Verdict.NEEDS_FIX for v in verdicts.values()):
        assert "the plugin leaves it alone" in line
