"""sglang general plugin: the DCP + HiCache + DSPARK fix on an unedited sglang tree.

Entry point ``dcp_dspark`` in the ``sglang.srt.plugins`` group; sglang's
``load_plugins()`` calls :func:`register` in the launcher, the Engine and every
scheduler process. Its only effect is hooks registered with sglang's
``HookRegistry``, one module per patched sglang module, listed in one table
(:data:`hooks.HOOKS`, which preflight reads too):

- :mod:`hooks.server_args`: an AROUND hook on
  ``ServerArgs._resolve_hicache_dcp_compatibility`` that lets DSPARK through
  the HiCache+DCP gate, refuses every other algorithm in series patch 0001's
  words, and leaves every other gate to sglang;
- :mod:`hooks.kv_cache_builder`: an AROUND hook on
  ``maybe_register_hicache_draft`` that makes sglang's own registration size
  the draft host pool from the target's ``logical_size``, then checks the
  result with :mod:`guard` and logs what HiCache pins per rank;
- :mod:`hooks.scheduler`: an AROUND hook on ``Scheduler.init_memory_pools``
  that counts the draft host pool in ``--hicache-size`` and stops a launch
  whose host pools cannot fit in free RAM (:mod:`budget`, :mod:`rules`);
- here, an AFTER hook on sglang's ``configure_logger`` that changes nothing
  and only writes the decisions above into the log once sglang has
  configured it.

Each hook is registered only after asking the code it would patch how it
behaves (the "probes"): a resolver that already admits DSPARK, or a
registration that already covers the logical slots (sglang 0.5.18+, or the
series applied), is left alone; code that does not behave like 0.5.17 is left
alone with a warning. One exception fails closed: on a release older than the
upstream fix, a draft registration the probe cannot judge gets a check-only
hook, which runs sglang's own registration and then the guard, because the
launcher may already have admitted DSPARK and a scheduler must never run with
a short draft host pool.

Probes run on CPU with pinning off, never import ``sgl_kernel``, catch every
exception (an unrecognised tree gets a warning, never a crashed import), and
keep sglang's own log lines about the tiny probe pools out of the log.

Importing ``kv_cache_builder`` or the scheduler costs seconds, and only
schedulers register a draft, so a module that is not imported yet is not
imported here: the hook is registered the moment something else imports it.

``SGLANG_ENABLE_DCP_DSPARK_PLUGIN=0`` turns the plugin off (:mod:`switch`).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import logging
import sys
from collections.abc import Callable

from . import decisions, switch
from .hooks import BY_TARGET, HOOKS, Hook

# Names sglang's entry point, preflight and the tests reach through this
# module. Looked up on first use (PEP 562): load_plugins() runs register() in
# every sglang process, which needs none of them.
_LAZY = {
    "DRAFT_REGISTRATION": "hooks.kv_cache_builder", "check_draft_registration": "hooks.kv_cache_builder",
    "fixed_registration": "hooks.kv_cache_builder", "logical_rows_view": "hooks.kv_cache_builder",
    "registration_verdict": "hooks.kv_cache_builder", "size_draft_from_logical": "hooks.kv_cache_builder",
    "INIT_MEMORY_POOLS": "hooks.scheduler", "budget_verdict": "hooks.scheduler", "count_draft_in_budget": "hooks.scheduler",
    "DSPARK_ONLY": "hooks.server_args", "RESOLVER": "hooks.server_args", "admit_dspark": "hooks.server_args",
    "resolver_verdict": "hooks.server_args",
    "KV_ONLY_STACK": "hooks.hybrid_pool_assembler", "KV_ONLY_GROUP": "hooks.hybrid_pool_assembler",
    "FULL_DRAFT_POOLS": "hooks.hybrid_pool_assembler", "DRAFT_BYTES": "hooks.hicache_auto_size",
    "ESTIMATE": "hooks.hicache_auto_size", "SPECULATIVE": "hooks.speculative_hook",
    "FIXED_UPSTREAM_IN": "hooks._common", "WRITTEN_FOR": "hooks._common", "Finding": "hooks._common",
    "Overlay": "hooks._common", "Verdict": "hooks._common", "by_version": "hooks._common",
    "version_at_least": "hooks._common",
}
_RENAMED = {"_check_only_if_needed": ("hooks.kv_cache_builder", "check_only_if_needed")}


def __getattr__(name: str):
    if name in _LAZY or name in _RENAMED:
        module, attr = _RENAMED.get(name, (_LAZY.get(name), name))
        value = getattr(importlib.import_module(f"{__package__}.{module}"), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["HOOKS", "handles", "register", "status_line", *sorted(_LAZY)]

PLUGIN_NAME = switch.PLUGIN_NAME

# What register() decided per target in this process; read by preflight and tests.
findings: dict = {}
# True once register() has acted in this process, False when it found the plugin switched off.
active: bool | None = None
# The plugin name sglang's load_plugins() set while register() ran, so hooks
# registered later (a module imported after load_plugins()) are attributed too.
_source = None


# ------------------------------------------------------------------ register


def handles(version: str | None) -> bool:
    """Is this the release the 0.5.17 hooks were written for (any post or local build of it)?"""
    from .compat import parse_version
    from .hooks._common import WRITTEN_FOR

    parsed = parse_version(version)
    return parsed is not None and parsed.release[:3] == parse_version(WRITTEN_FOR).release[:3]


def _exists(target: str) -> bool:
    import pkgutil

    try:
        pkgutil.resolve_name(target)
    except Exception:
        return False
    return True


def _judge(target: str, judge: Callable):
    from .hooks._common import by_version

    try:
        return judge()
    except Exception as exc:  # a probe never breaks sglang's import
        return by_version(target, f"probe raised {type(exc).__name__}: {exc}")


def _decide(target: str, judge: Callable, hook: Callable, check_only: Callable | None = None) -> None:
    """Judge one target, register its hook if it needs one, and say so (see :mod:`decisions`)."""
    if target in findings:  # register() is re-entrant: decide and log once per process
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .hooks._common import Verdict

    finding = _judge(target, judge)
    findings[target] = finding
    if finding.verdict is Verdict.NEEDS_FIX:
        HookRegistry.register(target, hook, HookType.AROUND, source=_source)
        entry = BY_TARGET.get(target)
        if entry is not None:
            entry.installed()
        does = f"; the hook {entry.does}" if entry is not None else ""
        decisions.say(logging.INFO, f"{PLUGIN_NAME}: hooked {target}: {finding.detail}{does}")
    elif finding.verdict in (Verdict.FIXED, Verdict.OUT_OF_SCOPE):
        decisions.say(logging.INFO, f"{PLUGIN_NAME}: left {target} alone ({finding.verdict.value}): {finding.detail}")
    elif check_only is not None and _exists(target):
        HookRegistry.register(target, check_only, HookType.AROUND, source=_source)
        decisions.say(
            logging.WARNING,
            f"{PLUGIN_NAME}: code not recognised, check-only hook on {target}: sglang's own sizing runs and "
            f"startup stops if the draft host pool is short: {finding.detail}",
        )
    else:
        decisions.say(logging.WARNING, f"{PLUGIN_NAME}: code not recognised, left {target} alone: {finding.detail}")


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback once, right after one module finishes importing."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps find_spec below from finding us
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module
        callback = self.callback

        def exec_then_register(module) -> None:
            exec_module(module)
            callback()

        spec.loader.exec_module = exec_then_register
        return spec


def _when_imported(name: str, callback: Callable[[bool], None]) -> None:
    module = sys.modules.get(name)
    if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
        callback(False)
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, lambda: callback(True)))


def _apply_late(late: bool) -> None:
    if late:
        # load_plugins() applied hooks before this module was imported; apply
        # again (a no-op for targets already patched). Not done in the normal
        # path, where it could run before other plugins add hooks to a target.
        from sglang.srt.plugins.hook_registry import HookRegistry

        HookRegistry.apply_hooks()


def _hook(target: str, judge: Callable, hook: Callable, late: bool, check_only: Callable | None = None) -> None:
    # Runs inside sglang's import of the target module: nothing may escape.
    try:
        _decide(target, judge, hook, check_only)
        _apply_late(late)
    except Exception as exc:
        from .hooks._common import Finding, Verdict

        findings.setdefault(target, Finding(target, Verdict.UNRECOGNISED, f"{type(exc).__name__}: {exc}"))
        decisions.say(logging.WARNING, f"{PLUGIN_NAME}: code not recognised, left {target} alone: {type(exc).__name__}: {exc}")


def register() -> None:
    """Entry point for sglang's ``load_plugins()``; safe to call more than once."""
    global active, _source
    state = switch.switch_state()
    if not state.enabled:
        if active is None:
            # Registers nothing, so the line goes out now: at WARNING, Python
            # writes it to stderr before any logging setup.
            decisions.loud.warning("%s: plugin off (%s); no sglang code is hooked", PLUGIN_NAME, state.reason)
        active = False
        return
    active = True
    if _source is None:
        try:
            from sglang.srt.plugins import hook_registry

            _source = hook_registry._current_plugin_source.get()
        except Exception:  # attribution only
            pass
    decisions.watch()
    for module in dict.fromkeys(hook.module for hook in HOOKS):
        _when_imported(module, functools.partial(_hook_module, module))


