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

import contextlib
import functools
import importlib.abc
import importlib.util
import logging
import sys
from collections.abc import Callable

from . import switch
from .hooks import BY_TARGET, HOOKS, Hook
from .hooks._common import FIXED_UPSTREAM_IN, WRITTEN_FOR, Finding, Overlay, Verdict, by_version, version_at_least
from .hooks.kv_cache_builder import (
    DRAFT_REGISTRATION,
    check_draft_registration,
    fixed_registration,
    logical_rows_view,
    registration_verdict,
    size_draft_from_logical,
)
from .hooks.kv_cache_builder import check_only_if_needed as _check_only_if_needed
from .hooks.scheduler import INIT_MEMORY_POOLS, budget_verdict, count_draft_in_budget
from .hooks.server_args import DSPARK_ONLY, RESOLVER, admit_dspark, resolver_verdict

# Re-exported: the names sglang's entry point, preflight and the tests reach through this module.
__all__ = [
    "DRAFT_REGISTRATION", "DSPARK_ONLY", "FIXED_UPSTREAM_IN", "HOOKS", "INIT_MEMORY_POOLS", "RESOLVER",
    "WRITTEN_FOR", "Finding", "Overlay", "Verdict", "admit_dspark", "budget_verdict", "check_draft_registration",
    "count_draft_in_budget", "fixed_registration", "handles", "logical_rows_view", "register",
    "registration_verdict", "resolver_verdict", "size_draft_from_logical", "status_line",
    "_check_only_if_needed",  # the tests ask which hook the registration would get
]

logger = logging.getLogger(__name__)
# Lines an operator must see whatever --log-level says (code not recognised,
# plugin off). A logger pinned at WARNING passes them on to sglang's handlers
# even when sglang sets the root logger to ERROR.
loud = logging.getLogger(f"{__name__}.always")
loud.setLevel(logging.WARNING)

PLUGIN_NAME = switch.PLUGIN_NAME
LOGGING_SETUP = "sglang.srt.utils.common"
CONFIGURE_LOGGER = f"{LOGGING_SETUP}.configure_logger"


# What register() decided per target in this process; read by preflight and tests.
findings: dict[str, Finding] = {}
# True once register() has acted in this process, False when it found the plugin switched off.
active: bool | None = None


# ------------------------------------------------------------ decision log
#
# sglang calls load_plugins() before it configures logging (launch_server,
# Engine, and run_scheduler_process, which calls configure_logger right after),
# so anything logged while register() runs meets a root logger with no handler
# and INFO lines vanish. The decisions are therefore kept here and written by
# an AFTER hook on sglang's own configure_logger: the first moment each process
# has sglang's format, prefix (" TP0" ...) and level in place. HookRegistry
# re-points the scheduler's `from ... import configure_logger` binding, so the
# scheduler's own call reaches the hook. Decisions taken after that (a module
# imported later) are logged at once. Where the observer cannot be installed
# (sglang moved configure_logger), the first call into a hooked function
# writes them instead, which in a scheduler is also after logging is set up.

_pending: list[tuple[logging.Logger, int, str]] = []
# The plugin name sglang's load_plugins() set while register() ran, so hooks
# registered later (a module imported after load_plugins()) are attributed too.
_source = None
_live = False
_observer_installed = False


def _say(level: int, message: str) -> None:
    out = loud if level >= logging.WARNING else logger
    if _live:
        out.log(level, message)
    else:
        _pending.append((out, level, message))


def _flush() -> None:
    global _live
    _live = True
    while _pending:
        out, level, message = _pending.pop(0)
        out.log(level, message)


def logging_configured(result, *args, **kwargs):
    """AFTER hook for sglang's ``configure_logger``: write the decisions taken so far."""
    with contextlib.suppress(Exception):  # a log line is never worth a failed start-up
        _flush()
    return None  # keep configure_logger's own result


def _first_call() -> None:
    # A process that configured logging before load_plugins() never reaches the
    # observer; by the first hooked call its handlers are in place. Without any
    # handler, keep waiting: the launcher calls the resolver before configure_logger.
    if not _live and (not _observer_installed or logging.getLogger().handlers):
        _flush()


# ------------------------------------------------------------------ register


def handles(version: str | None) -> bool:
    """Is this the release the plugin's hooks were written for (any post or local build of it)?"""
    from .compat import parse_version

    parsed = parse_version(version)
    return parsed is not None and parsed.release[:3] == parse_version(WRITTEN_FOR).release[:3]


def _exists(target: str) -> bool:
    import pkgutil

    try:
        pkgutil.resolve_name(target)
    except Exception:
        return False
    return True


def _judge(target: str, judge: Callable[[], Finding]) -> Finding:
    try:
        return judge()
    except Exception as exc:  # a probe never breaks sglang's import
        return by_version(target, f"probe raised {type(exc).__name__}: {exc}")


