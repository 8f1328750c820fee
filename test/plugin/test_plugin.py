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
from sglang_dcp_dspark.core import probes
from sglang_dcp_dspark.core.compat import as_shipped, locate_tree
from sglang_dcp_dspark.plugin import decisions, hooks
from sglang_dcp_dspark.plugin import status as plugin_status
from sglang_dcp_dspark.plugin.hooks import common as hook_common
from sglang_dcp_dspark.plugin.hooks import flashinfer_mla_backend as verify_hooks
from sglang_dcp_dspark.plugin.hooks import forward_mla as phase_hooks
from sglang_dcp_dspark.plugin.hooks import hicache_auto_size as auto_size_hooks
from sglang_dcp_dspark.plugin.hooks import hybrid_pool_assembler as assembler_hooks
from sglang_dcp_dspark.plugin.hooks import kv_cache_builder as kv_cache_hooks
from sglang_dcp_dspark.plugin.hooks import overrides as overrides_hooks
from sglang_dcp_dspark.plugin.hooks import scheduler as scheduler_hooks
from sglang_dcp_dspark.plugin.hooks import server_args as server_args_hooks
from sglang_dcp_dspark.plugin.hooks import speculative_hook as speculative_hooks
from sglang_dcp_dspark.series import patching

PROBE = Path(__file__).parents[1] / "plugin_probe.py"
REPO = Path(__file__).resolve().parents[2]
GATE = "HiCache with --dcp-size > 1"
SPECULATIVE = "sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding"
DEFAULT_BACKEND = "sglang.srt.server_args.ServerArgs._get_default_attn_backend"
OVERRIDES_DEFAULT = "sglang.srt.arg_groups.overrides.get_default_attn_backend"
# The flashinfer MLA verify and NextN draft hooks, and the MLA forward's, written for 0.5.22's and 0.5.23's code.
VERIFY_TARGETS = (verify_hooks.METADATA, verify_hooks.GRAPH, verify_hooks.FORWARD, verify_hooks.DRAFT_DECODE,
                  phase_hooks.PHASE)


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
        # The speculative check follows the pass map, which maps 0.5.17 too and shows passes broken under DCP
        # there (judged where its module is imported).
        findings = got[where]["findings"]
        assert findings.pop(SPECULATIVE, "NEEDS_FIX") == "NEEDS_FIX", where
        # 0.5.17's default backend is a ServerArgs method: the picker of 0.5.19 on is not there to hook.
        assert findings.pop(OVERRIDES_DEFAULT, "OUT_OF_SCOPE") == "OUT_OF_SCOPE", where
        # The verify under DCP is written for 0.5.22's and 0.5.23's flashinfer MLA backend.
        for target in VERIFY_TARGETS:
            assert findings.pop(target, "OUT_OF_SCOPE") == "OUT_OF_SCOPE", (where, target)
        assert set(findings.values()) == {"NEEDS_FIX"}, where
    # One line per target, and a second register() adds none; the draft registration adds what HiCache pins.
    decisions = [line for line in got["plugin_log"] if line.startswith("INFO dcp_dspark:")]
    hooked = [line for line in decisions if line.startswith("INFO dcp_dspark: hooked")]
    # and the five entries not for 0.5.17 (the picker of 0.5.19 on, the three verify hooks, the NextN draft decode's;
    # the MLA forward's module is not imported here) each say so once
    assert len(hooked) == 4 and len(decisions) == 9, decisions
    assert hooked[2].startswith(f"INFO dcp_dspark: hooked {SPECULATIVE}")
    assert any(line.startswith("INFO HiCache pins") and "dcp_size 8" in line for line in got["plugin_log"])


def test_sglang_plugins_naming_another_plugin_keeps_it_off(tiny_mla_model):
    got = probe(tiny_mla_model, plugins="some_other_plugin")
    assert got["dspark"].startswith("rejected:") and GATE in got["dspark"]
    assert got["late_import"]["coverage"] < 0.2 and got["late_import"]["out_of_bounds"] > 0
    assert got["late_import"]["findings"] == {} and got["plugin_log"] == []


