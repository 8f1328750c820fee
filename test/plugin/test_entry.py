"""Hook.decide: the one decision on a table entry, which plugin.register and preflight both act on."""

from __future__ import annotations

import logging

import pytest

from sglang_dcp_dspark import plugin
from sglang_dcp_dspark.core import compat
from sglang_dcp_dspark.plugin import decisions, hooks
from sglang_dcp_dspark.plugin.hooks import entry
from sglang_dcp_dspark.plugin.hooks.common import Finding, Verdict

TARGET = "json.dumps"  # any target that exists: nothing here is patched
ABSENT = "json.no_such_function"


def around(original, *args, **kwargs):
    return ("hooked", original(*args, **kwargs))


def check_only(original, *args, **kwargs):
    return ("checked", original(*args, **kwargs))


def make(verdict: Verdict | None, *, target: str = TARGET, check_only_if=None, calls: list | None = None) -> entry.Hook:
    """An entry whose judge says ``verdict`` (None: raises), recording each call."""
    def judge(original=None):
        if calls is not None:
            calls.append(original)
        if verdict is None:
            raise AttributeError("a name from a later release")
        return Finding(target, verdict, f"judged {verdict.name}")

    return entry.Hook(module=target.rsplit(".", 1)[0], target=target, judge=judge, hook=around, does="changes it",
                      why="", upstream="", drop_when="", series_patch="", check_only_if=check_only_if,
                      stage=entry.POOLS_STAGE)


@pytest.mark.parametrize("verdict,check,want,level,line", [
    (Verdict.NEEDS_FIX, None, around, logging.INFO, f"hooked {TARGET}: judged NEEDS_FIX; the hook changes it"),
    (Verdict.FIXED, lambda: check_only, None, logging.INFO, f"left {TARGET} alone (already fixed): judged FIXED"),
    (Verdict.OUT_OF_SCOPE, lambda: check_only, None, logging.INFO,
     f"left {TARGET} alone (not for this release): judged OUT_OF_SCOPE"),
    (Verdict.UNRECOGNISED, lambda: check_only, check_only, logging.WARNING,
     f"code not recognised, check-only hook on {TARGET}: sglang's own sizing runs"),
    (Verdict.UNRECOGNISED, lambda: None, None, logging.WARNING,  # no check-only hook for this release
     f"code not recognised, left {TARGET} alone: judged UNRECOGNISED"),
    (Verdict.UNRECOGNISED, None, None, logging.WARNING, f"code not recognised, left {TARGET} alone: judged UNRECOGNISED"),
])
def test_each_verdict_decides_one_hook_and_one_line(verdict, check, want, level, line):
    decision = make(verdict, check_only_if=check).decide()
    assert decision.finding.verdict is verdict and decision.around is want
    assert decision.hooked is (want is around) and decision.check_only is (want is check_only)
    assert decision.line[0] == level and decision.line[1].startswith(line), decision.line


def test_a_target_the_release_lacks_is_out_of_scope_without_a_judge():
    calls: list = []
    decision = make(Verdict.NEEDS_FIX, target=ABSENT, calls=calls).decide()
    assert calls == [] and decision.around is None
    assert decision.finding == Finding(ABSENT, Verdict.OUT_OF_SCOPE, "json has no no_such_function in this release; "
                                                                     "nothing to hook")
    assert decision.line == (logging.INFO, f"left {ABSENT} alone (not for this release): {decision.finding.detail}")


@pytest.mark.parametrize("version,verdict", [("0.5.17", Verdict.UNRECOGNISED), ("0.5.18", Verdict.FIXED)])
def test_a_probe_that_raises_is_judged_by_the_release(monkeypatch, version, verdict):
    monkeypatch.setattr(compat, "installed_sglang_version", lambda: version)
    decision = make(None, check_only_if=lambda: check_only).decide()
    assert decision.finding.verdict is verdict and "probe raised AttributeError" in decision.finding.detail
    assert decision.around is (check_only if verdict is Verdict.UNRECOGNISED else None)


def test_a_check_only_hook_that_raises_is_not_recognised_and_installs_nothing():
    def broken():
        raise RuntimeError("cannot tell")

    decision = make(Verdict.UNRECOGNISED, check_only_if=broken).decide()
    assert decision.around is None and decision.finding.detail == "RuntimeError: cannot tell"
    assert decision.line == (logging.WARNING, f"code not recognised, left {TARGET} alone: RuntimeError: cannot tell")


def test_preflight_wraps_what_the_decision_names():
    def original(x):
        return x + 1

    calls: list = []
    finding, wrapped = make(Verdict.NEEDS_FIX, calls=calls).wrap(original)
    assert calls == [original] and finding.verdict is Verdict.NEEDS_FIX  # judged on the function preflight holds
    assert wrapped(1) == ("hooked", 2) and wrapped.__wrapped__ is original
    finding, wrapped = make(Verdict.UNRECOGNISED, check_only_if=lambda: check_only).wrap(original)
    assert wrapped(1) == ("checked", 2)
    # check_only=False: a caller that reports a short draft itself gets sglang's function back
    finding, wrapped = make(Verdict.UNRECOGNISED, check_only_if=lambda: check_only).wrap(original, check_only=False)
    assert wrapped is original and finding.verdict is Verdict.UNRECOGNISED
    finding, wrapped = make(Verdict.FIXED).wrap(original)
    assert wrapped is original


