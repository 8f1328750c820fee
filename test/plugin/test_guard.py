"""The capacity guard: it stops a draft host pool that cannot hold every logical slot of the target's."""

from __future__ import annotations

import inspect

import pytest

import hostpool
from sglang_dcp_dspark.core.errors import DcpDsparkError, StartupError
from sglang_dcp_dspark.plugin import guard
from sglang_dcp_dspark.plugin.hooks import kv_cache_builder as kv_cache_hooks


@pytest.fixture(scope="module")
def stock_registration():
    from sglang.srt.mem_cache import kv_cache_builder

    # The function as sglang ships it, even if a plugin hook is applied in this process.
    return inspect.unwrap(kv_cache_builder.maybe_register_hicache_draft)


@pytest.mark.parametrize("draft_kind", ["mla", "mha"], ids=["mla-draft", "dense-dspark-draft"])
def test_stock_sizing_at_dcp8_is_stopped_with_both_sizes(stock_registration, draft_kind):
    pair = hostpool.build_pools(hostpool.Geometry(8, draft_kind=draft_kind), register=stock_registration)
    with pytest.raises(guard.DraftHostPoolTooSmall) as caught:
        guard.check_draft_host_pool(pair.target_host_pool, pair.draft_host_pool)
    message = str(caught.value)
    assert "\n" not in message
    assert f"has {pair.draft_host_pool.size} rows" in message
    assert f"{pair.target_host_pool.logical_size} logical slots" in message
    assert "dcp_size 8" in message and "sglang-dcp-dspark apply" in message
    # Raised inside sglang's scheduler, never handled by the CLI's main: no exit code to carry.
    assert isinstance(caught.value, StartupError) and not isinstance(caught.value, DcpDsparkError)


@pytest.mark.parametrize("draft_kind", ["mla", "mha"], ids=["mla-draft", "dense-dspark-draft"])
@pytest.mark.parametrize("dcp", [1, 2, 8])
def test_plugin_sizing_passes_the_guard(stock_registration, dcp, draft_kind):
    fixed = kv_cache_hooks.fixed_registration(stock_registration)
    pair = hostpool.build_pools(hostpool.Geometry(dcp, draft_kind=draft_kind), register=fixed)  # the hook runs the guard itself
    assert pair.out_of_bounds_slots() == 0


def test_plugin_hook_stops_a_deliberately_wrong_sizing(stock_registration, halved_draft_host_pool):
    fixed = kv_cache_hooks.fixed_registration(stock_registration)
    with pytest.raises(guard.DraftHostPoolTooSmall, match=r"dcp_size 4"):
        hostpool.build_pools(hostpool.Geometry(4), register=fixed)


def test_no_draft_registered_is_not_checked():
    from types import SimpleNamespace

    guard.check_cache_controller(SimpleNamespace(mem_pool_host=None, mem_pool_host_draft=None))


# The fix the one-line error names, per case.


@pytest.mark.parametrize(
    "environ,case",
    [({}, guard.Remedy.SERIES_MISSING), ({"SGLANG_ENABLE_DCP_DSPARK_PLUGIN": "0"}, guard.Remedy.PLUGIN_OFF),
     ({"SGLANG_PLUGINS": "other"}, guard.Remedy.PLUGIN_OFF)],
)
def test_the_default_remedy_follows_the_plugin_state(environ, case):
    assert guard.remedy_for(environ) is case  # the test environment has the package installed


def test_a_plugin_on_but_not_installed_is_told_to_install_it():
    assert guard.remedy_for({}, installed=False) is guard.Remedy.NOT_INSTALLED
    assert guard.remedy_for({"SGLANG_ENABLE_DCP_DSPARK_PLUGIN": "0"}, installed=False) is guard.Remedy.PLUGIN_OFF
    assert "pip install --no-deps a checkout of sglang-dcp-dspark" in guard.REMEDY[guard.Remedy.NOT_INSTALLED]


def test_each_remedy_names_its_fix(stock_registration, monkeypatch):
    pair = hostpool.build_pools(hostpool.Geometry(2), register=stock_registration)
    said = {}
    for case in guard.Remedy:
        with pytest.raises(guard.DraftHostPoolTooSmall) as caught:
            guard.check_draft_host_pool(pair.target_host_pool, pair.draft_host_pool, case)
        said[case] = str(caught.value)
        assert "\n" not in said[case] and said[case].endswith(guard.REMEDY[case])
        assert "sglang-dcp-dspark apply" in said[case]
    assert "unset SGLANG_ENABLE_DCP_DSPARK_PLUGIN" in said[guard.Remedy.PLUGIN_OFF]
    assert "another hook or edit replaced maybe_register_hicache_draft" in said[guard.Remedy.SHADOWED]
    assert "does not recognise this sglang's draft registration" in said[guard.Remedy.SERIES_MISSING]
    monkeypatch.setenv("SGLANG_ENABLE_DCP_DSPARK_PLUGIN", "0")  # no case given: read from the environment
    with pytest.raises(guard.DraftHostPoolTooSmall, match="turn the dcp_dspark plugin on"):
        guard.check_draft_host_pool(pair.target_host_pool, pair.draft_host_pool)


def test_a_hook_shadowed_under_the_plugins_sizing_is_named(stock_registration):
    # Something under the plugin's hook that sizes from physical rows whatever it is shown.
    def replaced(**kwargs):
        kwargs["tree_cache"] = object.__getattribute__(kwargs["tree_cache"], "_target")  # sees past the view
        return stock_registration(**kwargs)

    hooked = kv_cache_hooks.fixed_registration(replaced)
    with pytest.raises(guard.DraftHostPoolTooSmall, match="another hook or edit replaced"):
        hostpool.build_pools(hostpool.Geometry(4), register=hooked)