def test_on_a_tree_with_the_series_applied_it_stands_aside(tiny_mla_model, tree_copy):
    patching.apply(tree_copy, series_mod.load_series("sglang-0.5.17"))
    got = probe(tiny_mla_model, pythonpath=tree_copy.root)
    assert got["dspark"] == "passes" and got["late_import"]["out_of_bounds"] == 0
    findings = got["late_import"]["findings"]
    # The series carries the fix; the pass map's refusal and the DCP default backend are the plugin's alone (the
    # 0.5.17 series has neither).
    assert findings.pop(SPECULATIVE) == "NEEDS_FIX" and findings.pop(DEFAULT_BACKEND) == "NEEDS_FIX"
    assert findings.pop(OVERRIDES_DEFAULT) == "OUT_OF_SCOPE"
    assert all(findings.pop(target, "OUT_OF_SCOPE") == "OUT_OF_SCOPE" for target in VERIFY_TARGETS)
    assert set(findings.values()) == {"FIXED"}
    log = got["plugin_log"]
    left = [line.split(" alone")[0].removeprefix("INFO dcp_dspark: left ") for line in log if " alone" in line]
    hooked = [line.split(":")[1].removeprefix(" hooked ") for line in log if line.startswith("INFO dcp_dspark: hooked")]
    assert hooked == [DEFAULT_BACKEND, SPECULATIVE], log
    assert len(left) == 7 and len(log) == 9, log


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
        (_admits_everything, hook_common.Verdict.UNRECOGNISED),  # lets EAGLE through: not the gate we know
        (_rejects_everything, hook_common.Verdict.UNRECOGNISED),  # rejects a launch with no draft
        (_reads_unknown_fields, hook_common.Verdict.UNRECOGNISED),
        (_eagle_ok_dspark_not, hook_common.Verdict.UNRECOGNISED),
    ],
)
def test_resolver_it_does_not_recognise_is_left_alone(resolve, want):
    assert server_args_hooks.resolver_verdict(resolve).verdict is want


def test_stock_and_patched_resolver_verdicts():
    from sglang.srt.server_args import ServerArgs

    stock = server_args_hooks.resolver_verdict(ServerArgs._resolve_hicache_dcp_compatibility)
    assert stock.verdict is hook_common.Verdict.NEEDS_FIX

    def patched(server_args):  # the same gate, the hook applied
        return server_args_hooks.admit_dspark(ServerArgs._resolve_hicache_dcp_compatibility, server_args)

    assert server_args_hooks.resolver_verdict(patched).verdict is hook_common.Verdict.FIXED


def test_registration_it_does_not_recognise_is_left_alone():
    def explodes(**kwargs):
        raise TypeError("a different signature")

    def registers_nothing(**kwargs):
        return None

    assert kv_cache_hooks.registration_verdict(explodes).verdict is hook_common.Verdict.UNRECOGNISED
    assert kv_cache_hooks.registration_verdict(registers_nothing).verdict is hook_common.Verdict.UNRECOGNISED