def _decide(target: str, judge: Callable[[], Finding], hook: Callable, check_only: Callable | None = None) -> None:
    """Judge one target, register its hook if it needs one, and say so (see the decision log above)."""
    if target in findings:  # register() is re-entrant: decide and log once per process
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    finding = _judge(target, judge)
    findings[target] = finding
    if finding.verdict is Verdict.NEEDS_FIX:
        HookRegistry.register(target, hook, HookType.AROUND, source=_source)
        entry = BY_TARGET.get(target)
        does = f"; the hook {entry.does}" if entry is not None else ""
        _say(logging.INFO, f"{PLUGIN_NAME}: hooked {target}: {finding.detail}{does}")
    elif finding.verdict in (Verdict.FIXED, Verdict.OUT_OF_SCOPE):
        _say(logging.INFO, f"{PLUGIN_NAME}: left {target} alone ({finding.verdict.value}): {finding.detail}")
    elif check_only is not None and _exists(target):
        HookRegistry.register(target, check_only, HookType.AROUND, source=_source)
        _say(
            logging.WARNING,
            f"{PLUGIN_NAME}: code not recognised, check-only hook on {target}: sglang's own sizing runs and "
            f"startup stops if the draft host pool is short: {finding.detail}",
        )
    else:
        _say(logging.WARNING, f"{PLUGIN_NAME}: code not recognised, left {target} alone: {finding.detail}")


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


def _hook(target: str, judge: Callable[[], Finding], hook: Callable, late: bool, check_only: Callable | None = None) -> None:
    # Runs inside sglang's import of the target module: nothing may escape.
    try:
        _decide(target, judge, hook, check_only)
        _apply_late(late)
    except Exception as exc:
        findings.setdefault(target, Finding(target, Verdict.UNRECOGNISED, f"{type(exc).__name__}: {exc}"))
        _say(logging.WARNING, f"{PLUGIN_NAME}: code not recognised, left {target} alone: {type(exc).__name__}: {exc}")


def _observe_logging(late: bool) -> None:
    global _observer_installed
    if _observer_installed:
        return
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        if not _exists(CONFIGURE_LOGGER):
            return  # the first hooked call writes the decisions instead
        HookRegistry.register(CONFIGURE_LOGGER, logging_configured, HookType.AFTER, source=_source)
        _observer_installed = True
        _apply_late(late)
    except Exception:
        pass


def register() -> None:
    """Entry point for sglang's ``load_plugins()``; safe to call more than once."""
    global active, _source
    state = switch.switch_state()
    if not state.enabled:
        if active is None:
            # Registers nothing, not even the log observer, so the line goes out
            # now: at WARNING, Python writes it to stderr before any logging setup.
            loud.warning("%s: plugin off (%s); no sglang code is hooked", PLUGIN_NAME, state.reason)
        active = False
        return
    active = True
    if _source is None:
        try:
            from sglang.srt.plugins import hook_registry

            _source = hook_registry._current_plugin_source.get()
        except Exception:  # attribution only
            pass
    _when_imported(LOGGING_SETUP, _observe_logging)
    for hook in HOOKS:
        _when_imported(hook.module, functools.partial(_hook_from_table, hook))


def _hook_from_table(hook: Hook, late: bool) -> None:
    # The judge and the hooks are looked up now, when sglang imports the module;
    # this runs inside that import, so nothing may escape.
    try:
        around, check_only = hook.hook, hook.check_only()
    except Exception as exc:
        findings.setdefault(hook.target, Finding(hook.target, Verdict.UNRECOGNISED, f"{type(exc).__name__}: {exc}"))
        _say(logging.WARNING, f"{PLUGIN_NAME}: code not recognised, left {hook.target} alone: {type(exc).__name__}: {exc}")
        return
    _hook(hook.target, hook.judged, around, late, check_only)


# ------------------------------------------------------------------ status


def status_line(version: str | None, series_statuses=(), environ=None) -> str:
    """One line for ``sglang-dcp-dspark status``: does the plugin fix this tree at run time, or only a series?

    Judged from the version and the environment, without importing the tree:
    the hooks were written for ``WRITTEN_FOR``; ``series_statuses`` (from
    ``series.inspect``) say whether a series is in the tree or would apply.
    """
    import os

    state = switch.plugin_state(os.environ if environ is None else environ)
    label = f"{'plugin ' + PLUGIN_NAME:<22} {('enabled' if state.enabled else 'off'):<18}"
    applied = [s.series.name for s in series_statuses if s.state.value == "applied"]
    applicable = [s.series.name for s in series_statuses if s.state.value == "applicable"]
    series_fix = (
        f"`sglang-dcp-dspark apply --series {applicable[0]}`" if applicable else "no series here applies to this release"
    )
    if version_at_least(version, FIXED_UPSTREAM_IN):
        also = f"; series {applicable[0]} also applies: {series_fix}" if applicable else ""
        return f"{label} sglang {version} carries the fix upstream; the plugin leaves it alone{also}"
    if applied:
        return f"{label} series {', '.join(applied)} applied; the plugin stands aside"
    if not handles(version):
        return f"{label} the plugin does not handle sglang {version or 'of unknown version'}; only a series would do: {series_fix}"
    if not switch.entry_point_installed():
        return f"{label} the dcp_dspark entry point is not installed (pip install sglang-dcp-dspark); only the series would do: {series_fix}"
    if not state.enabled:
        return f"{label} {state.reason}; only the series would do: {series_fix}, or turn the plugin on: {switch.TURN_ON}"
    return f"{label} fixed at run time by the plugin (series not needed)"