def _hook_module(module: str, late: bool) -> None:
    # Every entry on the module, in table order (an entry may follow an earlier one's verdict).
    for hook in HOOKS:
        if hook.module == module:
            _hook_from_table(hook, late)


def _hook_from_table(hook: Hook, late: bool) -> None:
    # The judge and the hooks are looked up now, when sglang imports the module;
    # this runs inside that import, so nothing may escape.
    if not _exists(hook.target):
        # Nothing to hook, and nothing a check-only hook could sit on: said without
        # importing the carrier, so a release that needs none of an entry pays nothing for it.
        from .hooks._common import Finding, Verdict

        owner, name = hook.target.rsplit(".", 1)
        if hook.target not in findings:
            findings[hook.target] = Finding(hook.target, Verdict.OUT_OF_SCOPE, f"{owner} has no {name} in this release; nothing to hook")
            decisions.say(logging.INFO, f"{PLUGIN_NAME}: left {hook.target} alone ({Verdict.OUT_OF_SCOPE.value}): "
                                        f"{findings[hook.target].detail}")
        return
    try:
        around, check_only = hook.hook, hook.check_only()
    except Exception as exc:
        from .hooks._common import Finding, Verdict

        findings.setdefault(hook.target, Finding(hook.target, Verdict.UNRECOGNISED, f"{type(exc).__name__}: {exc}"))
        decisions.say(logging.WARNING, f"{PLUGIN_NAME}: code not recognised, left {hook.target} alone: {type(exc).__name__}: {exc}")
        return
    _hook(hook.target, hook.judged, around, late, check_only)


