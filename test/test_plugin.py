"""The sglang plugin: fresh processes with the package installed and sglang unedited, plus its verdicts on code it does not know."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_dcp_dspark import plugin
from sglang_dcp_dspark import series as series_mod

PROBE = Path(__file__).parent / "plugin_probe.py"
GATE = "HiCache with --dcp-size > 1"


def probe(model: Path, *, spawn: bool = False, plugins: str | None = None, pythonpath: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_PLUGINS", "PYTHONPATH")}
    if plugins is not None:
        env["SGLANG_PLUGINS"] = plugins
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    args = [sys.executable, str(PROBE), str(model)] + (["--spawn"] if spawn else [])
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_installed_entry_point_points_at_register():
    from importlib.metadata import entry_points

    (ep,) = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == plugin.PLUGIN_NAME]
    assert ep.load() is plugin.register


def test_on_stock_sglang_the_plugin_fixes_launcher_and_spawned_scheduler(tiny_mla_model):
    got = probe(tiny_mla_model, spawn=True)
    assert got["dspark"] == "passes"
    assert got["eagle"].startswith("rejected:") and GATE in got["eagle"]
    for where in ("late_import", "spawned_scheduler"):
        assert got[where]["out_of_bounds"] == 0, where
        assert got[where]["coverage"] >= 1.0, where
        assert set(got[where]["findings"].values()) == {"NEEDS_FIX"}, where
    # One line per target, and a second register() adds none; the draft registration adds what HiCache pins.
    decisions = [line for line in got["plugin_log"] if line.startswith("INFO dcp_dspark:")]
    assert len(decisions) == 2 and all(line.startswith("INFO dcp_dspark: hooking") for line in decisions)
    assert any(line.startswith("INFO HiCache pins") and "dcp_size 8" in line for line in got["plugin_log"])


def test_sglang_plugins_naming_another_plugin_keeps_it_off(tiny_mla_model):
    got = probe(tiny_mla_model, plugins="some_other_plugin")
    assert got["dspark"].startswith("rejected:") and GATE in got["dspark"]
    assert got["late_import"]["coverage"] < 0.2 and got["late_import"]["out_of_bounds"] > 0
    assert got["late_import"]["findings"] == {} and got["plugin_log"] == []


def test_on_a_tree_with_the_series_applied_it_stands_aside(tiny_mla_model, tree_copy):
    series_mod.apply(tree_copy, series_mod.load_series("sglang-0.5.17"))
    got = probe(tiny_mla_model, pythonpath=tree_copy.root)
    assert got["dspark"] == "passes" and got["late_import"]["out_of_bounds"] == 0
    assert set(got["late_import"]["findings"].values()) == {"FIXED"}
    assert len(got["plugin_log"]) == 2 and all(line.startswith("INFO dcp_dspark: leaving") for line in got["plugin_log"])


# In-process: the verdicts on resolvers and registrations that are not 0.5.17's.


def _rejects_everything(server_args):
    raise NotImplementedError("no")


def _admits_everything(server_args):
    return None


def _reads_unknown_fields(server_args):
    return server_args.some_field_from_a_later_release


def _eagle_ok_dspark_not(server_args):
    if server_args.speculative_algorithm == "DSPARK":
        raise NotImplementedError("no")


@pytest.mark.parametrize(
    "resolve,want",
    [
        (_admits_everything, plugin.Verdict.UNRECOGNISED),  # lets EAGLE through: not the gate we know
        (_rejects_everything, plugin.Verdict.UNRECOGNISED),  # rejects a launch with no draft
        (_reads_unknown_fields, plugin.Verdict.UNRECOGNISED),
        (_eagle_ok_dspark_not, plugin.Verdict.UNRECOGNISED),
    ],
)
def test_resolver_it_does_not_recognise_is_left_alone(resolve, want):
    assert plugin.resolver_verdict(resolve).verdict is want


def test_stock_and_patched_resolver_verdicts():
    from sglang.srt.server_args import ServerArgs

    stock = plugin.resolver_verdict(ServerArgs._resolve_hicache_dcp_compatibility)
    assert stock.verdict is plugin.Verdict.NEEDS_FIX

    def patched(server_args):  # the same gate, the hook applied
        return plugin.admit_dspark(ServerArgs._resolve_hicache_dcp_compatibility, server_args)

    assert plugin.resolver_verdict(patched).verdict is plugin.Verdict.FIXED


def test_registration_it_does_not_recognise_is_left_alone():
    def explodes(**kwargs):
        raise TypeError("a different signature")

    def registers_nothing(**kwargs):
        return None

    assert plugin.registration_verdict(explodes).verdict is plugin.Verdict.UNRECOGNISED
    assert plugin.registration_verdict(registers_nothing).verdict is plugin.Verdict.UNRECOGNISED


def test_unrecognised_code_gets_no_hook_and_one_warning(caplog, monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.setattr(plugin, "findings", {})
    target = "sglang_dcp_dspark.plugin.PLUGIN_NAME"
    before = list(HookRegistry._hooks.get(target, []))
    unknown = lambda: plugin.Finding(target, plugin.Verdict.UNRECOGNISED, "probe said so")  # noqa: E731
    with caplog.at_level("INFO", logger="sglang_dcp_dspark.plugin"):
        plugin._decide(target, unknown, plugin.admit_dspark)
        plugin._decide(target, unknown, plugin.admit_dspark)
    assert HookRegistry._hooks.get(target, []) == before
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    HookRegistry._hooks.pop(target, None)
