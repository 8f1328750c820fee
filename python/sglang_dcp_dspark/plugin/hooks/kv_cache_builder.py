"""Hooks on ``sglang.srt.mem_cache.kv_cache_builder``: the draft host pool spans the target's logical slots.

Series patch 0002 sizes the draft from ``logical_size``; patch 0003 stops
startup when it comes out short. Here the same two changes ride on sglang's
own ``maybe_register_hicache_draft``: an AROUND hook that hands it a view in
which the target's ``size`` is its ``logical_size``, then checks the result
with :mod:`guard`; and, where the probe cannot judge the registration on a
release before the upstream fix, a check-only hook that runs sglang's own
registration and then the guard.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from .common import Finding, Overlay, Verdict, first_call, probing
from .entry import FIXED_UPSTREAM_IN, POOLS_STAGE, Hook, by_version

MODULE = "sglang.srt.mem_cache.kv_cache_builder"
DRAFT_REGISTRATION = f"{MODULE}.maybe_register_hicache_draft"


def registration_verdict(register_draft: Callable | None = None) -> Finding:
    """Does this registration size the draft host pool from physical rows?

    Asked of the real function on real, tiny MLA pools at dcp 2 (CPU, unpinned).
    """
    from ...core import probes

    if register_draft is None:
        from sglang.srt.mem_cache import kv_cache_builder

        register_draft = getattr(kv_cache_builder, "maybe_register_hicache_draft", None)
    if register_draft is None:
        return by_version(DRAFT_REGISTRATION, "kv_cache_builder has no maybe_register_hicache_draft")
    probe = probes.Geometry(dcp_size=2, device_rows=64, page_size=16, target_layers=1, draft_layers=1)
    try:
        with probing():
            pair = probes.build_pools(probe, register=register_draft)
    except Exception as exc:
        return by_version(DRAFT_REGISTRATION, f"registration probe failed: {type(exc).__name__}: {exc}")
    if pair.draft_host_pool is None:
        return by_version(DRAFT_REGISTRATION, "registration probe registered no draft host pool")
    target, draft = pair.target_host_pool, pair.draft_host_pool
    if draft.size >= target.logical_size:
        return Finding(DRAFT_REGISTRATION, Verdict.FIXED, "the draft host pool already spans logical_size")
    if draft.size >= target.size:
        return Finding(
            DRAFT_REGISTRATION,
            Verdict.NEEDS_FIX,
            f"the draft host pool is sized from physical rows ({draft.size} rows for {target.logical_size} logical slots at dcp 2)",
        )
    return by_version(DRAFT_REGISTRATION, f"unexpected draft rows {draft.size} for target {target.size}/{target.logical_size}")


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
    from ...core import budget
    from .. import guard

    first_call()
    tree_cache = kwargs.get("tree_cache")
    controller = getattr(tree_cache, "cache_controller", None)
    if controller is None or getattr(controller, "mem_pool_host", None) is None:
        return original(*args, **kwargs)
    result = original(*args, **{**kwargs, "tree_cache": logical_rows_view(tree_cache)})
    # Still short after the logical view: whatever ran under this hook did not
    # size from primary.size (another plugin's REPLACE, a hand edit).
    guard.check_cache_controller(controller, remedy=guard.Remedy.SHADOWED)
    budget.log_pinned(controller)
    return result


def fixed_registration(stock: Callable) -> Callable:
    """``stock`` with the plugin's sizing hook around it, as HookRegistry would install it.

    The one place that builds it, for preflight, the bench and the tests that
    measure the fix on a registration they hold (the hook is looked up when
    this is called, so a test that replaces it is what runs).
    """
    return functools.partial(size_draft_from_logical, stock)


def check_draft_registration(original: Callable, *args, **kwargs):
    """Check-only AROUND hook: sglang's own registration, unchanged, then the guard.

    Installed where the probe could not judge a registration on a release that
    needs the fix. The launcher may have admitted DSPARK already, so this
    scheduler either finds a draft host pool that spans the logical slots or
    stops at startup with the guard's one-line error.
    """
    from .. import guard

    first_call()
    result = original(*args, **kwargs)
    for candidate in (*args, *kwargs.values()):
        controller = getattr(candidate, "cache_controller", None)
        if controller is not None and getattr(controller, "mem_pool_host", None) is not None:
            guard.check_cache_controller(controller, remedy=guard.Remedy.SERIES_MISSING)
    return result


def check_only_if_needed() -> Callable | None:
    """The check-only hook where sglang's registration may size from physical rows: releases before the fix."""
    from ...core.compat import installed_sglang_version, version_at_least

    try:
        fixed_upstream = version_at_least(installed_sglang_version(), FIXED_UPSTREAM_IN)
    except Exception:  # runs inside sglang's import; an unknown version is guarded
        fixed_upstream = False
    return None if fixed_upstream else check_draft_registration


# The table's entry (plugin/hooks/__init__.py collects it; docs/patches.md is generated from it).
HOOKS = (
    Hook(
        module=MODULE, target=DRAFT_REGISTRATION, judge=registration_verdict, hook=size_draft_from_logical,
        stage=POOLS_STAGE,
        does="sizes the draft host pool from the target's logical_size, then stops startup if it is short",
        why="the draft host pool is sized from the target host pool's physical rows per rank, but the replicated "
            "DSPARK draft is indexed with the target's logical slots (dcp_size times more): L1 eviction writes past "
            "its end",
        upstream="PR #35221, released in 0.5.18 (the sizing); the startup check is this project's",
        drop_when="on sglang 0.5.18 and later, where the judge finds the registration sized from logical slots",
        series_patch="sglang-0.5.17/0002, 0003",
        check_only_if=check_only_if_needed,
    ),
)
