"""sglang general plugin: the DCP + HiCache + DSPARK fix on an unedited sglang tree.

Entry point ``dcp_dspark`` in the ``sglang.srt.plugins`` group; sglang's
``load_plugins()`` calls :func:`register` in the launcher, the Engine and every
scheduler process. Its only effect is hooks registered with sglang's
``HookRegistry``:

- an AROUND hook on ``ServerArgs._resolve_hicache_dcp_compatibility`` that lets
  DSPARK through the HiCache+DCP gate and leaves every other gate to sglang;
- an AROUND hook on ``kv_cache_builder.maybe_register_hicache_draft`` that
  makes sglang's own registration size the draft host pool from the target's
  ``logical_size``, then checks the result with :mod:`guard` and logs what
  HiCache pins per rank;
- an AROUND hook on ``Scheduler.init_memory_pools`` that counts the draft host
  pool in ``--hicache-size`` and stops a launch whose host pools cannot fit in
  free RAM (:mod:`budget`);
- an AFTER hook on sglang's ``configure_logger`` that changes nothing and only
  writes the decisions above into the log once sglang has configured it.

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
import enum
import importlib.abc
import importlib.util
import logging
import sys
from dataclasses import dataclass
from typing import Callable, Iterator

from . import switch

logger = logging.getLogger(__name__)
# Lines an operator must see whatever --log-level says (code not recognised,
# plugin off). A logger pinned at WARNING passes them on to sglang's handlers
# even when sglang sets the root logger to ERROR.
loud = logging.getLogger(f"{__name__}.always")
loud.setLevel(logging.WARNING)

PLUGIN_NAME = switch.PLUGIN_NAME
SERVER_ARGS = "sglang.srt.server_args"
KV_CACHE_BUILDER = "sglang.srt.mem_cache.kv_cache_builder"
SCHEDULER = "sglang.srt.managers.scheduler"
LOGGING_SETUP = "sglang.srt.utils.common"
INIT_MEMORY_POOLS = f"{SCHEDULER}.Scheduler.init_memory_pools"
RESOLVER = f"{SERVER_ARGS}.ServerArgs._resolve_hicache_dcp_compatibility"
DRAFT_REGISTRATION = f"{KV_CACHE_BUILDER}.maybe_register_hicache_draft"
CONFIGURE_LOGGER = f"{LOGGING_SETUP}.configure_logger"
FIXED_UPSTREAM_IN = "0.5.18"
# The release whose code the hooks were written against and tested on.
WRITTEN_FOR = "0.5.17"


class Verdict(enum.Enum):
    NEEDS_FIX = "needs the fix"
    FIXED = "already fixed"
    UNRECOGNISED = "not recognised"
    OUT_OF_SCOPE = "not for this release"


@dataclass(frozen=True)
class Finding:
    target: str
    verdict: Verdict
    detail: str


# What register() decided per target in this process; read by preflight and tests.
findings: dict[str, Finding] = {}
# True once register() has acted in this process, False when it found the plugin switched off.
active: bool | None = None


class Overlay:
    """Another object, seen with a few attributes replaced.

    Reads of other attributes and every write go to the real object, so code
    that is handed an overlay changes the real one. ``__class__`` reports the
    real class, so sglang's isinstance checks see through it.
    """

    def __init__(self, target: object, **replaced: object) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_replaced", replaced)

    @property
    def __class__(self):  # noqa: D105 - isinstance() consults this
        return type(object.__getattribute__(self, "_target"))

    def __getattr__(self, name: str):
        replaced = object.__getattribute__(self, "_replaced")
        if name in replaced:
            return replaced[name]
        return getattr(object.__getattribute__(self, "_target"), name)

    def __setattr__(self, name: str, value: object) -> None:
        setattr(object.__getattribute__(self, "_target"), name, value)


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
    try:
        _flush()
    except Exception:  # a log line is never worth a failed start-up
        pass
    return None  # keep configure_logger's own result


def _first_call() -> None:
    # A process that configured logging before load_plugins() never reaches the
    # observer; by the first hooked call its handlers are in place. Without any
    # handler, keep waiting: the launcher calls the resolver before configure_logger.
    if not _live and (not _observer_installed or logging.getLogger().handlers):
        _flush()


# ------------------------------------------------------------------ probes


@contextlib.contextmanager
def _probing() -> Iterator[None]:
    """Keep sglang's log lines about the probe's tiny pools out of the log.

    Lines like "KV Cache is allocated ... #tokens: 64" would read as the real
    pools' in the launcher. The probe's outcome is reported by the decision
    line instead. Probes run single-threaded inside an import or load_plugins().
    """
    sglang_logger = logging.getLogger("sglang")
    level = sglang_logger.level
    sglang_logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        sglang_logger.setLevel(level)


def _version_at_least(version: str | None, floor: str) -> bool:
    from .compat import parse_version

    parsed = parse_version(version)
    return parsed is not None and parsed >= parse_version(floor)


def handles(version: str | None) -> bool:
    """Is this the release the plugin's hooks were written for (any post or local build of it)?"""
    from .compat import parse_version

    parsed = parse_version(version)
    return parsed is not None and parsed.release[:3] == parse_version(WRITTEN_FOR).release[:3]