def test_a_function_sglangs_registry_wrapped_already_is_left_alone():
    def original(x):
        return x

    scope: dict = {"functools": __import__("functools"), "original": original}
    exec(compile("@functools.wraps(original)\ndef wrapper(*a, **k):\n    return original(*a, **k)\n",
                 "/site-packages/sglang/srt/plugins/hook_registry.py", "exec"), scope)
    calls: list = []
    finding, wrapped = make(Verdict.NEEDS_FIX, calls=calls).wrap(scope["wrapper"])
    assert calls == [] and wrapped is scope["wrapper"]
    assert finding == Finding(TARGET, Verdict.FIXED, "hooked already in this process (load_plugins)")


@pytest.fixture
def registered(monkeypatch):
    """sglang's HookRegistry.register recorded, not applied; a fresh decision record; lines out at once."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    calls = []
    monkeypatch.setattr(HookRegistry, "register",
                        classmethod(lambda cls, target, hook, kind, **kw: calls.append((target, hook, kind.name))))
    monkeypatch.setattr(plugin, "findings", {})
    monkeypatch.setattr(decisions, "_live", True)
    return calls


@pytest.mark.parametrize("verdict,check", [
    (Verdict.NEEDS_FIX, None), (Verdict.UNRECOGNISED, lambda: check_only), (Verdict.UNRECOGNISED, None),
    (Verdict.FIXED, None), (Verdict.OUT_OF_SCOPE, None),
])
def test_the_plugin_registers_and_logs_what_the_decision_says(registered, caplog, verdict, check):
    hook = make(verdict, check_only_if=check)
    decision = hook.decide()
    with caplog.at_level("INFO", logger="sglang_dcp_dspark.plugin"):
        plugin.install(hook)
        plugin.install(hook)  # re-entrant: decided, registered and logged once
    assert registered == ([(TARGET, decision.around, "AROUND")] if decision.around else [])
    assert plugin.findings == {TARGET: decision.finding}
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (decision.line[0], f"{plugin.PLUGIN_NAME}: {decision.line[1]}")]


def test_the_plugin_never_raises_into_sglangs_import(registered, monkeypatch, caplog):
    from sglang.srt.plugins.hook_registry import HookRegistry

    def refuses(cls, *args, **kwargs):
        raise TypeError("a registry from a later release")

    monkeypatch.setattr(HookRegistry, "register", classmethod(refuses))
    with caplog.at_level("INFO", logger="sglang_dcp_dspark.plugin"):
        plugin.install(make(Verdict.NEEDS_FIX))  # must not raise
    assert [r.getMessage() for r in caplog.records] == [
        f"{plugin.PLUGIN_NAME}: code not recognised, left {TARGET} alone: TypeError: a registry from a later release"]
    assert plugin.findings[TARGET].verdict is Verdict.NEEDS_FIX  # what the judge found stands


def test_only_the_entry_decides():
    """The plugin and preflight act on Hook.decide alone: neither judges, picks a hook or words a line itself."""
    import inspect

    from sglang_dcp_dspark.plugin import hooks as table

    for module in (plugin, table):
        source = inspect.getsource(module)
        assert ".judge(" not in source and ".judged(" not in source and "check_only()" not in source, module
        assert "code not recognised" not in source and "in this release; nothing to hook" not in source, module
    assert inspect.getsource(entry).count("code not recognised") == 2  # left alone, check-only: one place each


def test_every_entry_names_its_stage_and_preflight_reads_the_resolution_modules_from_the_table():
    from sglang_dcp_dspark.preflight import releases

    assert {h.stage for h in hooks.HOOKS} <= set(hooks.STAGES)
    assert all(h.stage for h in hooks.HOOKS)
    # Table order; the argument-resolution modules of every release the table covers.
    assert hooks.modules(hooks.RESOLUTION_STAGE) == (
        "sglang.srt.server_args", "sglang.srt.arg_groups.hicache_hook", "sglang.srt.arg_groups.overrides",
        "sglang.srt.arg_groups.speculative_hook")
    assert releases.Release.resolution_modules() == hooks.modules(hooks.RESOLUTION_STAGE)
    assert hooks.modules() == tuple(dict.fromkeys(h.module for h in hooks.HOOKS))


def test_replace_copies_every_field():
    first = hooks.HOOKS[0]
    copy = first.replace(why="changed")
    assert copy is not first and copy.why == "changed"
    assert all(getattr(copy, f) == getattr(first, f) for f in entry.Hook.__slots__ if f != "why")
