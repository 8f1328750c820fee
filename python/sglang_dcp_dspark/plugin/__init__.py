"""sglang general plugin: the DCP + HiCache + DSPARK fix on an unedited sglang tree.

Entry point ``dcp_dspark`` in the ``sglang.srt.plugins`` group; sglang's
``load_plugins()`` calls :func:`register` in the launcher, the Engine and every
scheduler process. This module does one job: when sglang imports the module an
entry of the one hook table sits on (:data:`hooks.HOOKS`, which preflight reads
too), it asks the entry's one decision (:meth:`hooks.Hook.decide`), registers
the AROUND hook that decision names with sglang's ``HookRegistry``, and logs
the decision's line (:mod:`decisions`). What each hook does lives in its
carrier under :mod:`hooks`; what ``status`` says of the plugin, in
:mod:`status`.

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

After patching a target, sglang's HookRegistry walks every loaded module to
rebind ``from X import Y`` copies of it: some 15 ms per target at
``load_plugins()`` on 0.5.17, where both hooks on ``server_args`` (imported
before ``load_plugins()`` in every entry point) made it twice the plugin's
budget. A method has no such copies, so for the plugin's method targets that
walk is left out (:func:`_spare_walk`); a module function still gets it.

``SGLANG_ENABLE_DCP_DSPARK_PLUGIN=0`` turns the plugin off (:mod:`switch`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable

from . import decisions, switch
from .hooks import HOOKS, Decision, Hook

__all__ = ["HOOKS", "install", "register"]

PLUGIN_NAME = switch.PLUGIN_NAME

# What register() decided per target in this process; read by preflight and tests.
findings: dict = {}
# True once register() has acted in this process, False when it found the plugin switched off.
active: bool | None = None
# The plugin name sglang's load_plugins() set while register() ran, so hooks
# registered later (a module imported after load_plugins()) are attributed too.
_source = None


# ------------------------------------------------------------------ register


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
        _when_imported(module, functools.partial(_install_module, module))


def _install_module(module: str, late: bool) -> None:
    # Every entry on the module, in table order (an entry may follow an earlier one's verdict).
    for hook in HOOKS:
        if hook.module == module:
            install(hook, late=late)


def install(hook: Hook, *, late: bool = False) -> None:
    """Decide one table entry on this release and do what the decision says: register its AROUND hook, if it
    names one, with sglang's HookRegistry, and log its line.

    Called when sglang imports ``hook.module``, inside that import: nothing
    may escape. Re-entrant: an entry is decided and logged once per process
    (:data:`findings`). ``late``: the module was imported after
    ``load_plugins()`` applied the registered hooks, so they are applied again.
    """
    try:
        if hook.target not in findings:
            decision = hook.decide()
            findings[hook.target] = decision.finding
            if decision.around is not None:
                from sglang.srt.plugins.hook_registry import HookRegistry, HookType

                HookRegistry.register(hook.target, decision.around, HookType.AROUND, source=_source)
                # Only a cost is at stake: where the walk cannot be spared, sglang walks as it always does.
                with contextlib.suppress(Exception):
                    _spare_walk(hook.target)
                if decision.hooked:
                    hook.installed()
            _say(decision)
        if late:
            _apply_late()
    except Exception as exc:
        decision = Decision.raised(hook, exc)
        findings.setdefault(hook.target, decision.finding)
        _say(decision)


def _say(decision: Decision) -> None:
    level, line = decision.line
    decisions.say(level, f"{PLUGIN_NAME}: {line}")


def _apply_late() -> None:
    # load_plugins() applied hooks before this module was imported; apply
    # again (a no-op for targets already patched). Not done in the normal
    # path, where it could run before other plugins add hooks to a target.
    from sglang.srt.plugins.hook_registry import HookRegistry

    HookRegistry.apply_hooks()


# ------------------------------------------------------------------ sglang's walk

# The class attributes the plugin hooks, by the id of the function sglang's HookRegistry patches there:
# (that function, its class).
_methods: dict[int, tuple[Callable, type]] = {}


def _spare_walk(target: str) -> None:
    """Let sglang's HookRegistry apply the hook on ``target`` without walking sys.modules, if ``target`` is a method.

    Once it has patched a target, the registry looks through every attribute
    of every loaded module for the original and rebinds it: that is how a
    ``from X import Y`` copy of a module function gets the hook too. A method
    is reached through its class, and ``from X import Y`` never binds one, so
    the walk (about 4,300 modules at ``load_plugins()`` on 0.5.17, some 15 ms)
    finds nothing for it. Every other target, the plugin's module functions
    and other plugins' targets alike, is walked as sglang walks it.
    """
    import pkgutil

    from sglang.srt.plugins import hook_registry

    owner_path, name = target.rsplit(".", 1)
    owner = pkgutil.resolve_name(owner_path)
    if not isinstance(owner, type):
        return
    # The function the registry will patch: a classmethod's or staticmethod's own, else what the class gives.
    declared = owner.__dict__.get(name)
    original = declared.__func__ if isinstance(declared, (classmethod, staticmethod)) else getattr(owner, name)
    _methods[id(original)] = (original, owner)
    walk = getattr(hook_registry, "_propagate_patch", None)
    if walk is None or getattr(walk, "spares_methods", False):
        return  # a release without the walk, or spared already in this process

    @functools.wraps(walk)
    def propagate(original, wrapped, source_module):
        if _methods.get(id(original)) == (original, source_module):
            return 0  # one of the plugin's methods: no module holds a copy to rebind
        return walk(original, wrapped, source_module)

    propagate.spares_methods = True
    hook_registry._propagate_patch = propagate


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