# ---------------------------------------------------------------- resolver


class _ResolverProbe:
    """The fields the 0.5.17 HiCache+DCP gate reads, for one launch it should judge."""

    def __init__(self, speculative_algorithm: str | None) -> None:
        self.dcp_size = 2
        self.enable_hierarchical_cache = True
        self.hicache_storage_backend = None
        self.speculative_algorithm = speculative_algorithm
        self.enable_lmcache = False
        self.enable_hisparse = False

    def use_mla_backend(self) -> bool:
        return True


def _gate_outcome(resolve: Callable, algorithm: str | None) -> str:
    try:
        resolve(_ResolverProbe(algorithm))
    except NotImplementedError:
        return "rejected"
    except Exception as exc:  # reads a field 0.5.17 does not have: another resolver
        return f"error: {type(exc).__name__}: {exc}"
    return "admitted"


def resolver_verdict(resolve: Callable | None = None) -> Finding:
    """Does this resolver reject DSPARK under DCP + HiCache, and is it the gate we know?"""
    if resolve is None:
        from sglang.srt.server_args import ServerArgs

        resolve = getattr(ServerArgs, "_resolve_hicache_dcp_compatibility", None)
    if resolve is None:
        return _by_version(RESOLVER, "ServerArgs has no _resolve_hicache_dcp_compatibility")
    with _probing():
        plain, dspark, eagle = (_gate_outcome(resolve, a) for a in (None, "DSPARK", "EAGLE"))
    if plain != "admitted" or eagle != "rejected" or dspark.startswith("error"):
        return _by_version(RESOLVER, f"gate probe: no draft {plain}, EAGLE {eagle}, DSPARK {dspark}")
    if dspark == "admitted":
        return Finding(RESOLVER, Verdict.FIXED, "the resolver already admits DSPARK under DCP + HiCache")
    return Finding(RESOLVER, Verdict.NEEDS_FIX, "the resolver rejects DSPARK under DCP + HiCache")


def admit_dspark(original: Callable, server_args, *args, **kwargs):
    """AROUND hook for the resolver.

    0.5.17 refuses every draft algorithm because draft host pools had no DCP
    index translation. DSPARK's draft KV is replicated and indexed by logical
    slots, so once its host pool spans ``logical_size`` (the other hook) it
    needs none. The remaining gates (L3 storage, LMCache, HiSparse, non-MLA)
    still judge the launch: sglang's own gate runs on a view without the draft.
    """
    _first_call()
    if (
        server_args.speculative_algorithm == "DSPARK"
        and server_args.dcp_size > 1
        and server_args.enable_hierarchical_cache
    ):
        return original(Overlay(server_args, speculative_algorithm=None), *args, **kwargs)
    return original(server_args, *args, **kwargs)


# ------------------------------------------------------- draft registration