def test_unrecognised_code_gets_no_hook_and_one_warning(caplog, monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.setattr(plugin, "findings", {})
    monkeypatch.setattr(decisions, "_live", True)  # as after sglang's configure_logger
    target = "sglang_dcp_dspark.plugin.PLUGIN_NAME"
    before = list(HookRegistry._hooks.get(target, []))
    unknown = lambda: hook_common.Finding(target, hook_common.Verdict.UNRECOGNISED, "probe said so")  # noqa: E731
    with caplog.at_level("INFO", logger="sglang_dcp_dspark.plugin"):
        entry = hooks.BY_TARGET[server_args_hooks.RESOLVER].replace(target=target, judge=unknown)
        plugin.install(entry)
        plugin.install(entry)
    assert HookRegistry._hooks.get(target, []) == before
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    HookRegistry._hooks.pop(target, None)


# Fail closed: a probe that cannot judge the registration gets a check-only hook, never nothing.


@pytest.fixture
def registered(monkeypatch):
    """HookRegistry.register, recorded instead of applied, with a fresh decision record."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    calls = []
    monkeypatch.setattr(HookRegistry, "register", classmethod(lambda cls, target, hook, kind, **kw: calls.append((target, hook, kind))))
    monkeypatch.setattr(plugin, "findings", {})
    monkeypatch.setattr(decisions, "_live", True)
    return calls


@pytest.fixture
def stock_registration():
    import inspect

    from sglang.srt.mem_cache import kv_cache_builder

    return inspect.unwrap(kv_cache_builder.maybe_register_hicache_draft)


def test_a_failing_registration_probe_gets_the_check_only_hook(registered, monkeypatch, caplog):

    def build_pools(g, register=None):
        raise RuntimeError("injected probe failure")

    monkeypatch.setattr(probes, "build_pools", build_pools)  # where the plugin's probe builds its pools
    with caplog.at_level("INFO", logger="sglang_dcp_dspark"):
        plugin.install(hooks.BY_TARGET[kv_cache_hooks.DRAFT_REGISTRATION])
    assert plugin.findings[kv_cache_hooks.DRAFT_REGISTRATION].verdict is hook_common.Verdict.UNRECOGNISED
    assert [(t, h) for t, h, _ in registered] == [(kv_cache_hooks.DRAFT_REGISTRATION, kv_cache_hooks.check_draft_registration)]
    assert [r.levelname for r in caplog.records] == ["WARNING"] and "check-only hook" in caplog.records[0].getMessage()


def test_the_check_only_hook_stops_a_short_draft_pool_and_passes_a_correct_one(stock_registration):
    import functools

    import hostpool
    from sglang_dcp_dspark.plugin import guard

    check_only = functools.partial(kv_cache_hooks.check_draft_registration, stock_registration)
    with pytest.raises(guard.DraftHostPoolTooSmall) as caught:
        hostpool.build_pools(hostpool.Geometry(4), register=check_only)
    assert "\n" not in str(caught.value) and guard.REMEDY[guard.Remedy.SERIES_MISSING] in str(caught.value)
    # A registration that sizes from logical_size (here the plugin's own) passes through unchanged.
    fixed = kv_cache_hooks.fixed_registration(stock_registration)
    pair = hostpool.build_pools(hostpool.Geometry(4), register=functools.partial(kv_cache_hooks.check_draft_registration, fixed))
    assert pair.out_of_bounds_slots() == 0
    assert hostpool.build_pools(hostpool.Geometry(1), register=check_only).out_of_bounds_slots() == 0  # dcp 1: stock is right


def test_no_check_only_hook_where_upstream_carries_the_fix(monkeypatch):
    from sglang_dcp_dspark.core import compat

    monkeypatch.setattr(compat, "installed_sglang_version", lambda: "0.5.18")
    assert kv_cache_hooks.check_only_if_needed() is None
    monkeypatch.setattr(compat, "installed_sglang_version", lambda: None)  # unknown: fail closed
    assert kv_cache_hooks.check_only_if_needed() is kv_cache_hooks.check_draft_registration


@pytest.fixture
def pool_signature_from_a_later_release(monkeypatch):
    from sglang.srt.mem_cache import memory_pool

    real = memory_pool.MLATokenToKVPool.__init__

    def init(self, *args, layout_hint_from_a_later_release, **kwargs):
        real(self, *args, **kwargs)

    monkeypatch.setattr(memory_pool.MLATokenToKVPool, "__init__", init)


def test_an_unrecognised_pool_signature_is_a_verdict_not_an_exception(pool_signature_from_a_later_release, registered):
    budget = scheduler_hooks.budget_verdict()
    assert budget.verdict is hook_common.Verdict.UNRECOGNISED and "layout_hint_from_a_later_release" in budget.detail
    assert kv_cache_hooks.registration_verdict().verdict is hook_common.Verdict.UNRECOGNISED
    plugin.install(hooks.BY_TARGET[scheduler_hooks.INIT_MEMORY_POOLS])
    assert registered == []  # no budget hook on code it cannot judge


def test_the_shipped_schedulers_verdict_is_the_real_judges(monkeypatch):
    """preflight reads the budget verdict off 0.5.17's scheduler as its wheel ships it: there the real judge agrees,
    and a scheduler that is not the wheel's (a patched or copied tree, a later release) gets no shipped verdict."""
    tree = locate_tree(None)
    shipped = scheduler_hooks.shipped_budget_verdict()
    if tree.version not in scheduler_hooks.SHIPPED or not as_shipped(tree, scheduler_hooks.SCHEDULER_FILE):
        assert shipped is None  # the real judge decides
        return
    assert shipped is not None and shipped == scheduler_hooks.budget_verdict()
    assert shipped.verdict is hook_common.Verdict.NEEDS_FIX
    monkeypatch.setattr("sglang_dcp_dspark.core.compat.as_shipped", lambda tree, relpath: False)
    assert scheduler_hooks.shipped_budget_verdict() is None


def test_a_probe_that_raises_never_escapes_into_sglangs_import(registered):
    def judge():
        raise AttributeError("a module-level name from a later release")

    plugin.install(hooks.BY_TARGET[scheduler_hooks.INIT_MEMORY_POOLS].replace(judge=judge))  # must not raise
    assert plugin.findings[scheduler_hooks.INIT_MEMORY_POOLS].verdict is hook_common.Verdict.UNRECOGNISED and registered == []


def test_probes_keep_sglangs_pool_lines_out_of_the_log(caplog):
    import hostpool

    with caplog.at_level("INFO"):
        hostpool.build_pools(hostpool.Geometry(2, device_rows=64, page_size=16))  # the same pools, not probing
    assert any(r.name.startswith("sglang.") and "is allocated" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level("INFO"):
        kv_cache_hooks.registration_verdict()
        scheduler_hooks.budget_verdict()
    assert [r.getMessage() for r in caplog.records if r.name.startswith("sglang.")] == []
    import logging

    assert logging.getLogger("sglang").level == logging.NOTSET  # restored


def test_decisions_wait_for_sglangs_logging_then_come_out_in_order(monkeypatch):
    """Held while the root logger has what it had at register(); written at the first sglang record after it changed."""
    import logging

    root, sglang_logger = logging.getLogger(), logging.getLogger("sglang")
    monkeypatch.setattr(decisions, "_live", False)
    monkeypatch.setattr(decisions, "_held", [])
    monkeypatch.setattr(decisions, "_watcher", None)
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(sglang_logger, "handlers", [])
    records: list[tuple[str, str, str]] = []

    class Configured(logging.Handler):  # what sglang's configure_logger installs (basicConfig(force=True))
        def emit(self, record):
            records.append((record.name, record.levelname, record.getMessage()))

    monkeypatch.setattr("atexit.register", lambda fn: None)
    decisions.watch()
    decisions.say(logging.INFO, "dcp_dspark: first")
    decisions.say(logging.WARNING, "dcp_dspark: second")
    # Before sglang configures logging its records meet no handler, and Python's last resort still gets its warnings.
    last: list[str] = []
    monkeypatch.setattr(logging.lastResort, "handle", lambda record: last.append(record.getMessage()))
    logging.getLogger("sglang.srt.early").warning("an early warning")
    assert last == ["an early warning"] and decisions.held() == ["dcp_dspark: first", "dcp_dspark: second"]
    root.handlers = [Configured()]
    root.setLevel(logging.INFO)
    try:
        logging.getLogger("sglang.srt.managers.scheduler").info("the scheduler's first line")
        decisions.say(logging.INFO, "dcp_dspark: after")
    finally:
        root.setLevel(logging.WARNING)
    assert records == [
        ("sglang_dcp_dspark.plugin", "INFO", "dcp_dspark: first"),
        ("sglang_dcp_dspark.plugin.always", "WARNING", "dcp_dspark: second"),
        ("sglang.srt.managers.scheduler", "INFO", "the scheduler's first line"),
        ("sglang_dcp_dspark.plugin", "INFO", "dcp_dspark: after"),
    ]
    assert sglang_logger.handlers == []  # the watcher took itself off: nothing more is asked of sglang's records


def test_no_module_walk_at_load_plugins_where_nothing_is_hooked(monkeypatch):
    """The decision log needs no hook on configure_logger: a process whose targets need nothing applies nothing."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    assert not any(target.endswith("configure_logger") for target in HookRegistry._hooks)


# sglang's walk of sys.modules after each patched target: spared for the plugin's methods, kept for module functions.


class StandInPicker:
    """A release's method for the plugin to hook (the stand-in release is this module)."""

    def pick(self):
        return "fa3"


def stand_in_build():
    """A release's module function for the plugin to hook."""
    return "physical rows"


@pytest.fixture
def stand_in_release(monkeypatch):
    """This module as a release with a method and a module function to hook, the test helpers' ``hostpool`` holding
    a ``from X import Y`` copy of the function, a HookRegistry of their own, and sglang's walk counted (the plugin's
    wrapper goes over the count). Everything HookRegistry patches is put back after the test."""
    from collections import defaultdict

    from sglang.srt.plugins import hook_registry
    from sglang.srt.plugins.hook_registry import HookRegistry

    import hostpool

    release = sys.modules[__name__]
    monkeypatch.setattr(StandInPicker, "pick", StandInPicker.pick)
    monkeypatch.setattr(release, "stand_in_build", stand_in_build)
    monkeypatch.setattr(hostpool, "stand_in_build", stand_in_build, raising=False)
    monkeypatch.setattr(HookRegistry, "_hooks", defaultdict(list))
    monkeypatch.setattr(HookRegistry, "_patched", set())
    walked: list[str] = []
    walk = hook_registry._propagate_patch

    def counted(original, wrapped, source_module):
        walked.append(original.__qualname__)
        return walk(original, wrapped, source_module)

    monkeypatch.setattr(hook_registry, "_propagate_patch", counted)
    monkeypatch.setattr(plugin, "findings", {})
    monkeypatch.setattr(decisions, "_live", True)
    return release, hostpool, walked


def test_a_hooked_method_costs_no_walk_and_a_hooked_function_still_reaches_its_copies(stand_in_release):
    release, importer, walked = stand_in_release
    needs_fix = lambda target: lambda: hook_common.Finding(target, hook_common.Verdict.NEEDS_FIX, "stand-in")  # noqa: E731
    template = hooks.BY_TARGET[server_args_hooks.RESOLVER]
    for target in (f"{__name__}.StandInPicker.pick", f"{__name__}.stand_in_build"):
        # Imported after load_plugins(), as the scheduler is: registered and applied at once.
        plugin.install(template.replace(module=__name__, target=target, judge=needs_fix(target),
                                        hook=lambda original, *args: f"hooked {original(*args)}"), late=True)
    assert release.StandInPicker().pick() == "hooked fa3" and release.stand_in_build() == "hooked physical rows"
    assert importer.stand_in_build() == "hooked physical rows"  # the walk still rebinds a module function's copies
    assert walked == ["stand_in_build"]  # and only the function's walk ran


def test_load_plugins_hooks_only_imported_modules_and_walks_for_none_of_them_on_0_5_17():
    """What load_plugins() costs on 0.5.17: hooks on the modules imported before it (server_args, two methods, no
    walk of sys.modules); an entry whose module comes later is registered, applied and walked at that import."""
    code = """if True:
        import json, sys
        import sglang.srt.server_args
        from sglang.srt.plugins import hook_registry, load_plugins
        from sglang.srt.plugins.hook_registry import HookRegistry
        walked, walk = [], hook_registry._propagate_patch
        hook_registry._propagate_patch = lambda original, *rest: walked.append(original.__qualname__) or walk(original, *rest)
        load_plugins()
        at_load = {"registered": sorted(HookRegistry._hooks), "walked": list(walked),
                   "kv_cache_builder imported": "sglang.srt.mem_cache.kv_cache_builder" in sys.modules}
        from sglang.srt.mem_cache import kv_cache_builder
        print(json.dumps({"at_load": at_load, "registered": sorted(HookRegistry._hooks),
                          "applied": sorted(HookRegistry._patched), "walked": walked}))
    """
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_PLUGINS", "SGLANG_ENABLE_DCP_DSPARK_PLUGIN")}
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    resolution = sorted((server_args_hooks.RESOLVER, DEFAULT_BACKEND))
    assert got["at_load"] == {"registered": resolution, "walked": [], "kv_cache_builder imported": False}
    assert got["registered"] == got["applied"] == sorted([*resolution, kv_cache_hooks.DRAFT_REGISTRATION])
    assert got["walked"] == ["maybe_register_hicache_draft"]  # a module function: its from-import copies are rebound


def test_register_does_nothing_when_switched_off(monkeypatch, caplog):
    import sys

    monkeypatch.setenv("SGLANG_ENABLE_DCP_DSPARK_PLUGIN", "off")
    monkeypatch.setattr(plugin, "active", None)
    finders = list(sys.meta_path)
    with caplog.at_level("INFO", logger="sglang_dcp_dspark"):
        plugin.register()
        plugin.register()
    assert plugin.active is False and sys.meta_path == finders
    assert [r.getMessage() for r in caplog.records] == [
        "dcp_dspark: plugin off (SGLANG_ENABLE_DCP_DSPARK_PLUGIN=off); no sglang code is hooked"]


# status: the plugin's line


class _Series:
    def __init__(self, name, state):

        self.series = type("S", (), {"name": name})()
        self.state = patching.State(state)


@pytest.mark.parametrize(
    "version,statuses,environ,says",
    [
        ("0.5.17", [("sglang-0.5.17", "applicable")], {}, "enabled            fixed at run time by the plugin (series not needed)"),
        ("0.5.17.post1", [], {}, "fixed at run time by the plugin (series not needed)"),
        ("0.5.17", [("sglang-0.5.17", "applicable")], {"SGLANG_ENABLE_DCP_DSPARK_PLUGIN": "0"},
         "off                switched off: SGLANG_ENABLE_DCP_DSPARK_PLUGIN=0; only the series would do: `sglang-dcp-dspark apply --series sglang-0.5.17`"),
        ("0.5.17", [("sglang-0.5.17", "applicable")], {"SGLANG_PLUGINS": "other"}, "sglang skips it: SGLANG_PLUGINS=other"),
        ("0.5.17", [("sglang-0.5.17", "applied")], {}, "series sglang-0.5.17 applied; the plugin stands aside"),
        ("0.5.16", [], {}, "the plugin does not handle sglang 0.5.16; only a series would do: no series here applies"),
        (None, [], {}, "the plugin does not handle sglang of unknown version"),
        # The pass map shows 0.5.18's speculative passes reading other rows under DCP: the speculative check is its carry.
        ("0.5.18", [], {}, "sglang 0.5.18 carries the fix upstream; at run time the plugin refuses under DCP, at argument "
                           "time, the speculative launches the pass map shows reading other rows"),
        ("0.5.16", [], {}, "the plugin does not handle sglang 0.5.16"),
        ("0.5.19", [], {}, "sglang 0.5.19 carries the fix upstream; at run time the plugin stops a short draft sidecar at startup"),
        ("0.5.22", [], {}, "at run time the plugin prices the draft sidecar in auto-sizing and stops a short draft sidecar at startup"),
        ("0.5.23", [("upstream-next", "applicable")], {},
         "sglang 0.5.23 carries the fix upstream; at run time the plugin counts the draft sidecar in --hicache-size, prices the "
         "draft sidecar in auto-sizing, stops a short draft sidecar at startup and checks each draft plan against its DCP "
         "layout, and refuses under DCP, at argument time, the speculative launches the pass map shows reading other rows "
         "(and a plain launch on a backend whose passes it shows broken); series upstream-next also applies"),
        ("0.5.23", [("upstream-next", "applied")], {}, "series upstream-next applied; the plugin stands aside"),
        ("0.5.23", [], {"SGLANG_ENABLE_DCP_DSPARK_PLUGIN": "0"}, "so the plugin's sidecar hooks are off: unset"),
    ],
)
def test_status_line(version, statuses, environ, says):
    line = plugin_status.status_line(version, [_Series(*s) for s in statuses], environ)
    assert line.startswith("plugin dcp_dspark") and says in line and "\n" not in line


def test_status_command_on_the_installed_stock_tree(capsys, monkeypatch):
    from sglang_dcp_dspark.__main__ import main

    monkeypatch.delenv("SGLANG_ENABLE_DCP_DSPARK_PLUGIN", raising=False)
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    assert main(["status"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].strip() == ("plugin dcp_dspark      enabled            fixed at run time by the plugin (series not needed); "
                              "it also refuses under DCP, at argument time, the speculative launches the pass map shows "
                              "reading other rows (and a plain launch on a backend whose passes it shows broken)")


def test_the_runtime_plugin_imports_only_what_a_launch_needs():
    """Loading the entry point pulls in the hooks and the switch: no sglang yet, no CLI, no test scaffolding."""
    import importlib.util
    import json
    import subprocess
    import sys

    code = "import sys, sglang_dcp_dspark.plugin; print(__import__('json').dumps(sorted(sys.modules)))"
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    ours = {m for m in loaded if m.startswith("sglang_dcp_dspark")}
    # The hook table with its carriers (each declares its entries by reference) and the arithmetic one of them uses:
    # every process pays for this much only, and none of it imports sglang or torch.
    carriers = {f"sglang_dcp_dspark.plugin.hooks.{name}" for name in (
        "common", "entry", "server_args", "kv_cache_builder", "scheduler", "hybrid_pool_assembler", "hicache_auto_size",
        "hicache_hook", "overrides", "speculative_hook", "flashinfer_mla_backend", "forward_mla")}
    assert ours == {
        "sglang_dcp_dspark", "sglang_dcp_dspark.plugin", "sglang_dcp_dspark.plugin.switch", "sglang_dcp_dspark.plugin.hooks",
        "sglang_dcp_dspark.plugin.decisions", "sglang_dcp_dspark.core", "sglang_dcp_dspark.core.rules", *carriers,
    }, ours
    assert not [m for m in loaded if m.split(".")[0] in ("sglang", "torch")]
    # The scheduler start-up and draft-row helpers only tests use live under test/, not in the wheel.
    assert importlib.util.find_spec("sglang_dcp_dspark.hostpool") is None


def test_every_table_entry_resolves_to_its_carrier_and_a_series_patch():
    """One table for register() and preflight: each hook names the sglang module, its judge and hook, and the patch."""
    from sglang_dcp_dspark.plugin.hooks import hicache_auto_size, hybrid_pool_assembler, speculative_hook
    from sglang_dcp_dspark.plugin.hooks import hicache_hook as hicache_gate

    assert [h.target for h in hooks.HOOKS] == [
        server_args_hooks.RESOLVER, server_args_hooks.DEFAULT_BACKEND, kv_cache_hooks.DRAFT_REGISTRATION,
        scheduler_hooks.INIT_MEMORY_POOLS, assembler_hooks.KV_ONLY_STACK, assembler_hooks.KV_ONLY_GROUP,
        assembler_hooks.FULL_DRAFT_POOLS, auto_size_hooks.DRAFT_BYTES, auto_size_hooks.ESTIMATE, hicache_gate.GATE,
        overrides_hooks.DEFAULT_BACKEND, speculative_hooks.SPECULATIVE, verify_hooks.METADATA, verify_hooks.GRAPH, verify_hooks.FORWARD,
        verify_hooks.DRAFT_DECODE, phase_hooks.PHASE,
    ]
    assert [h.hook for h in hooks.HOOKS] == [
        server_args_hooks.admit_dspark, server_args_hooks.pick_flashinfer_under_dcp,
        kv_cache_hooks.size_draft_from_logical, scheduler_hooks.count_draft_in_budget,
        hybrid_pool_assembler.count_sidecar_in_budget, hybrid_pool_assembler.size_target_from_share,
        hybrid_pool_assembler.guard_sidecar, hicache_auto_size.price_logical_rows, hicache_auto_size.note_sidecar_drafts,
        hicache_gate.admit_proven_drafts, overrides_hooks.pick_flashinfer_under_dcp, speculative_hook.refuse_broken_passes, verify_hooks.plan_verify_eager, verify_hooks.plan_verify_graph,
        verify_hooks.verify_with_lse, verify_hooks.plan_draft_decode, phase_hooks.draft_extend_phase,
    ]
    assert [h.judge for h in hooks.HOOKS] == [
        server_args_hooks.resolver_verdict, server_args_hooks.default_verdict, kv_cache_hooks.registration_verdict,
        scheduler_hooks.budget_verdict, hybrid_pool_assembler.budget_verdict, hybrid_pool_assembler.group_verdict,
        hybrid_pool_assembler.guard_verdict, hicache_auto_size.auto_size_verdict, hicache_auto_size.estimate_verdict,
        hicache_gate.gate_verdict, overrides_hooks.default_verdict, speculative_hook.passes_verdict, verify_hooks.verify_verdict, verify_hooks.same_verdict,
        verify_hooks.same_verdict, verify_hooks.draft_decode_verdict, phase_hooks.phase_verdict,
    ]
    for h in hooks.HOOKS:
        assert h.target.startswith(h.module + ".") and h.does
        assert h.series_patch.startswith(("sglang-0.5.17/", "upstream-next/"))
        assert (REPO / "patches" / h.series_patch.split("/")[0]).is_dir()
    assert hooks.BY_TARGET[kv_cache_hooks.DRAFT_REGISTRATION].check_only() is kv_cache_hooks.check_only_if_needed()


def test_the_hooks_import_no_plugin_module():
    """No import cycle: the hook carriers reach the plugin's parts (decisions, guard, dcp_verify) as modules, never
    a name the plugin's entry point defines (register, findings), which imports the table they are part of."""
    import ast

    plugin_dir = REPO / "python" / "sglang_dcp_dspark" / "plugin"
    parts = {p.stem for p in plugin_dir.glob("*.py") if p.stem != "__init__"} | {"hooks"}
    carriers = sorted((plugin_dir / "hooks").glob("*.py"))
    assert len(carriers) >= 10, carriers  # the table, common, entry and the eight carriers
    for path in carriers:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 2 and node.module is None:
                assert {alias.name for alias in node.names} <= parts, (path.name, [a.name for a in node.names])
            if isinstance(node, ast.ImportFrom) and node.level == 2 and node.module:
                assert node.module.split(".")[0] in parts, (path.name, node.module)
