"""Hooks on ``sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler``: the sidecar budget and guard (0.5.19+).

patches/upstream-next carries two changes to this module, and here they ride
on sglang's own functions instead:

- 0001, the budget: ``build_kv_only_stack`` sizes the target host pool from
  all of ``--hicache-size`` and ``build_full_draft_pools`` pins the draft
  sidecar on top, dcp_size draft rows per target row. The AROUND hook on the
  stack works out the target's share, t / (t + dcp_size * d) of the budget,
  exactly as 0001 does (:func:`rules.sidecar_target_hicache_size`), and the
  hook on ``build_kv_only_group``, which the stack calls, hands it on as the
  ``host_size`` argument 0001 passes. Where ``CacheInitParams`` carries no
  ``sidecar_draft_device_pools`` (before 0.5.23) the stack cannot see the
  draft, and the release is left alone.
- 0003, the guard: after ``build_full_draft_pools``, a draft sidecar with
  fewer rows than the target's logical slots stops startup with one line,
  and what HiCache pins per rank is logged once.
- 0009, the plan check: at the top of the stack, a packed draft not
  striped like the target, or an EAGLE draft in a sidecar, stops startup.

``SGLANG_HICACHE_SIZE_EXCLUDES_DRAFT=1`` turns the budget off, as it does
for the series.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable

from ...core import rules
from .common import Finding, Verdict, first_call, probing, unhooked
from .entry import POOLS_STAGE, Hook

MODULE = "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler"
KV_ONLY_STACK = f"{MODULE}.build_kv_only_stack"
KV_ONLY_GROUP = f"{MODULE}.build_kv_only_group"
FULL_DRAFT_POOLS = f"{MODULE}.build_full_draft_pools"

# On the assembler's own logger, where 0001 and 0003 log the same lines.
logger = logging.getLogger(MODULE)

# The target's share of --hicache-size, from the stack hook to the group hook within one build_kv_only_stack call.
_target_host_size: contextvars.ContextVar[float | None] = contextvars.ContextVar("dcp_dspark_target_host_size", default=None)


class DraftSidecarTooSmall(ValueError):
    """Raised while the scheduler builds its tree cache, before the draft sidecar is used.

    A ValueError, as sglang's own refusals in this module are, so that its
    launcher reports it the same way.
    """


def _assembler():
    import importlib

    return importlib.import_module(MODULE)


# ------------------------------------------------------------------ probes


def _probe_rank(**fields):
    from ...core import sidecar

    return sidecar.Rank(dcp_size=2, device_rows=64, page_size=16, target_layers=1, **fields)


def _probe_pools(stack: Callable | None = None, drafts: bool = True, **fields):
    """Tiny sidecar pools at dcp 2 through ``stack`` (default: the module's own), on the meta device."""
    from ...core import sidecar, swap

    rank = _probe_rank(**fields)
    own = contextlib.nullcontext() if stack is None else swap.attribute(_assembler(), "build_kv_only_stack", stack)
    with probing(), sidecar.on_rank(rank), own:
        pools = sidecar.device_pools(rank)
        params = sidecar.cache_params(pools, sidecar_draft_device_pools=(pools.draft_device,) if drafts else ())
        return sidecar.build(rank, pools, params)


def _sees_sidecar_drafts() -> str | None:
    """Why ``build_kv_only_stack`` cannot see the draft sidecar here; None when it can."""
    import dataclasses

    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    if "sidecar_draft_device_pools" not in {f.name for f in dataclasses.fields(CacheInitParams)}:
        return ("CacheInitParams has no sidecar_draft_device_pools (0.5.23 adds it), so build_kv_only_stack cannot "
                "see the draft sidecar and the budget cannot count it")
    return None


def budget_verdict(stack: Callable | None = None) -> Finding:
    """Does ``build_kv_only_stack`` leave room in --hicache-size for the draft sidecar?

    Asked of the real stack on tiny pools at dcp 2 with a small budget: the
    target host pool built with a sidecar draft in the params is compared
    with the one built without. Stock 0.5.23 builds the same target both
    ways; the series' 0001 shrinks it.
    """
    if stack is None:
        stack = unhooked(getattr(_assembler(), "build_kv_only_stack", None))
    if stack is None:
        return Finding(KV_ONLY_STACK, Verdict.OUT_OF_SCOPE, "hybrid_pool_assembler has no build_kv_only_stack")
    blind = _sees_sidecar_drafts()
    if blind is not None:
        return Finding(KV_ONLY_STACK, Verdict.OUT_OF_SCOPE, blind)
    try:
        # 1e-4 GB: about a hundred target rows at the probe's geometry.
        alone = _probe_pools(stack, drafts=False, hicache_size=1e-4).target_host.size
        shared = _probe_pools(stack, drafts=True, hicache_size=1e-4).target_host.size
    except Exception as exc:
        return Finding(KV_ONLY_STACK, Verdict.UNRECOGNISED, f"budget probe failed: {type(exc).__name__}: {exc}")
    if shared < alone:
        return Finding(KV_ONLY_STACK, Verdict.FIXED, "--hicache-size already holds the draft sidecar")
    if shared == alone:
        return Finding(KV_ONLY_STACK, Verdict.NEEDS_FIX,
                       f"--hicache-size sizes the target host pool alone ({alone} rows with or without a draft sidecar at dcp 2)")
    return Finding(KV_ONLY_STACK, Verdict.UNRECOGNISED, f"a draft sidecar grew the target host pool ({alone} -> {shared} rows)")


def group_verdict(group: Callable | None = None) -> Finding:
    """The group hook carries the stack hook's share into ``host_size``: it is needed exactly when that one is."""
    stack = budget_verdict()
    if group is None:
        group = unhooked(getattr(_assembler(), "build_kv_only_group", None))
    if stack.verdict is not Verdict.NEEDS_FIX:
        return Finding(KV_ONLY_GROUP, stack.verdict, f"follows build_kv_only_stack: {stack.detail}")
    import inspect

    if group is None or "host_size" not in inspect.signature(group).parameters:
        return Finding(KV_ONLY_GROUP, Verdict.UNRECOGNISED, "build_kv_only_group takes no host_size")
    return Finding(KV_ONLY_GROUP, Verdict.NEEDS_FIX, "build_kv_only_stack passes it no host_size; the budget goes in there")


def guard_verdict(full_draft_pools: Callable | None = None) -> Finding:
    """Does ``build_full_draft_pools`` stop a draft sidecar short of the logical slots?

    Asked by building tiny pools once with the draft sidecar's host pool
    built one page short of the capacity it asks for, and seeing whether
    the builder refuses it.
    """
    from ...core import swap

    assembler = _assembler()
    if full_draft_pools is None:
        full_draft_pools = unhooked(getattr(assembler, "build_full_draft_pools", None))
    if full_draft_pools is None or not hasattr(assembler, "_build_mha_mla_host_pool"):
        return Finding(FULL_DRAFT_POOLS, Verdict.OUT_OF_SCOPE, "hybrid_pool_assembler has no draft sidecar builder")
    import inspect

    if "server_args" in inspect.signature(full_draft_pools).parameters:
        return Finding(FULL_DRAFT_POOLS, Verdict.OUT_OF_SCOPE, "this draft sidecar builder takes server_args (0.5.18); "
                       "the hooks are written for the runtime-context builders of 0.5.19 on")
    real_build = assembler._build_mha_mla_host_pool

    def short(**kwargs):
        if kwargs.get("pool_label") == "draft":
            capacity = kwargs.get("host_token_capacity")
            if capacity:  # 0.5.23 sizes the sidecar by capacity, page-aligned
                fewer = capacity - kwargs["page_size"]
                kwargs = {**kwargs, "host_token_capacity": fewer,
                          "host_to_device_ratio": kwargs["host_to_device_ratio"] * fewer / capacity}
            else:  # before, by the ratio alone
                kwargs = {**kwargs, "host_to_device_ratio": kwargs["host_to_device_ratio"] / 2}
        return real_build(**kwargs)

    try:
        with swap.attribute(assembler, "build_full_draft_pools", full_draft_pools), \
                swap.attribute(assembler, "_build_mha_mla_host_pool", short):
            pools = _probe_pools()
    except ValueError as exc:
        if "logical" in str(exc):
            return Finding(FULL_DRAFT_POOLS, Verdict.FIXED, "build_full_draft_pools already refuses a short draft sidecar")
        return Finding(FULL_DRAFT_POOLS, Verdict.UNRECOGNISED, f"guard probe failed: ValueError: {exc}")
    except Exception as exc:
        return Finding(FULL_DRAFT_POOLS, Verdict.UNRECOGNISED, f"guard probe failed: {type(exc).__name__}: {exc}")
    if pools.draft_host is None or pools.draft_host.size >= pools.target_host.logical_size:
        return Finding(FULL_DRAFT_POOLS, Verdict.UNRECOGNISED, "the guard probe could not build a short draft sidecar")
    return Finding(FULL_DRAFT_POOLS, Verdict.NEEDS_FIX,
                   f"a draft sidecar of {pools.draft_host.size} rows for {pools.target_host.logical_size} logical slots builds without complaint")


# ------------------------------------------------------------------ hooks


def target_hicache_size(kv_pool, sidecar_draft_device_pools) -> float | None:
    """The target's share of --hicache-size with the draft sidecars paid; None when there is nothing to split."""
    from sglang.srt.runtime_context import get_memory, get_parallel

    from ...core import budget, rules

    hicache_size = get_memory().hicache_size
    if hicache_size <= 0 or not sidecar_draft_device_pools or budget.unbudgeted():
        return None

    def per_token(pool) -> float:
        size_bytes = pool.get_kv_size_bytes()
        if isinstance(size_bytes, tuple):
            size_bytes = sum(size_bytes)
        return rules.device_bytes_per_token(size_bytes, pool.size, pool.page_size)

    dcp_size = get_parallel().attn_dcp_size
    target_bytes = per_token(kv_pool)
    draft_bytes = sum(per_token(p) for p in sidecar_draft_device_pools)
    target_size = rules.sidecar_target_hicache_size(hicache_size, target_bytes, draft_bytes, dcp_size)
    logger.info(
        "HiCache --hicache-size %.2f GB covers the draft sidecar: %.2f GB for the target host pool, %.2f GB for "
        "the draft (%d draft rows per target row, dcp_size %d); %s=1 gives the target the whole budget",
        hicache_size, target_size, hicache_size - target_size, dcp_size, dcp_size, budget.UNBUDGETED_ENV,
    )
    return target_size


def declare_env() -> None:
    """0001 adds SGLANG_HICACHE_SIZE_EXCLUDES_DRAFT to sglang's envs; so does the budget hook, when it goes in."""
    from ...core import budget

    budget.declare_env()


EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN")


def _speculative_algorithm() -> str | None:
    from sglang.srt.runtime_context import get_context, get_spec

    # Pools built outside a launch (probes, unit tests) have no published spec config: no algorithm.
    if not get_context().is_config_namespace_published("spec"):
        return None
    algorithm = get_spec().speculative_algorithm
    return str(getattr(algorithm, "name", algorithm) or "").upper() or None


def _draft_backends() -> tuple[str, ...]:
    """The attention backends the draft runs on, as sglang's cache configurator reads them: its explicit
    --speculative-draft-attention-backend, else the target's, which it inherits."""
    from sglang.srt.runtime_context import attention_backends, get_spec

    explicit = get_spec().speculative_draft_attention_backend
    return (explicit,) if explicit is not None else tuple(sorted(b for b in attention_backends() if b is not None))


def striped_sidecar(pool) -> str | None:
    """Why this EAGLE-family draft pool is striped over the DCP ranks, which its own host pool (untranslated) does
    not fit; None where it is replicated (row = loc on every rank)."""
    span = getattr(pool, "_write_loc_dcp_span", None)
    if span is not None:  # an MLA pool: its writes follow the DCP owner rule unless it is built replicated
        return f"an MLA draft, one row per {span} locs" if span != 1 else None
    from ... import passes

    unproven = sorted(set(_draft_backends()) - set(passes.REPLICATING_BACKENDS))
    if unproven:
        return f"a dense draft on {', '.join(unproven)}, not replicated on flashinfer or fa3"
    return None


def check_draft_pools(params) -> None:
    """Under DCP, stop a draft whose host pool would restore other rows than its forward reads (0009's rule, as
    0020 narrows it).

    Hardening: the HiCache gate's hook (:mod:`.hicache_hook`) refuses these
    launches at argument time from the launch's facts; this reads the pools
    sglang built, so a later change to the plan or the pool cannot bring a
    wrong pair back silently.
    - PACKED layers move with the target's DCP indices, which fit only a
      draft striped like the target (one stored row per dcp_size locs).
    - A SIDECAR has no DCP translation: it fits a replicated draft (DSPARK's,
      a dense EAGLE draft on flashinfer or fa3), not a striped one (an MLA
      draft, a dense draft on triton).
    0009's refusals of the sharded backup have no counterpart: stock 0.5.23
    has no sharded backup.
    """
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    if not parallel.dcp_enabled:
        return
    dcp_size = parallel.attn_dcp_size
    for pool in tuple(getattr(params, "mtp_draft_device_pools", ()) or ()):
        span = getattr(pool, "_write_loc_dcp_span", 1)
        if span != dcp_size:
            raise NotImplementedError(
                f"HiCache with --dcp-size {dcp_size} cannot pack this draft ({type(pool).__name__}, one row per "
                f"{span} locs) into the target's host pool: packed layers move with the target's DCP indices, "
                "which fit only a draft striped like the target."
            )
    if _speculative_algorithm() not in EAGLE_FAMILY:
        return
    for pool in tuple(getattr(params, "sidecar_draft_device_pools", ()) or ()):
        why = striped_sidecar(pool)
        if why is not None:
            raise NotImplementedError(
                f"HiCache with --dcp-size {dcp_size} cannot back this EAGLE draft up in a host pool of its own (the "
                f"SIDECAR plan): its device KV is striped over the DCP ranks ({why}), and the sidecar has no DCP "
                "index translation. Use --speculative-algorithm NEXTN (packed with the target), or a dense draft "
                "on --speculative-draft-attention-backend flashinfer."
            )


def count_sidecar_in_budget(original: Callable, *args, **kwargs):
    """AROUND hook for ``build_kv_only_stack`` (keyword-only): each draft's plan checked, then the target's share for the group hook.

    The plan check sits where 0009 puts it, at the top of the stack, so the
    series' own tests of it hold with the plugin. It rides on the budget's
    entry: both need 0.5.23's ``sidecar_draft_device_pools``.
    """
    first_call()
    params = kwargs.get("params")
    check_draft_pools(params)
    size = target_hicache_size(kwargs.get("kv_pool"), tuple(getattr(params, "sidecar_draft_device_pools", ()) or ()))
    if size is None:
        return original(*args, **kwargs)
    token = _target_host_size.set(size)
    try:
        return original(*args, **kwargs)
    finally:
        _target_host_size.reset(token)


def size_target_from_share(original: Callable, *args, **kwargs):
    """AROUND hook for ``build_kv_only_group``: the share the stack hook worked out, as 0001's ``host_size``."""
    size = _target_host_size.get()
    if size is not None and kwargs.get("host_size") is None:
        _target_host_size.set(None)  # the target's own group only, once
        kwargs = {**kwargs, "host_size": size}
    return original(*args, **kwargs)


def check_sidecar(group, draft_host_pool) -> None:
    """Stop startup unless the draft sidecar has a row for every logical slot of the target host pool."""
    target = group.anchor_entry.host_pool
    if rules.covers(draft_host_pool.size, group.logical_size):
        return
    raise DraftSidecarTooSmall(
        f"HiCache draft host pool has {draft_host_pool.size} rows but the target host pool addresses "
        f"{group.logical_size} logical slots ({target.size} rows x dcp_size {target.dcp_size}); it needs one row "
        "per logical slot, else L1 eviction writes past the draft buffer; fix: launch without "
        "--enable-hierarchical-cache, or remove whatever sizes the draft sidecar from physical rows (see sglang's "
        "'Applied N hook(s) to ...build_full_draft_pools' log line)"
    )


def guard_sidecar(original: Callable, *args, **kwargs):
    """AROUND hook for ``build_full_draft_pools``: sglang's own build, then the guard and one pinned-memory line."""
    first_call()
    specs, entries = original(*args, **kwargs)
    tree_cache = kwargs.get("tree_cache")
    group = getattr(getattr(tree_cache, "cache_controller", None), "mem_pool_host", None)
    if entries and group is not None and hasattr(group, "anchor_entry"):
        draft = entries[0].host_pool
        check_sidecar(group, draft)
        target = group.anchor_entry.host_pool
        target_bytes, draft_bytes = target.size * target.size_per_token, draft.size * draft.size_per_token
        logger.info(
            "HiCache host pools per rank: %.2f GB, of which the draft sidecar %.2f GB (%d rows = %d target rows x "
            "dcp_size %d)", (target_bytes + draft_bytes) / 1e9, draft_bytes / 1e9, draft.size, target.size,
            target.dcp_size,
        )
    return specs, entries


# The table's entries (plugin/hooks/__init__.py collects them; docs/patches.md is generated from them).
_SIDECAR_BUDGET_WHY = ("0.5.23's plain KV stack gives the target host pool all of --hicache-size and pins the draft "
                       "sidecar, at dcp_size rows per target row, on top of it")
HOOKS = (
    Hook(
        module=MODULE, target=KV_ONLY_STACK, judge=budget_verdict, hook=count_sidecar_in_budget,
        stage=POOLS_STAGE,
        does="gives the target t / (t + dcp_size * d) of --hicache-size, so target and draft sidecar fit it, after "
             "checking each draft's plan against its DCP layout",
        why=_SIDECAR_BUDGET_WHY + "; and a draft plan that packs or shares the target's layout reads other rows",
        upstream="not yet sent (patches/upstream-next 0001, 0009; docs/upstreaming.md)",
        drop_when="upstream splits --hicache-size with the dcp factor and checks draft plans against their DCP layout",
        series_patch="upstream-next/0001, 0009",
        on_install=declare_env,
    ),
    Hook(
        module=MODULE, target=KV_ONLY_GROUP, judge=group_verdict, hook=size_target_from_share,
        stage=POOLS_STAGE,
        does="builds the target host pool at that share (the host_size argument upstream-next 0001 passes)",
        why=_SIDECAR_BUDGET_WHY,
        upstream="not yet sent (patches/upstream-next 0001)",
        drop_when="as the build_kv_only_stack entry",
        series_patch="upstream-next/0001",
    ),
    Hook(
        module=MODULE, target=FULL_DRAFT_POOLS, judge=guard_verdict, hook=guard_sidecar,
        stage=POOLS_STAGE,
        does="stops startup if the draft sidecar misses logical slots, and logs what HiCache pins per rank",
        why="a draft sidecar short of the target's logical slots is written past its end on L1 eviction, and "
            "nothing stops it at startup",
        upstream="not yet sent (patches/upstream-next 0003)",
        drop_when="upstream checks the sidecar's capacity at startup",
        series_patch="upstream-next/0003",
    ),
)