def registration_verdict(register_draft: Callable | None = None) -> Finding:
    """Does this registration size the draft host pool from physical rows?

    Asked of the real function on real, tiny MLA pools at dcp 2 (CPU, unpinned).
    """
    from . import hostpool

    if register_draft is None:
        from sglang.srt.mem_cache import kv_cache_builder

        register_draft = getattr(kv_cache_builder, "maybe_register_hicache_draft", None)
    if register_draft is None:
        return _by_version(DRAFT_REGISTRATION, "kv_cache_builder has no maybe_register_hicache_draft")
    probe = hostpool.Geometry(dcp_size=2, device_rows=64, page_size=16, target_layers=1, draft_layers=1)
    try:
        with _probing():
            pair = hostpool.build_pools(probe, register=register_draft)
    except Exception as exc:
        return _by_version(DRAFT_REGISTRATION, f"registration probe failed: {type(exc).__name__}: {exc}")
    if pair.draft_host_pool is None:
        return _by_version(DRAFT_REGISTRATION, "registration probe registered no draft host pool")
    target, draft = pair.target_host_pool, pair.draft_host_pool
    if draft.size >= target.logical_size:
        return Finding(DRAFT_REGISTRATION, Verdict.FIXED, "the draft host pool already spans logical_size")
    if draft.size >= target.size:
        return Finding(
            DRAFT_REGISTRATION,
            Verdict.NEEDS_FIX,
            f"the draft host pool is sized from physical rows ({draft.size} rows for {target.logical_size} logical slots at dcp 2)",
        )
    return _by_version(DRAFT_REGISTRATION, f"unexpected draft rows {draft.size} for target {target.size}/{target.logical_size}")


def logical_rows_view(tree_cache):
    """``tree_cache`` whose target host pool reports its logical slots as ``size``.

    0.5.17's registration sizes the draft as ``primary.size / pool.size``; seen
    through this view ``primary.size`` is the logical slot count, so sglang's
    own code builds a draft host pool with one row per logical slot. Writes
    (``set_draft_kv_pool``) land on the real cache controller.
    """
    controller = tree_cache.cache_controller
    host = controller.mem_pool_host
    return Overlay(tree_cache, cache_controller=Overlay(controller, mem_pool_host=Overlay(host, size=host.logical_size)))


def size_draft_from_logical(original: Callable, *args, **kwargs):
    """AROUND hook for ``maybe_register_hicache_draft`` (keyword-only in 0.5.17)."""
    from . import guard

    _first_call()
    tree_cache = kwargs.get("tree_cache")
    controller = getattr(tree_cache, "cache_controller", None)
    if controller is None or getattr(controller, "mem_pool_host", None) is None:
        return original(*args, **kwargs)
    from . import budget

    result = original(*args, **{**kwargs, "tree_cache": logical_rows_view(tree_cache)})
    # Still short after the logical view: whatever ran under this hook did not
    # size from primary.size (another plugin's REPLACE, a hand edit).
    guard.check_cache_controller(controller, remedy=guard.Remedy.SHADOWED)
    budget.log_pinned(controller)
    return result


def check_draft_registration(original: Callable, *args, **kwargs):
    """Check-only AROUND hook: sglang's own registration, unchanged, then the guard.

    Installed where the probe could not judge a registration on a release that
    needs the fix. The launcher may have admitted DSPARK already, so this
    scheduler either finds a draft host pool that spans the logical slots or
    stops at startup with the guard's one-line error.
    """
    from . import guard

    _first_call()
    result = original(*args, **kwargs)
    for candidate in (*args, *kwargs.values()):
        controller = getattr(candidate, "cache_controller", None)
        if controller is not None and getattr(controller, "mem_pool_host", None) is not None:
            guard.check_cache_controller(controller, remedy=guard.Remedy.SERIES_MISSING)
    return result


# ------------------------------------------------------- host memory budget


