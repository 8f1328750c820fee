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
  free RAM (:mod:`budget`).

Each hook is registered only after asking the code it would patch how it
behaves: a resolver that already admits DSPARK, or a registration that already
covers the logical slots (sglang 0.5.18+, or the series applied), is left
alone with one info line; code that does not behave like 0.5.17 is left alone
with one warning.

Importing ``kv_cache_builder`` or the scheduler costs seconds, and only
schedulers register a draft, so a module that is not imported yet is not imported here: the hook is
registered the moment something else imports it.
"""

from __future__ import annotations

import enum
import importlib.abc
import importlib.util
import logging
import sys
from dataclasses import dataclass
from typing import Callable

logger = logging.getLogger(__name__)

PLUGIN_NAME = "dcp_dspark"
SERVER_ARGS = "sglang.srt.server_args"
KV_CACHE_BUILDER = "sglang.srt.mem_cache.kv_cache_builder"
SCHEDULER = "sglang.srt.managers.scheduler"
INIT_MEMORY_POOLS = f"{SCHEDULER}.Scheduler.init_memory_pools"
RESOLVER = f"{SERVER_ARGS}.ServerArgs._resolve_hicache_dcp_compatibility"
DRAFT_REGISTRATION = f"{KV_CACHE_BUILDER}.maybe_register_hicache_draft"
FIXED_UPSTREAM_IN = "0.5.18"


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

    tree_cache = kwargs.get("tree_cache")
    controller = getattr(tree_cache, "cache_controller", None)
    if controller is None or getattr(controller, "mem_pool_host", None) is None:
        return original(*args, **kwargs)
    from . import budget

    result = original(*args, **{**kwargs, "tree_cache": logical_rows_view(tree_cache)})
    guard.check_cache_controller(controller)
    budget.log_pinned(controller)
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
    from .compat import installed_sglang_version, parse_version

    version = installed_sglang_version()
    parsed = parse_version(version)
    if parsed is not None and parsed >= parse_version(FIXED_UPSTREAM_IN):
        return Finding(INIT_MEMORY_POOLS, Verdict.OUT_OF_SCOPE, f"the budget hook is for sglang 0.5.17, found {version}")
    if init_memory_pools is None:
        from sglang.srt.managers.scheduler import Scheduler

        init_memory_pools = getattr(Scheduler, "init_memory_pools", None)
    if init_memory_pools is None:
        return Finding(INIT_MEMORY_POOLS, Verdict.UNRECOGNISED, "Scheduler has no init_memory_pools")
    probe = hostpool.Geometry(dcp_size=2, device_rows=64, page_size=16, target_layers=1, hicache_size_gb=1.0)
    scheduler = hostpool.scheduler_stand_in(probe)
    try:
        init_memory_pools(scheduler)
    except Exception as exc:
        return Finding(INIT_MEMORY_POOLS, Verdict.UNRECOGNISED, f"budget probe failed: {type(exc).__name__}: {exc}")
    if scheduler.server_args.hicache_size != probe.hicache_size_gb:
        return Finding(INIT_MEMORY_POOLS, Verdict.FIXED, "init_memory_pools already counts the draft in --hicache-size")
    return Finding(INIT_MEMORY_POOLS, Verdict.NEEDS_FIX, "--hicache-size sizes the target host pool alone")


def count_draft_in_budget(original: Callable, scheduler, *args, **kwargs):
    """AROUND hook for ``Scheduler.init_memory_pools``: device pools first, then the host budget."""
    from . import budget

    result = original(scheduler, *args, **kwargs)
    budget.fit_hicache_size(scheduler)
    return result


# ----------------------------------------------------------------- register


def _by_version(target: str, why: str) -> Finding:
    """Behaviour was inconclusive: a release that carries the fix upstream is fine, anything else is unknown."""
    from .compat import installed_sglang_version, parse_version

    version = installed_sglang_version()
    parsed = parse_version(version)
    if parsed is not None and parsed >= parse_version(FIXED_UPSTREAM_IN):
        return Finding(target, Verdict.FIXED, f"sglang {version} carries the fix upstream ({why})")
    return Finding(target, Verdict.UNRECOGNISED, f"sglang {version or 'of unknown version'}: {why}")


def _decide(target: str, judge: Callable[[], Finding], hook: Callable) -> None:
    if target in findings:  # register() is re-entrant: decide and log once per process
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    finding = judge()
    findings[target] = finding
    if finding.verdict is Verdict.NEEDS_FIX:
        HookRegistry.register(target, hook, HookType.AROUND)
        logger.info("%s: hooking %s: %s", PLUGIN_NAME, target, finding.detail)
    elif finding.verdict in (Verdict.FIXED, Verdict.OUT_OF_SCOPE):
        logger.info("%s: leaving %s alone: %s", PLUGIN_NAME, target, finding.detail)
    else:
        logger.warning("%s: not patching %s, code not recognised: %s", PLUGIN_NAME, target, finding.detail)


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


def _hook(target: str, judge: Callable[[], Finding], hook: Callable, late: bool) -> None:
    _decide(target, judge, hook)
    if late:
        # load_plugins() applied hooks before this module was imported; apply
        # again (a no-op for targets already patched). Not done in the normal
        # path, where it could run before other plugins add hooks to a target.
        from sglang.srt.plugins.hook_registry import HookRegistry

        HookRegistry.apply_hooks()


def register() -> None:
    """Entry point for sglang's ``load_plugins()``; safe to call more than once."""
    _when_imported(SERVER_ARGS, lambda late: _hook(RESOLVER, resolver_verdict, admit_dspark, late))
    _when_imported(KV_CACHE_BUILDER, lambda late: _hook(DRAFT_REGISTRATION, registration_verdict, size_draft_from_logical, late))
    _when_imported(SCHEDULER, lambda late: _hook(INIT_MEMORY_POOLS, budget_verdict, count_draft_in_budget, late))