# ------------------------------------------------------------------ status


# What the plugin carries on each release after the upstream fix, as its
# judges find the code there (the per-release plugin tests hold the two to
# each other): the sidecar guard from 0.5.19, the auto-size fix from 0.5.21
# (where hicache_auto_size appears), the budget from 0.5.23 (where the stack
# first sees the draft sidecar) and the NextN (MTP) admission with its plan
# check from 0.5.23 (whose CacheInitParams carries the draft plans the check
# reads). The sharded draft
# backup stays series-only.
SIDECAR_CARRIES = (
    ("0.5.23", "counts the draft sidecar in --hicache-size, prices the draft sidecar in auto-sizing, stops a short "
               "draft sidecar at startup and checks each draft plan against its DCP layout"),
    ("0.5.21", "prices the draft sidecar in auto-sizing and stops a short draft sidecar at startup (the budget needs "
               "0.5.23's CacheInitParams)"),
    ("0.5.19", "stops a short draft sidecar at startup (no auto-sizing before 0.5.21; the budget needs 0.5.23's CacheInitParams)"),
)
SIDECAR_FROM = "0.5.19"


def sidecar_carries(version: str | None) -> str | None:
    """What the hooks do on this release after the upstream fix, or None where they have nothing to hook.

    The sidecar hooks by release (:data:`SIDECAR_CARRIES`); the speculative
    check wherever the pass map shows a launch kind that reads other rows
    under DCP (:func:`passes.broken_kinds`).
    """
    from . import passes
    from .compat import parse_version

    parsed = parse_version(version)
    if parsed is None or parsed.release[:2] != (0, 5):
        return None
    does = next((text for floor, text in SIDECAR_CARRIES if parsed >= parse_version(floor)), None)
    release = passes.release_key(version)
    if release in passes.releases() and passes.measured(release) and passes.broken_kinds(release):
        check = "refuses under DCP, at argument time, the speculative launches the pass map shows reading other rows"
        does = f"{does}, and {check}" if does else check
    return does


def status_line(version: str | None, series_statuses=(), environ=None) -> str:
    """One line for ``sglang-dcp-dspark status``: what the plugin does for this tree at run time, and what only a series would.

    Judged from the version and the environment, without importing the tree;
    at start-up the hooks judge the code itself. ``series_statuses`` (from
    ``series.inspect``) say whether a series is in the tree or would apply.
    """
    import os

    from .hooks._common import FIXED_UPSTREAM_IN, version_at_least

    state = switch.plugin_state(os.environ if environ is None else environ)
    label = f"{'plugin ' + PLUGIN_NAME:<22} {('enabled' if state.enabled else 'off'):<18}"
    applied = [s.series.name for s in series_statuses if s.state.value == "applied"]
    applicable = [s.series.name for s in series_statuses if s.state.value == "applicable"]
    series_fix = (
        f"`sglang-dcp-dspark apply --series {applicable[0]}`" if applicable else "no series here applies to this release"
    )
    if applied:
        return f"{label} series {', '.join(applied)} applied; the plugin stands aside"
    if version_at_least(version, FIXED_UPSTREAM_IN):
        carries = sidecar_carries(version)
        also = f"; series {applicable[0]} also applies: {series_fix}" if applicable else ""
        if carries is None:
            return f"{label} sglang {version} carries the fix upstream; the plugin leaves it alone{also}"
        if not switch.entry_point_installed():
            return (f"{label} sglang {version} carries the fix upstream; the dcp_dspark entry point is not installed "
                    f"(pip install sglang-dcp-dspark), so nothing {carries.split(' (')[0]}{also}")
        if not state.enabled:
            return (f"{label} sglang {version} carries the fix upstream; {state.reason}, so the plugin's sidecar "
                    f"hooks are off: {switch.TURN_ON}{also}")
        return f"{label} sglang {version} carries the fix upstream; at run time the plugin {carries}{also}"
    if not handles(version):
        return f"{label} the plugin does not handle sglang {version or 'of unknown version'}; only a series would do: {series_fix}"
    if not switch.entry_point_installed():
        return f"{label} the dcp_dspark entry point is not installed (pip install sglang-dcp-dspark); only the series would do: {series_fix}"
    if not state.enabled:
        return f"{label} {state.reason}; only the series would do: {series_fix}, or turn the plugin on: {switch.TURN_ON}"
    return f"{label} fixed at run time by the plugin (series not needed)"