def budget_verdict(init_memory_pools: Callable | None = None) -> Finding:
    """Does the scheduler count the draft host pool in --hicache-size?

    Asked of the real ``Scheduler.init_memory_pools`` on a stand-in scheduler
    around tiny device pools: one that already fits the budget (the 0.5.17
    series' patch 0004) changes ``hicache_size``, stock 0.5.17 does not. The
    hook is written against 0.5.17's scheduler; newer releases size their host
    pools elsewhere (patches/upstream-next carries the budget for them).
    """
    from . import hostpool
    from .compat import installed_sglang_version

    version = installed_sglang_version()
    if _version_at_least(version, FIXED_UPSTREAM_IN):
        return Finding(INIT_MEMORY_POOLS, Verdict.OUT_OF_SCOPE, f"the budget hook is for sglang {WRITTEN_FOR}, found {version}")
    if init_memory_pools is None:
        from sglang.srt.managers.scheduler import Scheduler

        init_memory_pools = getattr(Scheduler, "init_memory_pools", None)
    if init_memory_pools is None:
        return Finding(INIT_MEMORY_POOLS, Verdict.UNRECOGNISED, "Scheduler has no init_memory_pools")
    probe = hostpool.Geometry(dcp_size=2, device_rows=64, page_size=16, target_layers=1, hicache_size_gb=1.0)
    try:
        # The stand-in builds real device pools: a pool signature from another
        # release fails here, and must fail into a verdict, not out of an import.
        with _probing():
            scheduler = hostpool.scheduler_stand_in(probe)
            init_memory_pools(scheduler)
    except Exception as exc:
        return Finding(INIT_MEMORY_POOLS, Verdict.UNRECOGNISED, f"budget probe failed: {type(exc).__name__}: {exc}")
    if scheduler.server_args.hicache_size != probe.hicache_size_gb:
        return Finding(INIT_MEMORY_POOLS, Verdict.FIXED, "init_memory_pools already counts the draft in --hicache-size")
    return Finding(INIT_MEMORY_POOLS, Verdict.NEEDS_FIX, "--hicache-size sizes the target host pool alone")


def count_draft_in_budget(original: Callable, scheduler, *args, **kwargs):
    """AROUND hook for ``Scheduler.init_memory_pools``: device pools first, then the host budget."""
    from . import budget

    _first_call()
    result = original(scheduler, *args, **kwargs)
    budget.fit_hicache_size(scheduler)
    return result


# ----------------------------------------------------------------- register


def _by_version(target: str, why: str) -> Finding:
    """Behaviour was inconclusive: a release that carries the fix upstream is fine, anything else is unknown."""
    from .compat import installed_sglang_version

    version = installed_sglang_version()
    if _version_at_least(version, FIXED_UPSTREAM_IN):
        return Finding(target, Verdict.FIXED, f"sglang {version} carries the fix upstream ({why})")
    return Finding(target, Verdict.UNRECOGNISED, f"sglang {version or 'of unknown version'}: {why}")


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
        return _by_version(target, f"probe raised {type(exc).__name__}: {exc}")


def _decide(target: str, judge: Callable[[], Finding], hook: Callable, check_only: Callable | None = None) -> None:
    """Judge one target, register its hook if it needs one, and say so (see the decision log above)."""
    if target in findings:  # register() is re-entrant: decide and log once per process
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    finding = _judge(target, judge)
    findings[target] = finding
    if finding.verdict is Verdict.NEEDS_FIX:
        HookRegistry.register(target, hook, HookType.AROUND, source=_source)
        _say(logging.INFO, f"{PLUGIN_NAME}: hooked {target}: {finding.detail}")
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
    _when_imported(SERVER_ARGS, lambda late: _hook(RESOLVER, resolver_verdict, admit_dspark, late))
    _when_imported(
        KV_CACHE_BUILDER,
        lambda late: _hook(DRAFT_REGISTRATION, registration_verdict, size_draft_from_logical, late, _check_only_if_needed()),
    )
    _when_imported(SCHEDULER, lambda late: _hook(INIT_MEMORY_POOLS, budget_verdict, count_draft_in_budget, late))


def _check_only_if_needed() -> Callable | None:
    """The check-only hook where sglang's registration may size from physical rows: releases before the fix."""
    from .compat import installed_sglang_version

    try:
        fixed_upstream = _version_at_least(installed_sglang_version(), FIXED_UPSTREAM_IN)
    except Exception:  # runs inside sglang's import; an unknown version is guarded
        fixed_upstream = False
    return None if fixed_upstream else check_draft_registration


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
    if _version_at_least(version, FIXED_UPSTREAM_IN):
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
