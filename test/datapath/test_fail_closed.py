"""Fail closed on sglang's real HiCache data path: with the plugin's registration probe broken, a launch ends byte-exact or stopped with the guard's one-line error, never out of bounds."""

from __future__ import annotations

import functools
import inspect

import pytest

from emulation.datapath.harness import Case
from emulation.datapath.scenarios import round_trip
from sglang_dcp_dspark import plugin
from sglang_dcp_dspark.core import probes
from sglang_dcp_dspark.plugin import decisions, guard, hooks
from sglang_dcp_dspark.plugin.hooks import kv_cache_builder as kv_cache_hooks
from trees import TREE

pytestmark = pytest.mark.skipif(
    TREE not in ("stock", "plugin"), reason="the plugin's hooks are written for stock 0.5.17 (DCP_DSPARK_TREE stock or plugin)"
)


@pytest.fixture
def hook_the_plugin_picks(monkeypatch):
    """Run the plugin's decision for the draft registration; returns the hook it registers (HookRegistry not touched)."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    picked = []
    monkeypatch.setattr(HookRegistry, "register", classmethod(lambda cls, target, hook, kind, **kw: picked.append(hook)))
    monkeypatch.setattr(plugin, "findings", {})
    monkeypatch.setattr(decisions, "_live", True)  # the decision log lives in decisions (plugin re-exports it)

    def decide():
        # Judged on sglang's own function: under DCP_DSPARK_TREE=plugin the module attribute is already hooked.
        def judge():
            return kv_cache_hooks.registration_verdict(stock_registration())

        plugin.install(hooks.BY_TARGET[kv_cache_hooks.DRAFT_REGISTRATION].replace(judge=judge))
        (hook,) = picked
        return hook

    return decide


def stock_registration():
    from sglang.srt.mem_cache import kv_cache_builder

    return inspect.unwrap(kv_cache_builder.maybe_register_hicache_draft)  # sglang's own, even under the plugin tree


def launch(hook, dcp: int) -> str:
    """Round trip with sglang's registration behind the chosen hook: 'byte-exact' or the guard's message."""
    try:
        round_trip(Case(dcp_size=dcp), register=functools.partial(hook, stock_registration()))
    except guard.DraftHostPoolTooSmall as stopped:
        return str(stopped)
    return "byte-exact"


@pytest.mark.parametrize("dcp", [2, 4])
def test_injected_probe_failure_stops_at_startup(hook_the_plugin_picks, monkeypatch, dcp):
    def build_pools(g, register=None):
        raise RuntimeError("injected probe failure")

    monkeypatch.setattr(probes, "build_pools", build_pools)  # where the plugin's probe builds its pools
    hook = hook_the_plugin_picks()
    monkeypatch.undo()  # the launch itself builds real pools
    assert hook is kv_cache_hooks.check_draft_registration
    outcome = launch(hook, dcp)
    assert outcome.startswith("draft HiCache host pool has ") and "\n" not in outcome
    assert outcome.endswith(guard.REMEDY[guard.Remedy.SERIES_MISSING])


def test_unrecognised_pool_signature_stops_at_startup(hook_the_plugin_picks, monkeypatch):
    from sglang.srt.mem_cache import memory_pool

    real = memory_pool.MLATokenToKVPool.__init__

    def init(self, *args, layout_hint_from_a_later_release, **kwargs):
        real(self, *args, **kwargs)

    with monkeypatch.context() as probe_only:
        probe_only.setattr(memory_pool.MLATokenToKVPool, "__init__", init)
        hook = hook_the_plugin_picks()
    assert hook is kv_cache_hooks.check_draft_registration
    assert launch(hook, 2).startswith("draft HiCache host pool has ")


@pytest.mark.parametrize("dcp", [1, 2, 4])
def test_recognised_code_is_hooked_and_byte_exact(hook_the_plugin_picks, dcp):
    hook = hook_the_plugin_picks()
    assert hook is kv_cache_hooks.size_draft_from_logical
    assert launch(hook, dcp) == "byte-exact"


def test_check_only_passes_a_correct_pool_through_byte_exact():
    sized = kv_cache_hooks.fixed_registration(stock_registration())
    round_trip(Case(dcp_size=4), register=functools.partial(kv_cache_hooks.check_draft_registration, sized))
