"""sglang general plugin: the DCP + HiCache + DSPARK fix on an unedited sglang tree.

Entry point ``dcp_dspark`` in the ``sglang.srt.plugins`` group; sglang's
``load_plugins()`` calls :func:`register` in the launcher, the Engine and every
scheduler process. This module does one job: it registers the entries of the
one hook table (:data:`hooks.HOOKS`, which preflight reads too) with sglang's
``HookRegistry`` when their sglang module is imported, and says what it
decided (:mod:`decisions`). What each hook does lives in its carrier under
:mod:`hooks`; what ``status`` says of the plugin, in :mod:`commands.status`.

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

__all__ = ["HOOKS", "register"]

PLUGIN_NAME = switch.PLUGIN_NAME

# What register() decided per target in this process; read by preflight and tests.
findings: dict = {}
# True once register() has acted in this process, False when it found the plugin switched off.
active: bool | None = None
# The plugin name sglang's load_plugins() set while register() ran, so hooks
# registered later (a module imported after load_plugins()) are attributed too.
_source = None


# ------------------------------------------------------------------ register


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
    # The entry is judged now, when sglang imports the module; this runs inside
    # that import, so nothing may escape.
    if not _exists(hook.target):
        # Nothing to hook, and nothing a check-only hook could sit on: said without running the judge.
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
